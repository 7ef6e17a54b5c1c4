"""The jobs service's error catalogue: its domain's refusals and the problems they are shown as.

The domain (manager, backends) raises these; `PROBLEMS` is the one table the service's
middleware renders them by. Codes are stable: clients and tests match on them.
"""

from __future__ import annotations

from paddlecloud.common.errors import (
    COMMON_PROBLEMS,
    CONFLICT,
    QUOTA_EXCEEDED,
    UPSTREAM_UNAVAILABLE,
    DomainError,
    ErrorKind,
    Forbidden,
    Invalid,
    NotFound,
    ProblemTable,
)

PACKAGE_NOT_FOUND = ErrorKind("ERR_PACKAGE_NOT_FOUND", 422, "Job package not found")
BUILD_REFUSED = ErrorKind("ERR_BUILD_REFUSED", 422, "The job's environment cannot be built")
UNKNOWN_USER = ErrorKind("ERR_UNKNOWN_USER", 403, "No such user")
VIEWER_NOT_OFFERED = ErrorKind("ERR_VIEWER_NOT_OFFERED", 501, "This viewer is not offered here")
VIEWER_FAILED = ErrorKind("ERR_VIEWER_FAILED", 502, "The job's viewer could not serve")
VIEWER_NOT_READY = ErrorKind("ERR_VIEWER_NOT_READY", 504, "The job's viewer did not become ready in time")


class JobNotFound(NotFound):
    """No job of the caller's has that name."""


class PackageNotFound(Invalid):
    """The spec's package is not on PFS."""


class QuotaExceeded(DomainError):
    """The job does not fit the user's quota; `quota` lists what was asked, used and allowed."""


class BuildRefused(Invalid):
    """The builder refused the package's requirements.txt (named as the `package` field)."""


class BuildUnavailable(DomainError):
    """The builder, which a job with a requirements.txt needs at its submit, cannot answer now."""


class UnknownUser(Forbidden):
    """The identity the gateway vouched for has no account (it was deleted meanwhile)."""


class SubmitBusy(DomainError):
    """Another submit of the same user holds the quota check (on this or another replica)."""


class PfsUnavailable(DomainError):
    """pfs, which counts the storage a quota check needs, cannot answer now."""


class ViewerNotOffered(DomainError):
    """The operator did not configure this viewer (`jobs.viewers.<kind>` unset), or the
    backend cannot run one."""


class ViewerFailed(DomainError):
    """A job's viewer did not start, or ended; the message says what it said last."""


class ViewerNotReady(DomainError):
    """A job's viewer pod (Kubernetes) was not Ready within `jobs.viewers.start_timeout_seconds`;
    the message says what held it back (an image pull, the scheduler)."""


PROBLEMS: ProblemTable = {
    PfsUnavailable: UPSTREAM_UNAVAILABLE,
    BuildUnavailable: UPSTREAM_UNAVAILABLE,
    SubmitBusy: CONFLICT,
    **COMMON_PROBLEMS,
    PackageNotFound: PACKAGE_NOT_FOUND,
    QuotaExceeded: QUOTA_EXCEEDED,
    BuildRefused: BUILD_REFUSED,
    UnknownUser: UNKNOWN_USER,
    ViewerNotOffered: VIEWER_NOT_OFFERED,
    ViewerFailed: VIEWER_FAILED,
    ViewerNotReady: VIEWER_NOT_READY,
}
