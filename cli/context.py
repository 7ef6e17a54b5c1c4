"""What a command handler gets: its streams, environment, global options, config and a client."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .config import (
    ClientConfig,
    ConfigMissing,
    Datacenter,
    TokenCache,
    config_path,
    load_config,
    loose_permissions,
    token_cache_path,
)
from .errors import PaddleCloudError
from .flags import as_program
from .output import render_data

if TYPE_CHECKING:
    # aiohttp alone costs more start-up than a command may: imported when a command asks for a client.
    from .client import AsyncClient


class UsageError(PaddleCloudError):
    """The command line parsed but makes no sense (an empty password on stdin, say): exit 2."""


class Context:
    """One run of the command: injected streams and environment, so tests can replace them.

    Config, datacenter and client are made on first use, so that `version` or `--help` work
    without a config file, and a command that needs none never reads one.
    """

    def __init__(
        self,
        *,
        prog: str,
        env: Mapping[str, str],
        stdout: TextIO,
        stderr: TextIO,
        stdin: TextIO,
        options: argparse.Namespace,
        on_chunk: Callable[[int], None] | None = None,
    ) -> None:
        self.prog = prog
        self.env = env
        self.stdout = stdout
        self.stderr = stderr
        self.stdin = stdin
        self.output: str = options.output
        self.debug: bool = options.debug
        self.datacenter_name: str | None = options.datacenter
        self.config_override: str | None = options.config
        self.endpoint_override: str | None = options.endpoint
        self._config: ClientConfig | None = None
        self._client: AsyncClient | None = None
        self._on_chunk = on_chunk

    # --- output ---------------------------------------------------------------------------

    def out(self, text: str) -> None:
        """Write to stdout; a line break is added unless `text` ends with one."""
        self.stdout.write(text if text.endswith("\n") else text + "\n")
        self.stdout.flush()

    def warn(self, message: str) -> None:
        self.stderr.write(f"{self.prog}: warning: {as_program(message, self.prog)}\n")
        self.stderr.flush()

    def log(self, message: str) -> None:
        """A line for `--debug` only."""
        if self.debug:
            self.stderr.write(f"{self.prog}: debug: {message}\n")
            self.stderr.flush()

    def emit(self, data: Any, table: Callable[[], str]) -> None:
        """`data` as JSON or YAML when asked with `-o`, else the human text `table()` makes."""
        if self.output == "table":
            self.out(table())
        else:
            self.out(render_data(data, self.output))

    # --- config and client --------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return config_path(self.env, self.config_override)

    def config(self) -> ClientConfig:
        if self._config is None:
            config = load_config(self.config_path)
            mode = loose_permissions(config.path)
            if mode is not None:
                self.warn(f"{config.path} holds passwords yet others may read it ({mode:04o}); chmod 600 it")
            self._config = config
        return self._config

    def datacenter(self) -> Datacenter:
        """The selected datacenter, with `--endpoint` applied."""
        datacenter = self.config().select(self.datacenter_name)
        if self.endpoint_override:
            datacenter = dataclasses.replace(datacenter, endpoint=self.endpoint_override)
        return datacenter

    def token_cache(self) -> TokenCache:
        return TokenCache(token_cache_path(self.env))

    def client(self, *, anonymous_ok: bool = False) -> AsyncClient:
        """The client for the selected datacenter, logging in with its credentials as needed.

        With `anonymous_ok`, a missing config is no obstacle when `--endpoint` says where to go:
        the client then carries no credentials (for calls such as `version`).
        """
        if self._client is None:
            from .client import AsyncClient

            try:
                datacenter = self.datacenter()
            except ConfigMissing:
                if not (anonymous_ok and self.endpoint_override):
                    raise
                self._client = AsyncClient(self.endpoint_override, log=self.log, on_chunk=self._on_chunk)
            else:
                slot = self.token_cache().slot(datacenter.name, datacenter.username, datacenter.endpoint)
                self._client = AsyncClient(
                    datacenter.endpoint,
                    datacenter.username,
                    datacenter.password or None,  # none after `logout`: `login` first
                    token_cache=slot,
                    log=self.log,
                    on_chunk=self._on_chunk,
                )
        return self._client

    def endpoint(self) -> str:
        """The URL `client(anonymous_ok=True)` talks to, as it spells it, without making the client
        (`version` needs none)."""
        try:
            return self.datacenter().endpoint.rstrip("/")
        except ConfigMissing:
            if not self.endpoint_override:
                raise
            return self.endpoint_override.rstrip("/")

    def where(self) -> str:
        """`datacenter1 (http://...)` for messages, or just the endpoint when there is no config."""
        endpoint = self.endpoint()
        try:
            return f"{self.datacenter().name} ({endpoint})"
        except ConfigMissing:
            return endpoint

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


# A command: parsed arguments in, exit status out; a coroutine, run on an event loop made for it,
# or the status at once from a command that needs no loop and no client (`version`'s quick path:
# asyncio alone is a good part of a command's start-up).
Handler = Callable[[Context, argparse.Namespace], Awaitable[int] | int]
