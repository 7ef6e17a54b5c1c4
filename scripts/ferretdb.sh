#!/usr/bin/env bash
# Builds FerretDB, the second MongoDB wire server the Mongo store's tests run on (docs/storage.md).
#
#   scripts/ferretdb.sh build      build (or reuse) the binary; prints its path
#   scripts/ferretdb.sh binary     print the path the binary is (to be) at
#   scripts/ferretdb.sh version    print the pinned version
#
# FerretDB's cmd/ferretdb is built from its own Go module at ONE pinned version
# (FERRETDB_VERSION below, the only place it is written), with FerretDB as the main module
# (its own go.mod and go.sum, so exactly the dependencies its release has). Not `go install
# ...@version`: FerretDB embeds build/version/version.txt, which its release build generates
# (`git describe`) and the module on the proxy leaves empty, and it panics at start on an
# empty one. So the module is copied out of the module cache, the file written with the
# version, and built there; the same happens with FerretDB required from another module
# (its check looks at the binary's main package's module). v1 is the last major version
# with the SQLite backend (v2 needs PostgreSQL with DocumentDB). Everything (the source
# copy, binary, GOPATH, GOCACHE, GOMODCACHE) lives under ~/.cache/paddlecloud/ferretdb-<version>,
# outside the repository, and is reused when present.
set -euo pipefail

FERRETDB_VERSION=v1.24.2
CACHE_ROOT="${PADDLECLOUD_FERRETDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/paddlecloud}"
CACHE="$CACHE_ROOT/ferretdb-$FERRETDB_VERSION"
BINARY="$CACHE/bin/ferretdb"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

build() {
    if [ -x "$BINARY" ]; then
        echo "$BINARY"
        return 0
    fi
    [ -x "$GO" ] || { echo "ferretdb: Go is not installed (need go 1.24+)" >&2; exit 1; }
    mkdir -p "$CACHE/bin"
    # Two test runs starting at once (two worktrees) build once: the second waits, then
    # finds the binary.
    exec 9>"$CACHE/.build.lock"
    flock 9
    if [ -x "$BINARY" ]; then
        echo "$BINARY"
        return 0
    fi
    # CGO off: FerretDB's SQLite is modernc.org/sqlite, pure Go. GOTOOLCHAIN=local: build
    # with the Go that is installed rather than download the one its go.mod names.
    export GOPATH="$CACHE/gopath" GOMODCACHE="$CACHE/gopath/pkg/mod" GOCACHE="$CACHE/gocache"
    export GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOTOOLCHAIN=local
    local started=$SECONDS src="$CACHE/src" dir
    echo "ferretdb: building FerretDB $FERRETDB_VERSION into $BINARY (cold: minutes)" >&2
    dir="$(nice -n 19 "$GO" mod download -json "github.com/FerretDB/FerretDB@$FERRETDB_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [ -d "$dir" ] || { echo "ferretdb: go mod download gave no module folder" >&2; exit 1; }
    rm -rf "$src"
    cp -R "$dir" "$src"
    chmod -R u+w "$src"  # the module cache is read-only
    echo "$FERRETDB_VERSION" >"$src/build/version/version.txt"
    (cd "$src" && nice -n 19 "$GO" build -o "$BINARY.tmp" ./cmd/ferretdb >&2)
    mv "$BINARY.tmp" "$BINARY"
    echo "ferretdb: built in $((SECONDS - started)) s" >&2
    echo "$BINARY"
}

case "${1:-}" in
build) build ;;
binary) echo "$BINARY" ;;
version) echo "$FERRETDB_VERSION" ;;
*)
    sed -n '2,6s/^# \{0,1\}//p' "$0" >&2
    exit 2
    ;;
esac
