"""The client's own files: `~/.paddle/config` (datacenters and credentials) and the token cache."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .errors import PaddleCloudError

CONFIG_ENV = "PADDLE_CONFIG"
TOKENS_FILE = "tokens.json"
DATACENTER_KEYS = ("name", "username", "password", "endpoint")
TOP_KEYS = ("datacenters", "current-datacenter")
# A cached token this close to its expiry is treated as gone: logging in now is cheaper than a
# request that fails with 401 half-way through.
EXPIRY_LEEWAY = timedelta(seconds=30)
# Files a transfer moves at once unless told (`-j`, `jobs=`): the transfers' default, here so
# that the CLI's flags can show it without importing the transfers (start-up time).
DEFAULT_JOBS = 4
# Seconds a client waits to connect or for the next bytes of an answer (`AsyncClient(timeout=)`).
DEFAULT_TIMEOUT = 30.0

EXAMPLE_CONFIG = """\
datacenters:
- name: datacenter1
  username: alice
  password: secret
  endpoint: http://127.0.0.1:8080
current-datacenter: datacenter1
"""


class ConfigError(PaddleCloudError):
    """The client config is unreadable or invalid; the message names the file and the key."""


class ConfigMissing(ConfigError):
    """There is no client config file at all, so there are no credentials to use."""


@dataclass(frozen=True)
class Datacenter:
    """One entry of `datacenters:`: where a PaddleCloud gateway is and who to log in as."""

    name: str
    username: str
    # "" once `logout` removed it: the next command then needs `login` (which asks for it).
    password: str = field(repr=False)
    endpoint: str


@dataclass(frozen=True)
class ClientConfig:
    """The parsed config file; methods that change it return a new one for `save_config`."""

    path: Path
    datacenters: tuple[Datacenter, ...] = ()
    current_datacenter: str | None = None

    def names(self) -> list[str]:
        return [dc.name for dc in self.datacenters]

    def get(self, name: str) -> Datacenter | None:
        return next((dc for dc in self.datacenters if dc.name == name), None)

    def select(self, name: str | None = None) -> Datacenter:
        """The datacenter named by `--datacenter`, else `current-datacenter`, else the only one."""
        known = ", ".join(self.names()) or "none"
        if name is not None:
            found = self.get(name)
            if found is None:
                raise ConfigError(f"{self.path}: there is no datacenter {name!r} (datacenters: {known})")
            return found
        if self.current_datacenter is not None:
            found = self.get(self.current_datacenter)
            if found is None:
                raise ConfigError(
                    f"{self.path}: current-datacenter {self.current_datacenter!r} is not one of the "
                    f"datacenters ({known})"
                )
            return found
        if len(self.datacenters) == 1:
            return self.datacenters[0]
        raise ConfigError(
            f"{self.path}: current-datacenter is not set and there are {len(self.datacenters)} "
            f"datacenters ({known}); set it or pass --datacenter NAME"
        )

    def with_datacenter(self, datacenter: Datacenter, *, make_current: bool = False) -> ClientConfig:
        """This config with `datacenter` added, or replacing the one of the same name."""
        if self.get(datacenter.name) is None:
            datacenters = (*self.datacenters, datacenter)
        else:
            datacenters = tuple(datacenter if dc.name == datacenter.name else dc for dc in self.datacenters)
        current = self.current_datacenter
        if make_current or current is None:
            current = datacenter.name
        return replace(self, datacenters=datacenters, current_datacenter=current)

    def with_current(self, name: str) -> ClientConfig:
        if self.get(name) is None:
            known = ", ".join(self.names()) or "none"
            raise ConfigError(f"{self.path}: there is no datacenter {name!r} (datacenters: {known})")
        return replace(self, current_datacenter=name)

    def to_dict(self) -> dict[str, Any]:
        """The YAML layout of DESIGN §8, keys in the order the product's docs show them."""
        body: dict[str, Any] = {
            "datacenters": [
                {key: getattr(dc, key) for key in DATACENTER_KEYS if key != "password" or dc.password}
                for dc in self.datacenters
            ]
        }
        if self.current_datacenter is not None:
            body["current-datacenter"] = self.current_datacenter
        return body


def paddle_home(env: Mapping[str, str]) -> Path:
    """`<home>/.paddle`, home taken from the given environment so tests can move it."""
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".paddle"


def config_path(env: Mapping[str, str], override: str | None = None) -> Path:
    """`--config`, else `$PADDLE_CONFIG`, else `<home>/.paddle/config`."""
    chosen = override or env.get(CONFIG_ENV)
    if chosen:
        if chosen == "~" or chosen.startswith("~/"):
            return paddle_home(env).parent / chosen[2:]
        return Path(chosen)
    return paddle_home(env) / "config"


def token_cache_path(env: Mapping[str, str]) -> Path:
    return paddle_home(env) / TOKENS_FILE


def check_endpoint(url: str) -> str:
    """The endpoint without a trailing slash; ValueError saying why when it is not an http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"must be an http:// or https:// URL, got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"must not have a query or fragment, got {url!r}")
    return url.rstrip("/")


def load_config(path: Path) -> ClientConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigMissing(
            f"no client config at {path}: create it with `paddlecloud config add NAME --endpoint URL "
            f"--username USER --password-stdin`, or write the YAML that `paddlecloud config --help` "
            f"shows, or point ${CONFIG_ENV} at another file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    return parse_config(text, path)


def parse_config(text: str, path: Path) -> ClientConfig:
    import yaml  # imported here, as in save_config: `paddlecloud --help` needs no YAML (start-up time)

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    if raw is None:
        raise ConfigError(f"{path}: the file is empty; it needs a `datacenters:` list")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with `datacenters:` at the top, got {_kind(raw)}")
    # Unknown keys are refused rather than ignored: in a hand-written file they are typos
    # (`current_datacenter`) whose silent loss would surface later as a confusing error.
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r} (known keys: {', '.join(TOP_KEYS)})")
    if "datacenters" not in raw:
        raise ConfigError(f"{path}: key `datacenters` is missing")
    entries = raw["datacenters"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{path}: `datacenters` must be a non-empty list of {{{', '.join(DATACENTER_KEYS)}}}"
        )
    datacenters: list[Datacenter] = []
    for index, entry in enumerate(entries):
        datacenters.append(_parse_datacenter(entry, f"datacenters[{index}]", path))
    seen: set[str] = set()
    for dc in datacenters:
        if dc.name in seen:
            raise ConfigError(f"{path}: datacenter name {dc.name!r} appears more than once")
        seen.add(dc.name)
    current = raw.get("current-datacenter")
    if current is not None and not isinstance(current, str):
        raise ConfigError(f"{path}: `current-datacenter` must be a datacenter name, got {_kind(current)}")
    if current is not None and current not in seen:
        raise ConfigError(
            f"{path}: current-datacenter {current!r} is not one of the datacenters "
            f"({', '.join(dc.name for dc in datacenters)})"
        )
    return ClientConfig(path=path, datacenters=tuple(datacenters), current_datacenter=current)


def _parse_datacenter(entry: Any, where: str, path: Path) -> Datacenter:
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: {where} must be a mapping of {', '.join(DATACENTER_KEYS)}")
    for key in entry:
        if key not in DATACENTER_KEYS:
            raise ConfigError(f"{path}: {where}: unknown key {key!r} (known: {', '.join(DATACENTER_KEYS)})")
    values: dict[str, str] = {}
    for key in DATACENTER_KEYS:
        if key == "password" and entry.get(key) in (None, ""):
            values[key] = ""  # logged out (`paddlecloud logout`): `login` asks for it
            continue
        if key not in entry or entry[key] is None or entry[key] == "":
            raise ConfigError(f"{path}: {where}.{key} is missing")
        value = entry[key]
        if not isinstance(value, str):
            # YAML reads `password: 12345` as a number and `0123` as octal: refuse rather than guess.
            raise ConfigError(f'{path}: {where}.{key} must be a string, got {_kind(value)} (quote it: "...")')
        values[key] = value
    try:
        values["endpoint"] = check_endpoint(values["endpoint"])
    except ValueError as exc:
        raise ConfigError(f"{path}: {where}.endpoint {exc}") from None
    return Datacenter(**values)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def loose_permissions(path: Path) -> int | None:
    """The file's mode if others than its owner may read it (it holds passwords), else None."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    return mode if mode & 0o077 else None


def save_password(config: ClientConfig, datacenter: Datacenter, password: str) -> None:
    """Keep `password` for `datacenter` in the config file ("" forgets it): the one way
    login, logout and passwd change what the config holds."""
    save_config(config.with_datacenter(replace(datacenter, password=password)))


def save_config(config: ClientConfig) -> None:
    """Write the config atomically with mode 0600: it holds passwords."""
    import yaml

    text = yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=False, allow_unicode=True)
    atomic_write(config.path, text.encode("utf-8"))


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` so that readers see the old file or the new one, never half of one.

    The temporary file is created 0600 in the same directory (rename is atomic only within one
    filesystem) and fsynced before the rename, and the directory after it, so a crash leaves a
    whole file behind.
    """
    import tempfile  # here: it imports shutil and random, which reading a config never needs

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class CachedToken:
    """A token the gateway issued, when it expires, and which endpoint it is good for."""

    token: str = field(repr=False)
    expires_at: str | None = None
    endpoint: str | None = None

    def expired(self, now: datetime) -> bool:
        when = parse_time(self.expires_at)
        # A time we cannot read is left for the server to judge.
        return when is not None and when <= now + EXPIRY_LEEWAY


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class TokenCache:
    """Tokens per (datacenter, user) in one JSON file, mode 0600, replaced atomically on each change.

    Two commands running at once may each rewrite the file; the later write wins and the other's
    token is lost, which costs one extra login and nothing else, so there is no lock.
    """

    def __init__(self, path: Path, *, clock: Callable[[], datetime] = utc_now) -> None:
        self.path = path
        self._clock = clock

    def get(self, datacenter: str, username: str, endpoint: str | None = None) -> CachedToken | None:
        """The cached token, unless it expired or was issued by a different endpoint."""
        entry = self._read().get(datacenter, {}).get(username)
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            return None
        cached = CachedToken(
            entry["token"], _str_or_none(entry.get("expires_at")), _str_or_none(entry.get("endpoint"))
        )
        if cached.expired(self._clock()):
            return None
        # Never send a bearer token to a server other than the one that issued it: the
        # datacenter's endpoint may have been edited, or overridden with --endpoint.
        if endpoint is not None and cached.endpoint is not None and cached.endpoint != endpoint.rstrip("/"):
            return None
        return cached

    def put(self, datacenter: str, username: str, token: CachedToken) -> None:
        tokens = self._read()
        tokens.setdefault(datacenter, {})[username] = {
            "token": token.token,
            "expires_at": token.expires_at,
            "endpoint": token.endpoint.rstrip("/") if token.endpoint else None,
        }
        self._write(tokens)

    def discard(self, datacenter: str, username: str) -> bool:
        """Forget the token; True if there was one."""
        tokens = self._read()
        users = tokens.get(datacenter, {})
        if username not in users:
            return False
        del users[username]
        if not users:
            del tokens[datacenter]
        self._write(tokens)
        return True

    def slot(self, datacenter: str, username: str, endpoint: str) -> TokenCacheSlot:
        """The view of this cache one client needs: its own token and nothing else."""
        return TokenCacheSlot(self, datacenter, username, endpoint)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            # It is only a cache: a damaged one costs a login, not a failure.
            return {}
        tokens = raw.get("tokens") if isinstance(raw, dict) else None
        if not isinstance(tokens, dict):
            return {}
        return {dc: users for dc, users in tokens.items() if isinstance(users, dict)}

    def _write(self, tokens: dict[str, dict[str, Any]]) -> None:
        body = json.dumps({"version": 1, "tokens": tokens}, indent=2, sort_keys=True) + "\n"
        try:
            atomic_write(self.path, body.encode("utf-8"))
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot write the token cache: {exc.strerror or exc}") from None


class TokenCacheSlot:
    """One (datacenter, user, endpoint)'s entry in a `TokenCache`, as `AsyncClient` uses it."""

    def __init__(self, cache: TokenCache, datacenter: str, username: str, endpoint: str) -> None:
        self.cache = cache
        self.datacenter = datacenter
        self.username = username
        self.endpoint = endpoint.rstrip("/")

    def load(self) -> str | None:
        cached = self.cache.get(self.datacenter, self.username, self.endpoint)
        return cached.token if cached else None

    def store(self, token: str, expires_at: str | None) -> None:
        self.cache.put(self.datacenter, self.username, CachedToken(token, expires_at, self.endpoint))

    def clear(self) -> None:
        self.cache.discard(self.datacenter, self.username)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
