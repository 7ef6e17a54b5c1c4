#!/bin/sh
# The peers bench/peers measures PaddleCloud against (docs/performance.md, "Peers"), each
# outside the repository under ~/.cache/paddlecloud and pinned: Ray Jobs (ray[default], its
# job submission server and SDK) in a virtual environment of its own, never the platform's
# (it brings grpcio, protobuf, pydantic, aiohttp of its own choosing), and tusd, the
# reference tus server, built from its Go module with `go install`. Made once: a venv whose
# install finished and a built tusd binary are kept. Prints two lines, `ray <python>` and
# `tusd <binary>`.
set -eu
RAY_VERSION=2.60.0
TUSD_VERSION=v2.9.1
CACHE="${PADDLECLOUD_CACHE:-$HOME/.cache/paddlecloud}"
PYTHON="${PYTHON:-python3.11}"
mkdir -p "$CACHE"

ray_env="$CACHE/peer-ray-$RAY_VERSION"
# Scripts in a venv name the path it was made at in their shebangs (`ray` among them), so it
# is made in place, and a marker written last says it is whole: an interrupted install is redone.
if ! [ -f "$ray_env/.installed" ]; then
    rm -rf "$ray_env"
    "$PYTHON" -m venv "$ray_env"
    "$ray_env/bin/pip" install --quiet --disable-pip-version-check "ray[default]==$RAY_VERSION" >&2
    "$ray_env/bin/python" -c "import ray.dashboard, ray.job_submission"
    touch "$ray_env/.installed"
fi
echo "ray $ray_env/bin/python"

tusd_dir="$CACHE/peer-tusd-$TUSD_VERSION"
if ! [ -x "$tusd_dir/bin/tusd" ]; then
    # Its own GOPATH, module and build caches, as scripts/crane.sh: nothing lands in the
    # user's Go setup; the binary appears under bin/ only once built.
    export GOPATH="$tusd_dir/gopath" GOMODCACHE="$tusd_dir/gopath/pkg/mod" GOCACHE="$tusd_dir/gocache"
    GOBIN="$tusd_dir/bin.tmp" GOFLAGS=-modcacherw nice go install "github.com/tus/tusd/v2/cmd/tusd@$TUSD_VERSION" >&2
    rm -rf "$tusd_dir/bin"
    mv "$tusd_dir/bin.tmp" "$tusd_dir/bin"
fi
echo "tusd $tusd_dir/bin/tusd"
