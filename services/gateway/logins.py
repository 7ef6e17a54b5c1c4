"""Failed logins counted per user name and per client address, to refuse guessing with a 429."""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

# Names and addresses remembered at most, each with its recent failures: someone spraying
# made-up names costs this much memory and no more (the oldest are forgotten first).
MAX_TRACKED = 100_000


@dataclass(frozen=True)
class Refusal:
    """Why a login is not tried now, and in how many whole seconds it may be."""

    reason: str
    retry_after: int


class _Window:
    """The times of the last `limit` failures of each key, within `seconds`."""

    def __init__(self, limit: int, seconds: float, clock: Callable[[], float]) -> None:
        self._limit = limit
        self._seconds = seconds
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, key: str) -> float | None:
        """Seconds until `key` may try again, or None if it may now."""
        if self._limit == 0:
            return None
        times = self._recent(key)
        if times is None or len(times) < self._limit:
            return None
        return times[0] + self._seconds - self._clock()

    def add(self, key: str) -> None:
        if self._limit == 0:
            return
        times = self._recent(key)
        if times is None:
            times = self._failures[key] = deque(maxlen=self._limit)
            if len(self._failures) > MAX_TRACKED:
                self._failures.popitem(last=False)
        times.append(self._clock())
        self._failures.move_to_end(key)

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def _recent(self, key: str) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        horizon = self._clock() - self._seconds
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times


class LoginLimiter:
    """Refuses logins for a user name, or from an address, that failed too often lately.

    A refused login costs no password hash and is refused whatever its password: a
    guesser learns nothing more until the window has passed. Unknown names are counted
    like known ones, so the limit does not tell which names exist. `0` turns a limit off.
    """

    def __init__(
        self,
        *,
        per_user: int,
        per_address: int,
        window_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._users = _Window(per_user, window_seconds, clock)
        self._addresses = _Window(per_address, window_seconds, clock)

    def check(self, username: str, address: str) -> Refusal | None:
        for window, key, reason in (
            (self._users, username, "for this user name"),
            (self._addresses, address, "from this address"),
        ):
            wait = window.retry_after(key)
            if wait is not None:
                return Refusal(reason, max(1, math.ceil(wait)))
        return None

    def failed(self, username: str, address: str) -> None:
        self._users.add(username)
        self._addresses.add(address)

    def succeeded(self, username: str) -> None:
        # The user proved the password: earlier failures under the name were theirs, or a
        # guesser's that the limit already slowed. The address keeps its count.
        self._users.forget(username)
