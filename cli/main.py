"""The `paddlecloud` command (also `paddlectl`): parse, run one command, turn failures into exit codes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from typing import TextIO

from . import __version__
from .commands import CommandTree, add_commands, register_all
from .config import CONFIG_ENV, ConfigMissing, check_endpoint
from .context import Context, UsageError
from .errors import ApiError, ConnectionProblem, CredentialsMissing, PaddleCloudError, one_line
from .flags import ArgumentParser, add_flag, as_program
from .output import FORMATS

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_AUTH = 4
EXIT_INTERRUPTED = 130

# The contract scripts rely on; printed in `--help`.
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_FAILURE: "the server refused the request (4xx/5xx other than 401), or another failure",
    EXIT_USAGE: "usage error: the command line is wrong",
    EXIT_UNREACHABLE: "cannot reach the server (connection refused, DNS, TLS, timeout)",
    EXIT_AUTH: "not logged in: no config file, no or wrong credentials, token refused (401)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}

PROGRAM_NAMES = ("paddlecloud", "paddlectl")


def exit_codes_help() -> str:
    return "exit status:\n" + "".join(f"  {code:<4} {meaning}\n" for code, meaning in EXIT_CODES.items())


EPILOG = f"""\
examples:
  paddlecloud config add dc1 --endpoint http://127.0.0.1:8080 --username alice --password-stdin
  paddlecloud login
  paddlecloud whoami
  paddlecloud -o json get users
  paddlecloud users quota bob -cpu 4 -memory 8Gi

Flags work Go style, as the original PaddleCloud docs write them (-jobname x -cpu 1), and
GNU style (--jobname x, --job-name x). Global options go before or after the command.

The client config is ${CONFIG_ENV}, else ~/.paddle/config; tokens are cached in
~/.paddle/tokens.json. Run `paddlecloud help COMMAND` (or `paddlecloud COMMAND --help`) for
each command's own flags and examples; `paddlecloud commands` lists every command and
`paddlecloud flags` the flags above.

{exit_codes_help()}"""


def _endpoint(value: str) -> str:
    try:
        return check_endpoint(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options every command takes; `defaults=False` for the copy each subcommand gets, so
    that `paddlecloud -o json users list` is not undone by the subcommand's own default."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    group = parser.add_argument_group("global options")
    add_flag(
        group,
        "datacenter",
        default=default(None),
        metavar="NAME",
        help="use this datacenter of the config instead of current-datacenter",
    )
    add_flag(
        group,
        "output",
        short="-o",
        choices=FORMATS,
        default=default("table"),
        metavar="FORMAT",
        help="table (for people, the default), json or yaml (for scripts: the server's data as is), "
        "csv (metrics)",
    )
    add_flag(group, "debug", action="store_true", default=default(False), help="log HTTP calls, tracebacks")
    add_flag(
        group,
        "config",
        default=default(None),
        metavar="PATH",
        help=f"client config file (default: ${CONFIG_ENV}, else ~/.paddle/config)",
    )
    add_flag(
        group,
        "endpoint",
        type=_endpoint,
        default=default(None),
        metavar="URL",
        help="talk to this gateway instead of the datacenter's endpoint",
    )


def build_parser(prog: str = "paddlecloud") -> ArgumentParser:
    """The whole command line: global options, then every command group's subcommands."""
    parser = ArgumentParser(
        prog=prog,
        description="Run distributed training jobs on a PaddleCloud cluster, or whole on one machine.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_global_options(parser, defaults=True)
    per_command = ArgumentParser(add_help=False)
    add_global_options(per_command, defaults=False)
    register_all(CommandTree(add_commands(parser), [per_command], parser))
    return parser


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, ApiError):
        return EXIT_AUTH if exc.status == 401 else EXIT_FAILURE
    if isinstance(exc, ConnectionProblem):
        return EXIT_UNREACHABLE
    if isinstance(exc, ConfigMissing | CredentialsMissing):
        return EXIT_AUTH
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    return EXIT_FAILURE


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
    on_chunk: Callable[[int], None] | None = None,
    prog: str | None = None,
) -> int:
    """Run one command and return its exit status; `sys.exit(main())` is the console script.

    Everything the command touches outside itself is injectable: arguments, environment (which
    also locates the config through HOME and PADDLE_CONFIG), the three streams and the name the
    program was run as (`prog`: help and messages say `paddlectl ...` when run as paddlectl).
    `on_chunk` goes to the client's transfers (see `paddlecloud.transfer`).
    """
    if argv is None:
        argv = sys.argv[1:]
        invoked = os.path.basename(sys.argv[0]) if sys.argv else ""
        if prog is None and invoked in PROGRAM_NAMES:
            prog = invoked
    prog = prog or PROGRAM_NAMES[0]
    env = os.environ if env is None else env
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    stdin = stdin or sys.stdin

    parser = build_parser(prog)
    if not argv:
        # A bare `paddlectl` shows what it can do, as the original did.
        stdout.write(parser.format_help())
        return EXIT_OK
    try:
        # argparse prints help and usage errors to sys.stdout / sys.stderr itself.
        with redirect_stdout(stdout), redirect_stderr(stderr):
            args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE

    ctx = Context(
        prog=prog, env=env, stdout=stdout, stderr=stderr, stdin=stdin, options=args, on_chunk=on_chunk
    )
    try:
        if getattr(args, "output", None) == "csv" and not getattr(args, "csv", False):
            raise UsageError("-o csv is only for `paddlecloud metrics`; use -o table, json or yaml here")
        outcome = args.handler(ctx, args)
        if isinstance(outcome, int):
            return outcome
        # Here, not at the top: `--help`, usage errors and `version` need no event loop (start-up time).
        import asyncio

        with asyncio.Runner() as runner:
            return runner.run(_run(outcome, ctx))
    except KeyboardInterrupt:
        stderr.write(f"{prog}: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as exc:
        return report(ctx, exc)


async def _run(command: Awaitable[int], ctx: Context) -> int:
    try:
        return await command
    finally:
        await ctx.aclose()


def report(ctx: Context, exc: BaseException) -> int:
    """One line on stderr for a failure (a traceback first with --debug); returns the exit status."""
    if ctx.debug:
        import traceback  # here: only --debug prints one, and every command would import it

        traceback.print_exception(exc, file=ctx.stderr)
    if isinstance(exc, PaddleCloudError):
        message = one_line(str(exc))
    else:
        # A bug of ours, not the user's: say so, and where to look.
        message = f"internal error: {type(exc).__name__}: {one_line(str(exc))}"
        if not ctx.debug:
            message += " (run with --debug for the traceback)"
    # Messages suggest commands as `paddlecloud ...`; say them as the program was run.
    ctx.stderr.write(f"{ctx.prog}: error: {as_program(message, ctx.prog)}\n")
    ctx.stderr.flush()
    return exit_code_for(exc)


if __name__ == "__main__":
    sys.exit(main())
