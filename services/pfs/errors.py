"""The pfs service's error catalogue: every code its answers carry, in one place.

The path grammar's kinds (`ERR_BAD_PATH`, `ERR_PATH_FORBIDDEN`, `ERR_PATH_NOT_FOUND`) and
`ERR_STORAGE_FULL` are shared with the other services (common); the tus protocol's and
the downloads' are pfs's own. Codes are stable: clients and tests match on them.
"""

from __future__ import annotations

from paddlecloud.common.errors import COMMON_PROBLEMS, STORAGE_FULL, ErrorKind, ProblemTable
from paddlecloud.common.volume import BAD_PATH, PATH_FORBIDDEN, PATH_NOT_FOUND

__all__ = [
    "BAD_HEADER",
    "BAD_METADATA",
    "BAD_PATH",
    "CHECKSUM_ALGORITHM",
    "CHECKSUM_MISMATCH",
    "MISMATCHED_OFFSET",
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

# The domain errors of the shared grammar (common.errors) are shown as everywhere else.
PROBLEMS: ProblemTable = dict(COMMON_PROBLEMS)
