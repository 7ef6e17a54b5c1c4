"""PaddleCloud's client side: the `paddlecloud` command, the SDK, and helpers for training code."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .answers import DryRun, Entry, Event, Job, LogEntry, Quota, Worker
    from .client import AsyncClient, Client
    from .errors import ApiError, ConnectionProblem, PaddleCloudError
    from .paddlejob import JobWaitTimeout, LogStreamLost, PaddleJob
    from .transfer import TransferFailed, TransferReport

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "ConnectionProblem",
    "DryRun",
    "Entry",
    "Event",
    "Job",
    "JobWaitTimeout",
    "LogEntry",
    "LogStreamLost",
    "PaddleCloudError",
    "PaddleJob",
    "Quota",
    "TransferFailed",
    "TransferReport",
    "Worker",
    "__version__",
]

# Imported on first use: training code imports `paddlecloud` for its runtime helpers inside
# every worker, and should not pay for aiohttp there.
_LAZY = {
    "AsyncClient": ".client",
    "Client": ".client",
    "ApiError": ".errors",
    "ConnectionProblem": ".errors",
    "DryRun": ".answers",
    "Entry": ".answers",
    "Event": ".answers",
    "Job": ".answers",
    "LogEntry": ".answers",
    "Quota": ".answers",
    "Worker": ".answers",
    "PaddleCloudError": ".errors",
    "PaddleJob": ".paddlejob",
    "JobWaitTimeout": ".paddlejob",
    "LogStreamLost": ".paddlejob",
    "TransferFailed": ".transfer",
    "TransferReport": ".transfer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
