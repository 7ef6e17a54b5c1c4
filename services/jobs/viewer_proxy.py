"""A job's viewer over HTTP (docs/metrics.md §4): the owner's requests relayed, streaming, to the real server.

Only GET, HEAD and POST reach a viewer (TensorBoard POSTs some of its data queries; neither
server changes anything with them: the job's output is bound read-only). A request's
headers are passed on from a short list, so the caller's credentials (its token, the
dashboard's session cookie, the gateway's identity headers) never reach the viewer;
the answer comes back as the viewer gave it, but for hop-by-hop headers and cookies.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from .errors import ViewerFailed
from .viewers import Upstream

FORWARDED = (
    "Accept",
    "Accept-Encoding",
    "Accept-Language",
    "Content-Type",
    "Content-Length",
    "If-Match",
    "If-None-Match",
    "If-Modified-Since",
    "Range",
    "X-XSRF-Protected",
    "X-Requested-With",
)
DROPPED = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
    "set-cookie",
    "server",
}


async def relay(request: web.Request, upstream: Upstream) -> web.StreamResponse:
    """`request` as the viewer answers it; ViewerFailed (a 502) if it cannot answer."""
    headers = {name: request.headers[name] for name in FORWARDED if name in request.headers}
    body = request.content if request.body_exists else None
    try:
        answer = await upstream.session().request(
            request.method,
            upstream.base_url + request.raw_path,
            headers=headers,
            data=body,
            allow_redirects=False,
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        said = upstream.ended()
        raise ViewerFailed(f"the job's viewer did not answer: {said or exc or type(exc).__name__}") from None
    async with answer:
        kept = CIMultiDict((k, v) for k, v in answer.headers.items() if k.lower() not in DROPPED)
        response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=kept)
        await response.prepare(request)
        try:
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        except (aiohttp.ClientError, TimeoutError, ConnectionError):
            # Too late for a problem: cut the connection so the caller sees a short body.
            if request.transport is not None:
                request.transport.close()
        return response
