"""structlog set-up: JSON lines when not on a terminal, readable console output on one."""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable
from typing import Literal

import structlog


def configure_logging(
    fmt: Literal["auto", "json", "console"] = "auto",
    level: str = "info",
    *,
    service: str | None = None,
) -> None:
    """Configure structlog and the standard library's logging once for this process."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if service is not None:
        shared.insert(0, _bind_service(service))
    renderer: structlog.types.Processor
    if use_json:
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
        shared.append(structlog.processors.dict_tracebacks)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    numeric = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *_: SafeLogger(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries that log through the standard library (aiohttp, pymongo) go to the same stream.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(processors=[*shared_for_stdlib(shared), renderer])
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))


class SafeLogger(structlog.PrintLogger):
    """A print logger that cannot fail its caller: a line that cannot be written (the log's
    disk is full, its pipe is gone) is counted and dropped, never raised into a request
    or a background loop. The count is said with the next line that gets through."""

    dropped = 0

    def msg(self, message: str) -> None:
        try:
            if SafeLogger.dropped:
                lost, SafeLogger.dropped = SafeLogger.dropped, 0
                super().msg(f'{{"event": "log_lines_dropped", "count": {lost}}}')
            super().msg(message)
        except (OSError, ValueError):  # ValueError: the stream was closed
            SafeLogger.dropped += 1

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def shared_for_stdlib(
    shared: list[structlog.types.Processor],
) -> list[structlog.types.Processor]:
    return [structlog.stdlib.ProcessorFormatter.remove_processors_meta, *shared]


def _bind_service(service: str) -> structlog.types.Processor:
    def add_service(
        _logger: object, _name: str, event: structlog.types.EventDict
    ) -> structlog.types.EventDict:
        event.setdefault("service", service)
        return event

    return add_service


@functools.cache
def _encoder(default: Callable[[object], object]) -> json.JSONEncoder:
    return json.JSONEncoder(default=default)


def _dumps(obj: object, *, default: Callable[[object], object]) -> str:
    """`json.dumps` with one encoder kept per `default`: given a `default` (structlog always
    passes its fallback), `json.dumps` builds a new encoder for every line, which was a
    quarter of rendering the gateway's access line. The same settings, so the same text."""
    return _encoder(default).encode(obj)
