"""The builder service's error catalogue: its domain's refusals and the problems they are shown as.

The domain (service.py, spec.py, the backends) raises these; `PROBLEMS` is the one table
the service's middleware renders them by. Codes are stable: clients match on them.
"""

from __future__ import annotations

from paddlecloud.common.errors import COMMON_PROBLEMS, DomainError, ErrorKind, Invalid, NotFound, ProblemTable


class BuildNotFound(NotFound):
    """No build of the caller's has that id."""


class RequestRefused(Invalid):
    """The build request cannot be built as asked (requirements, base or package)."""


class BackendFailed(DomainError):
    """What the backend needs (a registry, the cluster) did not answer as it must; the
    message says which and why. Asking again later may succeed."""


BACKEND_UNAVAILABLE = ErrorKind("ERR_BUILD_BACKEND_UNAVAILABLE", 503, "Build backend unavailable")

PROBLEMS: ProblemTable = {**COMMON_PROBLEMS, BackendFailed: BACKEND_UNAVAILABLE}
