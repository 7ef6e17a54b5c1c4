#!/bin/sh
# The real TensorBoard and VisualDL that jobs' viewers run (docs/metrics.md §4), each in a
# virtual environment of its own under ~/.cache/paddlecloud, never in the platform's
# (tensorboard brings grpcio and protobuf, visualdl flask, pandas and matplotlib). Made
# once: an environment that imports its package is kept. Prints the two interpreters, the
# values of jobs.viewers.tensorboard and jobs.viewers.visualdl.
set -eu
TENSORBOARD_VERSION=2.21.0
VISUALDL_VERSION=2.5.3
CACHE="${PADDLECLOUD_CACHE:-$HOME/.cache/paddlecloud}"
PYTHON="${PYTHON:-python3.11}"
mkdir -p "$CACHE"

make_env() {  # name version module
    dir="$CACHE/viewer-$1-$2"
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import $3" 2>/dev/null; then
        echo "$dir/bin/python"
        return
    fi
    rm -rf "$dir.tmp"
    "$PYTHON" -m venv "$dir.tmp"
    "$dir.tmp/bin/pip" install --quiet --disable-pip-version-check "$1==$2" >&2
    # A venv finds its prefix from pyvenv.cfg beside it, so the finished one is moved into
    # place whole: an interrupted install never leaves a half environment under the name.
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
    echo "$dir/bin/python"
}

make_env tensorboard "$TENSORBOARD_VERSION" tensorboard
make_env visualdl "$VISUALDL_VERSION" visualdl
