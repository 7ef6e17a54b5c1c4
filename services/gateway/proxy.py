"""A streaming reverse proxy from the gateway to one internal service."""

from __future__ import annotations

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict, MultiMapping
from yarl import URL

from paddlecloud.common import errors, internal_auth
from paddlecloud.common.keys import IDENTITY, INTERNAL_SECRET, REQUEST_ID
from paddlecloud.common.web import REQUEST_ID_HEADER

from .keys import UPSTREAM_SESSION
from .session import CSRF_HEADER

log = structlog.get_logger()

# RFC 9110 §7.6.1: headers that describe one connection, never to be relayed.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Also dropped on the way in: the caller's credentials stay here (identity travels as
# signed headers instead; a browser's are its cookies and CSRF token), `Expect` was
# already answered by the gateway's own server, and the request id and identity headers
# are the gateway's to set.
_DROP_REQUEST = _HOP_BY_HOP | {
    h.lower()
    for h in (
        "Host",
        "Authorization",
        "Cookie",
        CSRF_HEADER,
        "Expect",
        REQUEST_ID_HEADER,
        *internal_auth.HEADERS,
    )
}
# The gateway's own server writes these.
_DROP_RESPONSE = _HOP_BY_HOP | {"server", "date"}


def _listed_in_connection(headers: MultiMapping[str]) -> set[str]:
    values = headers.getall("Connection", [])
    return {token.strip().lower() for value in values for token in value.split(",")}


# Answers up to this size are relayed whole; larger ones, or of unknown length, stream.
SMALL_BODY = 64 * 1024


class Upstream:
    """Forwards requests to one service, streaming bodies both ways."""

    def __init__(self, name: str, base_url: str, *, connect_timeout: float, read_timeout: float):
        self.name = name
        self.base_url = URL(base_url.rstrip("/"))
        # The read timeout bounds the silence between two chunks, never the whole
        # exchange: a multi-GB upload or a `logs -f` may take hours.
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=read_timeout
        )

    def _request_headers(self, request: web.Request) -> CIMultiDict[str]:
        drop = _DROP_REQUEST
        if "Connection" in request.headers:
            drop = drop | _listed_in_connection(request.headers)
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in drop)
        request_id = request[REQUEST_ID]
        headers[REQUEST_ID_HEADER] = request_id
        peer = request.remote or ""
        prior = request.headers.get("X-Forwarded-For")
        headers["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
        headers["X-Forwarded-Proto"] = request.scheme
        headers["X-Forwarded-Host"] = request.host
        headers.update(
            internal_auth.sign(
                request.app[INTERNAL_SECRET],
                request[IDENTITY],
                request_id,
                request.method,
                request.raw_path,
            )
        )
        return headers

    async def handle(self, request: web.Request) -> web.StreamResponse:
        session = request.app[UPSTREAM_SESSION]
        url = URL(str(self.base_url) + request.raw_path, encoded=True)
        body = request.content if request.body_exists else None
        try:
            upstream = await session.request(
                request.method,
                url,
                headers=self._request_headers(request),
                data=body,
                allow_redirects=False,
                timeout=self.timeout,
            )
        except aiohttp.ClientConnectorError as exc:
            log.warning("upstream_unreachable", upstream=self.name, error=str(exc))
            raise errors.UPSTREAM_UNREACHABLE(
                f"The {self.name} service cannot be reached; try again shortly."
            ) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            log.warning("upstream_timeout", upstream=self.name)
            raise errors.UPSTREAM_TIMEOUT(f"The {self.name} service did not answer in time.") from exc
        except (aiohttp.ClientError, ConnectionError) as exc:
            # An upload's body (a tus PATCH) read from a caller who hangs up fails as either.
            if request.transport is None or request.transport.is_closing():
                # The caller went away while we were sending its body upstream.
                log.info("client_disconnected", upstream=self.name)
                raise web.HTTPBadRequest(text="client disconnected") from exc
            log.warning("upstream_failed", upstream=self.name, error=repr(exc))
            raise errors.UPSTREAM_UNREACHABLE(f"The {self.name} service dropped the connection.") from exc
        async with upstream:
            return await self._relay(request, upstream)

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        drop = _DROP_RESPONSE | _listed_in_connection(upstream.headers)
        headers = CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in drop)
        length = upstream.content_length
        if length is not None and length <= SMALL_BODY and request.method != "HEAD":
            # Most API answers are small: relayed whole, the status line, headers and
            # body leave in one write instead of three.
            try:
                body = await upstream.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                log.warning("upstream_failed", upstream=self.name, error=repr(exc))
                raise errors.UPSTREAM_UNREACHABLE(f"The {self.name} service dropped the connection.") from exc
            del headers["Content-Length"]
            return web.Response(status=upstream.status, reason=upstream.reason, body=body, headers=headers)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        try:
            # The caller may be gone before the status line (a `logs -f` whose service answers
            # late) or before the end: each write, the first and the last too, can find it gone.
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        except ConnectionError:
            # The caller hung up: a reset, a broken pipe, or a bare ConnectionError from a
            # write that was waiting for the caller to read. Cut our end too, so that aiohttp
            # never ends the short body as if it were whole.
            log.info("client_disconnected", upstream=self.name)
            if request.transport is not None:
                request.transport.close()
            return response
        except (TimeoutError, aiohttp.ClientError) as exc:
            # Too late for a problem document: the status line is gone. Cut the
            # connection so the client sees a truncated body, never a clean end.
            log.warning("upstream_broke_mid_response", upstream=self.name, error=repr(exc))
            if request.transport is not None:
                request.transport.close()
            return response
        return response
