"""The pfs service's error catalogue: its domain's refusals, every code its answers carry,
and the one table (`PROBLEMS`) that shows the first as the second.

The domain (files, uploads) raises the `DomainError`s below and those of the
path grammar (`BadPath`, `PathForbidden`, `PathNotFound`, common/volume.py); the storage
fails with OSErrors, which `refusal_for` words; the handlers
never decide a refusal's code. The tus protocol's header kinds (`TUS_VERSION`, `BAD_HEADER`,
...) and the downloads' are raised by the handlers, which parse the request. Codes are
stable: clients and tests match on them.
"""

from __future__ import annotations

import errno

from paddlecloud.common import trees
from paddlecloud.common.errors import (
    BAD_REQUEST,
    COMMON_PROBLEMS,
    CONFLICT,
    QUOTA_EXCEEDED,
    STORAGE_FULL,
    DomainError,
    ErrorKind,
    Exists,
    Invalid,
    NotFound,
    ProblemTable,
    problem_for_domain,
)
from paddlecloud.common.volume import (
    BAD_PATH,
    PATH_FORBIDDEN,
    PATH_NOT_FOUND,
    PATH_PROBLEMS,
    BadPath,
    PathForbidden,
    PathNotFound,
    PfsPath,
)

__all__ = [
    "BAD_HEADER",
    "BAD_METADATA",
    "BAD_PATH",
    "CHECKSUM_ALGORITHM",
    "CHECKSUM_MISMATCH",
    "MISMATCHED_OFFSET",
    "PACKAGE_MISMATCH",
    "PATH_FORBIDDEN",
    "PATH_NOT_FOUND",
    "PROBLEMS",
    "RANGE_NOT_SATISFIABLE",
    "READ_TIMEOUT",
    "STORAGE_FULL",
    "TREE_TOO_DEEP",
    "TUS_VERSION",
    "UPLOAD_EXPIRED",
    "UPLOAD_FAILED",
    "UPLOAD_INTERRUPTED",
    "UPLOAD_LOCKED",
    "UPLOAD_NOT_FOUND",
    "UPLOAD_TOO_LARGE",
]

# Downloads.
RANGE_NOT_SATISFIABLE = ErrorKind("ERR_RANGE_NOT_SATISFIABLE", 416, "Range not satisfiable")

# Listings: a recursive `ls` of a tree holding paths longer than PFS can name.
TREE_TOO_DEEP = ErrorKind("ERR_TREE_TOO_DEEP", 422, "Tree too deep to list")

# Uploads (tus 1.0, docs/pfs.md).
TUS_VERSION = ErrorKind("ERR_TUS_VERSION", 412, "Unsupported tus version")
BAD_HEADER = ErrorKind("ERR_BAD_UPLOAD_HEADER", 400, "Bad tus header")
BAD_METADATA = ErrorKind("ERR_BAD_METADATA", 400, "Bad Upload-Metadata")
CHECKSUM_ALGORITHM = ErrorKind("ERR_CHECKSUM_ALGORITHM", 400, "Unsupported checksum algorithm")
CHECKSUM_MISMATCH = ErrorKind("ERR_CHECKSUM_MISMATCH", 460, "Checksum mismatch")
MISMATCHED_OFFSET = ErrorKind("ERR_MISMATCHED_OFFSET", 409, "Upload-Offset does not match")
UPLOAD_NOT_FOUND = ErrorKind("ERR_UPLOAD_NOT_FOUND", 404, "No such upload")
UPLOAD_EXPIRED = ErrorKind("ERR_UPLOAD_EXPIRED", 410, "Upload expired")
UPLOAD_FAILED = ErrorKind("ERR_UPLOAD_FAILED", 410, "Upload failed")
UPLOAD_TOO_LARGE = ErrorKind("ERR_UPLOAD_TOO_LARGE", 413, "Upload too large")
UPLOAD_LOCKED = ErrorKind("ERR_UPLOAD_LOCKED", 423, "Upload busy")
UPLOAD_INTERRUPTED = ErrorKind("ERR_UPLOAD_INTERRUPTED", 400, "Upload interrupted")
READ_TIMEOUT = ErrorKind("ERR_READ_TIMEOUT", 408, "Upload body stalled")
# A job package uploaded under a name its bytes do not have (docs/jobs.md, "Package identity").
PACKAGE_MISMATCH = ErrorKind("ERR_PACKAGE_MISMATCH", 422, "Package does not match its name")


# The domain's refusals ---------------------------------------------------------------


class Conflict(DomainError):
    """The request clashes with what is there: a directory in the way, a tree that changed."""


class BadRequest(Invalid):
    """Asked for what can never be done, such as moving a directory into itself (400)."""


class StorageFull(DomainError):
    """The filesystem, or a home's CephFS quota, has no room; nothing was changed."""


class QuotaExceeded(DomainError):
    """An upload would take a home over its owner's storage quota; the details say by how much."""


class TreeTooDeep(Invalid):
    """A recursive listing met paths longer than PFS can name."""


class UploadNotFound(NotFound):
    """No upload of the caller's has that id."""


class UploadExpired(DomainError):
    """The upload was abandoned too long and its data is gone."""


class UploadFailed(DomainError):
    """The upload failed for good (its `reason` is the code it failed with)."""


class UploadLocked(DomainError):
    """Another request holds the upload and did not let go in time."""


class UploadInterrupted(DomainError):
    """The body stopped early (a broken connection, a newer request); what arrived was kept."""


class BodyStalled(DomainError):
    """The body sent nothing for the read timeout; what arrived was kept."""


class UploadTooLarge(Invalid):
    """The body goes past the upload's end."""


class OverMaxSize(UploadTooLarge):
    """The upload's length is over the server's Tus-Max-Size, which the answer names."""


class BadLength(Invalid):
    """An Upload-Length that contradicts the upload: a change, or less than was received."""


class BadMetadata(Invalid):
    """Upload-Metadata lacks the destination, or a value of it is not what it must be."""


class MismatchedOffset(DomainError):
    """A PATCH that does not start where the upload is (`offset`)."""


class ChecksumMismatch(DomainError):
    """A chunk's or the whole file's checksum does not match what the client declared."""


class PackageMismatch(DomainError):
    """An archive uploaded as a job package whose bytes do not have the package's name."""


PROBLEMS: ProblemTable = {
    **COMMON_PROBLEMS,
    **PATH_PROBLEMS,
    Conflict: CONFLICT,
    BadRequest: BAD_REQUEST,
    StorageFull: STORAGE_FULL,
    QuotaExceeded: QUOTA_EXCEEDED,
    TreeTooDeep: TREE_TOO_DEEP,
    UploadNotFound: UPLOAD_NOT_FOUND,
    UploadExpired: UPLOAD_EXPIRED,
    UploadFailed: UPLOAD_FAILED,
    UploadLocked: UPLOAD_LOCKED,
    UploadInterrupted: UPLOAD_INTERRUPTED,
    BodyStalled: READ_TIMEOUT,
    UploadTooLarge: UPLOAD_TOO_LARGE,
    BadLength: BAD_HEADER,
    BadMetadata: BAD_METADATA,
    MismatchedOffset: MISMATCHED_OFFSET,
    ChecksumMismatch: CHECKSUM_MISMATCH,
    PackageMismatch: PACKAGE_MISMATCH,
}


def code_of(refusal: DomainError) -> str:
    """The stable code a refusal is answered with (a failed upload's record keeps it)."""
    return problem_for_domain(refusal, PROBLEMS).kind.code


def refusal_for(exc: OSError, path: PfsPath | str) -> DomainError:
    """A filesystem error on `path` as the domain refuses the request.

    Errors that are not the client's to see (EIO, EBADF: a fault here or in the storage)
    are raised again, to be logged and answered with a bare 500.
    """
    if isinstance(exc, trees.TreeChanged):
        return Conflict(f"{path}: a directory was moved while this call walked the tree; try again")
    if isinstance(exc, PermissionError) and exc.errno in (errno.EXDEV, errno.ELOOP):
        return PathForbidden(f"{path}: the path leads outside its area (through a symlink)")
    if exc.errno == errno.ELOOP:
        # A symlink met where none is followed (O_NOFOLLOW; HDFS's unresolved links).
        return PathForbidden(f"{path}: a symlink is on the path, which PFS does not follow")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return PathNotFound(f"{path}: no such file or directory")
    if exc.errno == errno.EEXIST:
        return Exists(f"{path}: already exists")
    if exc.errno == errno.EISDIR:
        return Conflict(f"{path}: is a directory")
    if exc.errno == errno.ENOTEMPTY:
        return Conflict(f"{path}: the directory is not empty (remove it recursively)")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"{path}: the filesystem is full; nothing was written")
    if exc.errno == errno.ENAMETOOLONG:
        return BadPath(f"{path}: name too long")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PathForbidden(f"{path}: the filesystem refused access")
    raise exc
