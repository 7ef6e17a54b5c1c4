"""The JSON log lines: the reused encoder writes what structlog's own renderer writes."""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from paddlecloud.common import logging as paddle_logging


class _Odd:
    """Not JSON: the renderer's fallback says what it is."""

    def __repr__(self) -> str:
        return "<odd>"


@pytest.fixture
def configured() -> Iterator[None]:
    """configure_logging changes the process's logging: put it back for the other tests."""
    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    paddle_logging.configure_logging("json", service="gateway")
    yield
    structlog.configure(**saved)
    root.handlers[:], root.level = handlers, level


def _render(renderer: structlog.processors.JSONRenderer, event: dict[str, object]) -> str:
    return str(renderer(None, "info", dict(event)))


@pytest.mark.usefixtures("configured")
def test_json_lines_are_what_structlogs_renderer_writes() -> None:
    ours = structlog.get_config()["processors"][-1]
    assert isinstance(ours, structlog.processors.JSONRenderer)
    events = [
        {"event": "request_finished", "status": 200, "duration_ms": 1.25, "path": "/api/v1/jobs/é"},
        {"event": "odd", "value": _Odd(), "at": datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC)},
        {"event": "nested", "items": [1, None, {"k": float("inf")}], "flag": True},
    ]
    for event in events:
        assert _render(ours, event) == _render(structlog.processors.JSONRenderer(), event)
    # The fallback is structlog's (repr for what JSON cannot say), through the reused encoder.
    assert json.loads(_render(ours, events[1]))["value"] == "<odd>"


def test_one_encoder_per_fallback() -> None:
    assert paddle_logging._encoder(repr) is paddle_logging._encoder(repr)
    assert paddle_logging._encoder(repr) is not paddle_logging._encoder(str)
