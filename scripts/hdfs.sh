#!/usr/bin/env bash
# A real HDFS for the tests: Hadoop's own MiniDFSCluster (hadoop-client-minicluster, one
# NameNode and one DataNode, WebHDFS on) in one JVM.
#
#   scripts/hdfs.sh build                          fetch and compile (or reuse); prints the directory
#   scripts/hdfs.sh run <base dir> <ready file> <platform user>
#                                                  start it (build first); stops on SIGTERM or stdin EOF
#   scripts/hdfs.sh version                        print the pinned Hadoop version
#
# The artifact and what it needs come through Maven (scripts/hdfs/pom.xml, `mvn
# dependency:copy-dependencies`) at ONE pinned version (HADOOP_VERSION below, the only place
# it is written; 3.4+ for WebHDFS SETQUOTA, 3.5.0 because 3.4.x's shaded minicluster answers
# every WebHDFS call with 404), and the launcher scripts/hdfs/MiniHdfs.java is compiled with
# javac (JDK 17). Jars, classes and Maven's own repository live under
# ~/.cache/paddlecloud/hdfs-<version> and ~/.cache/paddlecloud/maven-repo, outside the
# repository, and are reused when present.
set -euo pipefail

HADOOP_VERSION=3.5.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${PADDLECLOUD_HDFS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/paddlecloud}"
CACHE="$CACHE_ROOT/hdfs-$HADOOP_VERSION"
STAMP="$CACHE/.built-$(cat "$HERE/hdfs/pom.xml" "$HERE/hdfs/MiniHdfs.java" | sha256sum | cut -c1-16)"

build() {
    if [ -f "$STAMP" ]; then
        echo "$CACHE"
        return 0
    fi
    command -v mvn >/dev/null || { echo "hdfs: Maven (mvn) is not installed (apt-get install maven)" >&2; exit 1; }
    command -v javac >/dev/null || { echo "hdfs: a JDK 17 (javac) is not installed" >&2; exit 1; }
    mkdir -p "$CACHE"
    # Two runs starting at once (two worktrees) build once: the second waits, then finds it.
    exec 9>"$CACHE/.build.lock"
    flock 9
    if [ -f "$STAMP" ]; then
        echo "$CACHE"
        return 0
    fi
    local started=$SECONDS
    echo "hdfs: fetching hadoop-client-minicluster $HADOOP_VERSION into $CACHE" >&2
    rm -rf "$CACHE/lib" "$CACHE/classes" "$CACHE"/.built-*
    mvn -q -B -f "$HERE/hdfs/pom.xml" -Dhadoop.version="$HADOOP_VERSION" \
        -Dmaven.repo.local="$CACHE_ROOT/maven-repo" \
        dependency:copy-dependencies -DoutputDirectory="$CACHE/lib" >&2
    mkdir -p "$CACHE/classes"
    javac -nowarn -d "$CACHE/classes" -cp "$CACHE/lib/*" "$HERE/hdfs/MiniHdfs.java" >&2
    touch "$STAMP"
    echo "hdfs: ready in $((SECONDS - started)) s" >&2
    echo "$CACHE"
}

case "${1:-}" in
    build) build ;;
    run)
        [ $# -eq 4 ] || { echo "usage: $0 run <base dir> <ready file> <platform user>" >&2; exit 2; }
        dir="$(build)"
        exec java -Xmx512m -cp "$dir/lib/*:$dir/classes" MiniHdfs "$2" "$3" "$4"
        ;;
    version) echo "$HADOOP_VERSION" ;;
    *) echo "usage: $0 build|run|version" >&2; exit 2 ;;
esac
