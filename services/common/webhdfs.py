"""An asynchronous WebHDFS client on aiohttp: HDFS's REST API, no JNI, no Hadoop install.

Only what PaddleCloud's HDFS volume needs, each call one REST operation of
https://hadoop.apache.org/docs/stable/hadoop-project-dist/hadoop-hdfs/WebHDFS.html:
GETFILESTATUS, LISTSTATUS(_BATCH), MKDIRS, CREATE, APPEND, OPEN (offset, length), RENAME
(rename2 semantics, never "move into"), DELETE, GETCONTENTSUMMARY, SETQUOTA, SETPERMISSION,
SETOWNER, TRUNCATE, SETXATTR/GETXATTRS.

Identity: simple authentication, every request carries `user.name=<platform user>`; a
request made for a user adds `doas=<user>` (the NameNode must let the platform user
impersonate: hadoop.proxyuser.<user>.hosts/groups), so HDFS's own permissions judge it.

Paths: a `HdfsPath` is built from name parts that are each checked here (no `..`, `.`,
empty part, `/` or NUL) and percent-encoded one by one, so no string a user sent can
reach the NameNode as more than one path component.

Bodies stream both ways: CREATE and APPEND follow the NameNode's 307 to a DataNode by hand
(aiohttp would resend a body it has already consumed) and send an async iterator; OPEN
yields the DataNode's chunks. A RemoteException becomes an OSError with the errno a POSIX
file system gives for the same refusal (`errno_for`), its message kept.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

# RemoteException's `exception` (the Java class's simple name) → the errno POSIX gives.
_ERRNOS: Mapping[str, int] = {
    "FileNotFoundException": errno.ENOENT,
    "AccessControlException": errno.EACCES,
    "SecurityException": errno.EACCES,
    "AuthorizationException": errno.EACCES,
    "FileAlreadyExistsException": errno.EEXIST,
    "ParentNotDirectoryException": errno.ENOTDIR,
    "PathIsNotEmptyDirectoryException": errno.ENOTEMPTY,
    "PathIsNotDirectoryException": errno.ENOTDIR,
    "NSQuotaExceededException": errno.EDQUOT,
    "DSQuotaExceededException": errno.EDQUOT,
    "QuotaExceededException": errno.EDQUOT,
    "SafeModeException": errno.EAGAIN,
    "StandbyException": errno.EAGAIN,
    "RetriableException": errno.EAGAIN,
    "RecoveryInProgressException": errno.EAGAIN,
    "AlreadyBeingCreatedException": errno.EAGAIN,
    # A path through (or ending at) a symlink: the NameNode leaves resolving it to its
    # client, and this client never does.
    "UnresolvedLinkException": errno.ELOOP,
    "UnresolvedPathException": errno.ELOOP,
}

# What SETQUOTA takes to leave one quota as it is, or to clear it (HdfsConstants).
QUOTA_DONT_SET = 2**63 - 1
QUOTA_RESET = -1

_CHUNK = 256 * 1024


def errno_for(exception: str) -> int:
    """The POSIX errno for a RemoteException's class name; EIO for one without an analogue."""
    return _ERRNOS.get(exception, errno.EIO)


def remote_error(code: int, exception: str, message: str, path: str) -> OSError:
    """A refusal the NameNode or a DataNode sent (RemoteException), as the OSError subclass
    POSIX code catches (FileNotFoundError, PermissionError, ...); EIO keeps the Java class."""
    return OSError(code, f"{exception}: {message}" if code == errno.EIO else message, path)


def check_part(part: str) -> str:
    """`part` if it can be one HDFS path component; OSError(EINVAL) for anything that is not
    (HDFS itself refuses `:` in a name)."""
    if not isinstance(part, str) or part in ("", ".", "..") or "/" in part or "\0" in part or ":" in part:
        raise OSError(errno.EINVAL, "not a valid HDFS path component", repr(part))
    return part


@dataclass(frozen=True)
class HdfsPath:
    """An absolute HDFS path made of checked components (the root is no components)."""

    parts: tuple[str, ...] = ()

    @classmethod
    def of(cls, *parts: str) -> HdfsPath:
        return cls(tuple(check_part(p) for p in parts))

    @classmethod
    def parse(cls, text: str) -> HdfsPath:
        """An operator's absolute path (`pfs.hdfs.root_path`), each component checked."""
        if not text.startswith("/"):
            raise ValueError(f"an HDFS path must be absolute: {text!r}")
        return cls.of(*(p for p in text.split("/") if p))

    def child(self, *parts: str) -> HdfsPath:
        return HdfsPath((*self.parts, *(check_part(p) for p in parts)))

    def parent(self) -> HdfsPath:
        return HdfsPath(self.parts[:-1])

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else ""

    @property
    def text(self) -> str:
        return "/" + "/".join(self.parts)

    def url_path(self) -> str:
        return "/webhdfs/v1/" + "/".join(quote(p, safe="") for p in self.parts)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class FileStatus:
    """GETFILESTATUS's answer, typed."""

    type: str  # FILE, DIRECTORY or SYMLINK
    length: int
    modification_ms: int
    permission: int
    owner: str
    group: str
    file_id: int
    name: str  # pathSuffix: the entry's name in a listing, "" for GETFILESTATUS
    symlink: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FileStatus:
        return cls(
            type=d["type"],
            length=int(d.get("length", 0)),
            modification_ms=int(d.get("modificationTime", 0)),
            permission=int(d.get("permission", "0"), 8),
            owner=d.get("owner", ""),
            group=d.get("group", ""),
            file_id=int(d.get("fileId", 0)),
            name=d.get("pathSuffix", ""),
            symlink=d.get("symlink"),
        )


@dataclass(frozen=True)
class ContentSummary:
    length: int
    file_count: int
    directory_count: int
    space_consumed: int
    space_quota: int
    quota: int


class WebHdfs:
    """One NameNode's WebHDFS, as one platform user; `close()` when done."""

    def __init__(self, namenode: str, user: str, *, timeout: float = 60.0) -> None:
        self.base = namenode.rstrip("/")
        self.user = user
        self.timeout = timeout
        self._client: aiohttp.ClientSession | None = None

    @property
    def _session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop (aiohttp needs one), so a volume can be
        # built from the config before the service's loop starts.
        if self._client is None:
            # sock_read bounds a silent DataNode; no total: a multi-GB body takes its time.
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_read=self.timeout),
                auto_decompress=False,
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _url(self, path: HdfsPath) -> URL:
        # Encoded already, component by component: yarl must not encode it again.
        return URL(self.base + path.url_path(), encoded=True)

    def _params(self, op: str, doas: str | None, extra: Mapping[str, object]) -> dict[str, str]:
        params = {"op": op, "user.name": self.user}
        if doas is not None and doas != self.user:
            params["doas"] = check_part(doas)
        for key, value in extra.items():
            params[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return params

    @staticmethod
    async def _raise_for(response: aiohttp.ClientResponse, path: HdfsPath) -> None:
        # 307: the NameNode sending CREATE, APPEND or OPEN on to a DataNode.
        if response.status < 300 or response.status == 307:
            return
        body = await response.read()
        try:
            remote = json.loads(body)["RemoteException"]
            exception, message = str(remote.get("exception", "")), str(remote.get("message", ""))
            # A DataNode's message carries the NameNode's Java stack after its first line.
            message = message.split("\n", 1)[0]
        except (ValueError, KeyError, TypeError):
            exception, message = f"HTTP {response.status}", body[:300].decode(errors="replace")
        if not exception and response.status == 404:
            exception = "FileNotFoundException"
        raise remote_error(errno_for(exception), exception, message, path.text)

    async def _json(
        self, method: str, path: HdfsPath, op: str, *, doas: str | None = None, **extra: object
    ) -> Any:
        async with self._session.request(
            method, self._url(path), params=self._params(op, doas, extra), allow_redirects=False
        ) as response:
            await self._raise_for(response, path)
            body = await response.read()
            return json.loads(body) if body else None

    # Reads
    async def status(self, path: HdfsPath, *, doas: str | None = None) -> FileStatus:
        data = await self._json("GET", path, "GETFILESTATUS", doas=doas)
        return FileStatus.from_json(data["FileStatus"])

    async def list(self, path: HdfsPath, *, doas: str | None = None) -> list[FileStatus]:
        """Every entry of a directory (a file's own status for a file), in batches so that a
        directory of a million entries never comes in one response."""
        out: list[FileStatus] = []
        start = ""
        while True:
            batch, more = await self.list_batch(path, start, doas=doas)
            out.extend(batch)
            if not more:
                return out
            start = batch[-1].name

    async def list_batch(
        self, path: HdfsPath, start_after: str, *, doas: str | None = None
    ) -> tuple[builtins.list[FileStatus], bool]:
        """One LISTSTATUS_BATCH page of a directory: the entries whose names sort after
        `start_after` (byte order; "" from the start), as many as the NameNode's
        `dfs.ls.limit`, and whether more remain."""
        # Lower case: Hadoop 3.5's WebHDFS ignores `startAfter` as its docs spell it, and
        # older NameNodes take parameter names in any case.
        extra = {"startafter": start_after} if start_after else {}
        data = await self._json("GET", path, "LISTSTATUS_BATCH", doas=doas, **extra)
        listing = data["DirectoryListing"]
        batch = [FileStatus.from_json(d) for d in listing["partialListing"]["FileStatuses"]["FileStatus"]]
        if start_after and batch and batch[0].name.encode() <= start_after.encode():
            # A NameNode that ignored the page's start would be listed for ever.
            raise OSError(errno.EIO, "LISTSTATUS_BATCH did not move past the page's start", path.text)
        return batch, bool(listing.get("remainingEntries")) and bool(batch)

    async def content_summary(self, path: HdfsPath, *, doas: str | None = None) -> ContentSummary:
        d = (await self._json("GET", path, "GETCONTENTSUMMARY", doas=doas))["ContentSummary"]
        return ContentSummary(
            length=int(d["length"]),
            file_count=int(d["fileCount"]),
            directory_count=int(d["directoryCount"]),
            space_consumed=int(d.get("spaceConsumed", 0)),
            space_quota=int(d.get("spaceQuota", -1)),
            quota=int(d.get("quota", -1)),
        )

    async def open(
        self, path: HdfsPath, offset: int, length: int, *, doas: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The file's bytes from `offset`, `length` of them at most, as the DataNode sends them."""
        params = self._params("OPEN", doas, {"offset": offset, "length": length})
        async with self._session.get(self._url(path), params=params, allow_redirects=False) as redirect:
            await self._raise_for(redirect, path)
            location = redirect.headers.get("Location")
        if location is None:
            raise remote_error(
                errno.EIO, "NoRedirect", "OPEN answered without a DataNode's Location", path.text
            )
        async with self._session.get(URL(location, encoded=True)) as response:
            await self._raise_for(response, path)
            async for chunk in response.content.iter_chunked(_CHUNK):
                yield chunk

    async def xattr(self, path: HdfsPath, name: str, *, doas: str | None = None) -> str | None:
        """A text xattr's value; None where the file has none of that name."""
        try:
            data = await self._json(
                "GET", path, "GETXATTRS", doas=doas, **{"xattr.name": name, "encoding": "text"}
            )
        except OSError as exc:
            # HDFS says an absent xattr with a plain IOException.
            if exc.errno == errno.EIO and "not found" in str(exc).lower():
                return None
            raise
        for item in data.get("XAttrs", []):
            if item.get("name") == name and item.get("value") is not None:
                value = str(item["value"])
                return value[1:-1] if value.startswith('"') and value.endswith('"') else value
        return None

    # Writes
    async def mkdirs(self, path: HdfsPath, *, permission: int | None = None, doas: str | None = None) -> None:
        extra = {"permission": f"{permission:o}"} if permission is not None else {}
        await self._json("PUT", path, "MKDIRS", doas=doas, **extra)

    async def _send(
        self,
        method: str,
        path: HdfsPath,
        op: str,
        body: AsyncIterator[bytes] | bytes,
        doas: str | None,
        extra: Mapping[str, object],
    ) -> None:
        # The NameNode answers 307 with the DataNode to send the bytes to; the body goes there.
        params = self._params(op, doas, extra)
        async with self._session.request(
            method, self._url(path), params=params, allow_redirects=False
        ) as redirect:
            await self._raise_for(redirect, path)
            location = redirect.headers.get("Location")
        if location is None:
            raise remote_error(
                errno.EIO, "NoRedirect", f"{op} answered without a DataNode's Location", path.text
            )
        headers = {"Content-Type": "application/octet-stream"}
        async with self._session.request(
            method, URL(location, encoded=True), data=body, headers=headers
        ) as response:
            await self._raise_for(response, path)

    async def create(
        self,
        path: HdfsPath,
        body: AsyncIterator[bytes] | bytes = b"",
        *,
        overwrite: bool = False,
        permission: int = 0o644,
        doas: str | None = None,
    ) -> None:
        """Write a new file (FileExistsError unless `overwrite`); its parents are made."""
        await self._send(
            "PUT", path, "CREATE", body, doas, {"overwrite": overwrite, "permission": f"{permission:o}"}
        )

    async def append(
        self, path: HdfsPath, body: AsyncIterator[bytes] | bytes, *, doas: str | None = None
    ) -> None:
        await self._send("POST", path, "APPEND", body, doas, {})

    async def truncate(self, path: HdfsPath, length: int, *, doas: str | None = None) -> bool:
        """Cut the file to `length`; False while HDFS recovers its last block (then no
        APPEND succeeds until the file is closed again)."""
        return bool((await self._json("POST", path, "TRUNCATE", doas=doas, newlength=length))["boolean"])

    async def rename(
        self, src: HdfsPath, dst: HdfsPath, *, overwrite: bool = False, doas: str | None = None
    ) -> None:
        """rename2: `src` becomes `dst` exactly, never moved into a directory at `dst`;
        FileExistsError when `dst` exists, unless `overwrite` (a file, or an empty directory)."""
        option = "OVERWRITE" if overwrite else "NONE"
        await self._json("PUT", src, "RENAME", doas=doas, destination=dst.text, renameoptions=option)

    async def delete(self, path: HdfsPath, *, recursive: bool, doas: str | None = None) -> bool:
        """Whether something was deleted; OSError(ENOTEMPTY) for a directory with content
        without `recursive`."""
        return bool((await self._json("DELETE", path, "DELETE", doas=doas, recursive=recursive))["boolean"])

    async def set_quota(
        self, path: HdfsPath, *, namespace: int = QUOTA_DONT_SET, space: int = QUOTA_DONT_SET
    ) -> None:
        """SETQUOTA (Hadoop 3.4+); needs an HDFS superuser."""
        await self._json("PUT", path, "SETQUOTA", namespacequota=namespace, storagespacequota=space)

    async def set_permission(self, path: HdfsPath, mode: int, *, doas: str | None = None) -> None:
        await self._json("PUT", path, "SETPERMISSION", doas=doas, permission=f"{mode:o}")

    async def set_owner(self, path: HdfsPath, owner: str, group: str | None = None) -> None:
        extra = {"owner": check_part(owner)}
        if group is not None:
            extra["group"] = check_part(group)
        await self._json("PUT", path, "SETOWNER", **extra)

    async def set_xattr(self, path: HdfsPath, name: str, value: str, *, doas: str | None = None) -> None:
        """Set a text xattr, whether or not it was set before."""
        await self._json(
            "PUT",
            path,
            "SETXATTR",
            doas=doas,
            **{"xattr.name": name, "xattr.value": value, "flag": "CREATE,REPLACE"},
        )


async def chunks_of(data: Iterable[bytes]) -> AsyncIterator[bytes]:
    """An async body from byte strings (tests, small records)."""
    for piece in data:
        yield piece
        await asyncio.sleep(0)
