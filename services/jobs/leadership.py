"""Whether this jobs service acts: the leader does, a follower answers 503 and is not ready.

With the kubernetes backend and `jobs.kubernetes.leader_election.enabled`, only the replica
holding the Lease (kube/leader.py) opens the backend and reconciles; the others serve
nothing but probes, so the Service sends them nothing (`/readyz` fails) and a request that
reaches one anyway is refused before it changes anything. Without an election (the local
backend, or one replica by choice) the service acts from its start, as it always did.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from paddlecloud.common import errors
from paddlecloud.common.web import PUBLIC_PATHS, Handler

NOT_LEADER = errors.ErrorKind("ERR_NOT_LEADER", 503, "Not the leader")


@dataclass
class Leadership:
    """Whether this replica acts now, and why not in words (for the 503 and the probe)."""

    acting: bool = False
    why: Callable[[], str] = field(default=lambda: "the jobs service is starting")
    retry_after: int = 1  # seconds, for a refused request's Retry-After


LEADERSHIP = web.AppKey("leadership", Leadership)


def not_leader(leadership: Leadership) -> errors.ProblemError:
    return errors.ProblemError(
        NOT_LEADER,
        f"This jobs service replica is not the leader ({leadership.why()}); nothing was changed. Retry.",
        headers={"Retry-After": str(leadership.retry_after)},
    )


@web.middleware
async def leader_gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse every API request while this replica does not act; probes pass."""
    leadership = request.app[LEADERSHIP]
    if not leadership.acting and request.path not in PUBLIC_PATHS:
        raise not_leader(leadership)
    return await handler(request)


def readiness(leadership: Leadership) -> Callable[[], Awaitable[None]]:
    """A readiness check that fails while this replica does not act."""

    async def leader_election() -> None:
        if not leadership.acting:
            raise RuntimeError(leadership.why())

    return leader_election
