"""Per-client rate limit of the open read routes (``GET`` without a token).

One token bucket per client address (``rate_per_s`` tokens per second, at most ``burst``) in
each Serve replica; a request finding its bucket empty gets 429 with ``Retry-After`` (whole
seconds until a token is back). The table of buckets is bounded (``max_clients``; the least
recently seen client is forgotten first), so many addresses cannot grow it without bound.
Requests carrying the API token are never limited. Pure bookkeeping; the clock is injectable.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Callable

__all__ = ["ClientRateLimit"]


class ClientRateLimit:
    """Token buckets by client key (see the module docstring)."""

    def __init__(self, rate_per_s: float, burst: int, *, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        if not (rate_per_s > 0 and burst >= 1):
            raise ValueError("rate_per_s must be > 0 and burst >= 1")
        self.rate, self.burst, self.max_clients, self.clock = float(rate_per_s), int(burst), int(max_clients), clock
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()
        self.refused = 0

    def take(self, client: str) -> float:
        """Take one token for ``client``: 0.0 when allowed, else the seconds until one is back."""
        now = self.clock()
        tokens, last = self._buckets.pop(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            self._buckets[client] = (tokens - 1.0, now)
            wait = 0.0
        else:
            self._buckets[client] = (tokens, now)
            self.refused += 1
            wait = (1.0 - tokens) / self.rate
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return wait

    @staticmethod
    def retry_after_s(wait_s: float) -> int:
        return max(1, math.ceil(wait_s))
