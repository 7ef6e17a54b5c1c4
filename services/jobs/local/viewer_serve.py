"""Serve TensorBoard's or VisualDL's own WSGI app on a UNIX socket (a sandbox) or a TCP port (a pod).

The jobs service runs this file with the viewer's interpreter (`jobs.viewers.tensorboard`
or `jobs.viewers.visualdl`: an environment of its own, which has the viewer's package and
not the platform's), as `python -I viewer_serve.py KIND LOGDIR FD PREFIX`, inside a
sandbox with no network at all. On Kubernetes the viewer's pod runs it as
`python -I viewer_serve.py --port PORT KIND LOGDIR PREFIX` (services/jobs/kube/manifests.py,
`viewer_objects`): a TCP port on the pod's own address, which only the jobs service may
reach (the viewer's NetworkPolicy). A UNIX socket in a directory that only root and the
job's user can reach means no TCP port anyone else on the machine could connect to; the
viewer's pages carry PREFIX (TensorBoard's `--path_prefix`, VisualDL's `--public-path`) so
that they work behind `/api/v1/jobs/{name}/tensorboard/`. Standard library plus the
viewer's package (and werkzeug, which both bring) only: `-I` keeps this directory off
`sys.path`, so none of the platform's modules here shadows one of the viewer's.
"""

from __future__ import annotations

import signal
import sys
from typing import Any


def tensorboard_app(logdir: str, prefix: str) -> Any:
    from tensorboard import default, program
    from tensorboard.backend import application

    board = program.TensorBoard(plugins=default.get_plugins())
    # load_fast=false: the Python reader, in this process; the Rust data server would be
    # one more process and a loopback port of its own.
    board.configure(argv=["", "--logdir", logdir, "--path_prefix", prefix, "--load_fast", "false"])
    provider, multiplexer = board._make_data_provider()
    return application.TensorBoardWSGIApp(
        board.flags, board.plugin_loaders, provider, board.assets_zip_provider, multiplexer
    )


def visualdl_app(logdir: str, prefix: str) -> Any:
    from visualdl.server import app as server
    from visualdl.server.args import ParseArgs

    # telemetry off: VisualDL would otherwise phone home; no component_tabs: some of them
    # run `pip install` when chosen.
    args = ParseArgs(logdir=[logdir], public_path=prefix, telemetry=False, host="localhost", port=0)
    app = server.create_app(args)

    def with_language(environ: dict[str, Any], start_response: Any) -> Any:
        # VisualDL 2.5.3 picks its language from Accept-Language only and fails (a 500) on
        # its pages without one (a cookie of None): a client that names none gets English.
        environ.setdefault("HTTP_ACCEPT_LANGUAGE", "en")
        return app(environ, start_response)

    return with_language


def main(argv: list[str]) -> int:
    from werkzeug.serving import make_server

    if argv[:1] == ["--port"]:
        # A pod's (Kubernetes): every address of the pod, whose NetworkPolicy admits the
        # jobs service alone.
        port, kind, logdir, prefix = argv[1:]
        app = tensorboard_app(logdir, prefix) if kind == "tensorboard" else visualdl_app(logdir, prefix)
        server = make_server("0.0.0.0", int(port), app, threaded=True)  # noqa: S104
    else:
        kind, logdir, fd, prefix = argv
        app = tensorboard_app(logdir, prefix) if kind == "tensorboard" else visualdl_app(logdir, prefix)
        # The service made the socket, listening, in a directory of its own, and handed it
        # over: nothing in the sandbox can name another socket for it to connect to, and
        # requests that came meanwhile wait in its backlog.
        server = make_server("unix://viewer", 0, app, threaded=True, fd=int(fd))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
