#!/usr/bin/env bash
# Builds crane (go-containerregistry's registry client): the kaniko builder's pusher image
# pushes the executor's tarball with it, and `make images` copies third-party images with it.
#
#   scripts/crane.sh build      build (or reuse) the binary; prints its path
#   scripts/crane.sh binary     print the path the binary is (to be) at
#   scripts/crane.sh version    print the pinned version
#
# `go install github.com/google/go-containerregistry/cmd/crane@<version>` at ONE pinned
# version (CRANE_VERSION below, the only place it is written), static (CGO off), so the same
# binary runs on the host and in a FROM-scratch-like image. Everything (binary, GOPATH,
# GOCACHE, GOMODCACHE) lives under ~/.cache/paddlecloud/crane-<version>, outside the
# repository, and is reused when present.
set -euo pipefail

CRANE_VERSION=v0.22.1
CACHE_ROOT="${PADDLECLOUD_CRANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/paddlecloud}"
CACHE="$CACHE_ROOT/crane-$CRANE_VERSION"
BINARY="$CACHE/bin/crane"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

build() {
    if [ -x "$BINARY" ]; then
        echo "$BINARY"
        return 0
    fi
    [ -x "$GO" ] || { echo "crane: Go is not installed (need go 1.24+)" >&2; exit 1; }
    mkdir -p "$CACHE/bin"
    # Two runs starting at once (two worktrees) build once: the second waits, then finds it.
    exec 9>"$CACHE/.build.lock"
    flock 9
    if [ -x "$BINARY" ]; then
        echo "$BINARY"
        return 0
    fi
    export GOPATH="$CACHE/gopath" GOMODCACHE="$CACHE/gopath/pkg/mod" GOCACHE="$CACHE/gocache"
    export GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$CACHE/bin"
    local started=$SECONDS
    echo "crane: building crane $CRANE_VERSION into $BINARY" >&2
    nice -n 19 "$GO" install "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
    [ -x "$BINARY" ] || { echo "crane: go install made no binary at $BINARY" >&2; exit 1; }
    echo "crane: built in $((SECONDS - started)) s" >&2
    echo "$BINARY"
}

case "${1:-}" in
    build) build ;;
    binary) echo "$BINARY" ;;
    version) echo "$CRANE_VERSION" ;;
    *) echo "usage: $0 build|binary|version" >&2; exit 2 ;;
esac
