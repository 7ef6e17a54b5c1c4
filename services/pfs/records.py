"""What pfs remembers of one upload: the `<id>.info` record its volume's staging keeps."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

State = Literal["active", "complete", "failed", "expired"]
RECORD_VERSION = 1


@dataclass
class Record:
    """What the service remembers of one upload; the offset is never stored, it is the file's size."""

    id: str
    owner: str  # the user who created it; nobody else may see it
    path: str  # the destination, an absolute PFS path
    length: int | None  # None while deferred (creation-defer-length)
    metadata: str  # the Upload-Metadata header as received (validated, safe to echo)
    sha256: str | None  # the whole file's expected sha256, if the client gave one
    overwrite: bool
    charged_to: str | None  # whose storage quota the upload counts against (None: public)
    inode: int  # the staging file's inode: recognises it at its destination after a crash
    created: float
    # When an unfinished upload expires, unless it was written to later (see Uploads.expiry);
    # for finished, failed and expired ones, when their record is forgotten.
    expires: float
    state: State = "active"
    result_sha256: str | None = None
    error: dict[str, str] = field(default_factory=dict)  # code and detail when failed
    version: int = RECORD_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Record:
        data: dict[str, Any] = json.loads(raw)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
