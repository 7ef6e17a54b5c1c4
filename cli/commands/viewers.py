"""`tensorboard` and `visualdl`: a job's own viewer on this machine's loopback, as `kubectl port-forward`.

The platform runs the real TensorBoard or VisualDL for the job (docs/metrics.md §4) behind
`/api/v1/jobs/NAME/tensorboard/`; these commands listen on 127.0.0.1 and forward each
request below that path to the gateway with the user's token, so a browser on this
machine needs no sign-in. Nothing else of the API is reachable through the port, and only
requests that name the port's own host (127.0.0.1 or localhost) are forwarded, so a web
page elsewhere cannot borrow the token through a DNS name it controls.
"""

from __future__ import annotations

import argparse

from ..context import Context
from ..flags import add_flag
from . import CommandTree

ORDER = 35
DEFAULT_PORTS = {"tensorboard": 6006, "visualdl": 8040}
NAMES = {"tensorboard": "TensorBoard", "visualdl": "VisualDL"}
# What a browser's request may carry on to the viewer; its cookies and the like stay here.
FORWARDED = (
    "Accept",
    "Accept-Language",
    "Content-Type",
    "If-None-Match",
    "If-Modified-Since",
    "Range",
    "X-XSRF-Protected",
    "X-Requested-With",
)
# The client decodes bodies (no Content-Encoding, no length left to keep) and the hop's own.
# The gateway's Content-Security-Policy keeps a viewer's pages inert on its own origin,
# where the user's session is; here, on a loopback origin that holds nothing but this
# forward, they are meant to run, so it stays behind.
DROPPED = {
    "content-encoding",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "server",
    "content-security-policy",
}


def _split(name: str) -> tuple[str, str | None]:
    user, slash, job = name.rpartition("/")
    return (job, user) if slash else (name, None)


async def serve(ctx: Context, args: argparse.Namespace, kind: str) -> int:
    # Here, not at the top: `paddlecloud --help` and every other command import this
    # module, and must not pay for asyncio or aiohttp (tests/e2e/test_cli_startup.py).
    import asyncio
    import webbrowser
    from urllib.parse import quote

    from aiohttp import web

    job, user = _split(args.job)
    prefix = f"/api/v1/jobs/{quote(job, safe='')}/{kind}"
    client = ctx.client()
    # Asked once before listening: an unknown job, a viewer the platform does not offer or
    # another user's job is one line and a non-zero exit, not a port that serves errors.
    async with client.open("GET", prefix + "/", params={"user": user} if user else None):
        pass
    if args.print_url:
        ctx.out(f"{client.endpoint}{prefix}/")
        return 0

    async def forward(request: web.Request) -> web.StreamResponse:
        host = (request.host or "").rsplit(":", 1)[0]
        if host not in ("127.0.0.1", "localhost"):
            raise web.HTTPForbidden(text=f"{host!r}: only http://127.0.0.1 serves this viewer\n")
        if request.path in ("/", ""):
            raise web.HTTPFound(prefix + "/")
        if request.path != prefix and not request.path.startswith(prefix + "/"):
            raise web.HTTPNotFound(text=f"only {prefix}/ is served here\n")
        headers = {k: request.headers[k] for k in FORWARDED if k in request.headers}
        body = request.content if request.body_exists else None
        async with client.forward(request.method, request.raw_path, headers=headers, data=body) as answer:
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in DROPPED}
            response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=kept)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", args.port)
        try:
            await site.start()
        except OSError as exc:
            ctx.stderr.write(f"paddlecloud {kind}: cannot listen on 127.0.0.1:{args.port}: {exc.strerror}\n")
            return 1
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}{prefix}/"
        ctx.out(f"{NAMES[kind]} of job {args.job}: {url}  (Ctrl-C to stop)")
        if args.open:
            webbrowser.open(url)
        await asyncio.Event().wait()  # until Ctrl-C
    finally:
        await runner.cleanup()
    return 0


async def tensorboard(ctx: Context, args: argparse.Namespace) -> int:
    return await serve(ctx, args, "tensorboard")


async def visualdl(ctx: Context, args: argparse.Namespace) -> int:
    return await serve(ctx, args, "visualdl")


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0 to 65535; 0: any free one)")
    return port


def register(tree: CommandTree) -> None:
    for kind, handler in (("tensorboard", tensorboard), ("visualdl", visualdl)):
        name, port = NAMES[kind], DEFAULT_PORTS[kind]
        parser = tree.command(
            kind,
            handler,
            help=f"open a job's {name} (the platform runs it on the job's output)",
            description=(
                f"Serve the job's {name} on this machine: the platform runs the real {name} on\n"
                f"the job's output directory on PFS (for you only), and this command listens on\n"
                f"127.0.0.1 and forwards to it with your login, until Ctrl-C. Open the URL it\n"
                "prints in a browser; --print-url prints the gateway's own URL instead (for a\n"
                "browser signed in to the dashboard) and exits."
            ),
            epilog=(
                "examples:\n"
                f"  paddlecloud {kind} fit-a-line\n"
                f"  paddlecloud {kind} --port 0 --open fit-a-line\n"
                f"  paddlecloud {kind} --print-url fit-a-line\n"
            ),
        )
        parser.add_argument("job", metavar="JOB", help="a job of yours")
        add_flag(
            parser,
            "port",
            type=_port,
            default=port,
            metavar="PORT",
            help=f"the local port (default {port}; 0: any free one)",
        )
        add_flag(parser, "open", action="store_true", help="open the URL in a browser")
        add_flag(parser, "print-url", action="store_true", help="print the gateway's URL and exit")
