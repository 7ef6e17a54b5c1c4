"""The builder service's error catalogue: its domain's refusals and the problems they are shown as.

The domain (service.py, spec.py, the backends) raises these; `PROBLEMS` is the one table
the service's middleware renders them by. Codes are stable: clients match on them.
"""

from __future__ import annotations

from paddlecloud.common.errors import COMMON_PROBLEMS, Invalid, NotFound, ProblemTable


class BuildNotFound(NotFound):
    """No build of the caller's has that id."""


class RequestRefused(Invalid):
    """The build request cannot be built as asked (requirements, base or package)."""


PROBLEMS: ProblemTable = dict(COMMON_PROBLEMS)
