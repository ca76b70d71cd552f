"""Cold-start policy: which scheduling profile is active.

Early in training the policy is near random: outputs have high entropy, prefixes rarely repeat,
so the scheduler uses the ``cold`` profile (low prefix weight, small batches, short TTL, high
diversity). It switches once to ``stable`` when the training step reaches ``switch_step`` and
the normalised output entropy has fallen to ``switch_entropy`` (both thresholds in YAML), or at
``max_cold_steps`` regardless. The state is exposed by :meth:`ColdStartController.metrics`.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable

from rollmux.rollout_sched.config import ColdStartConfig, SchedProfile


class ColdStartController:
    """Tracks training step and output entropy and picks the active :class:`SchedProfile`.

    Output entropy: plug-in Shannon entropy of the unigram distribution of the last
    ``entropy_window_tokens`` generated tokens, normalised by ``log(min(vocab_size, n))``
    (1 = uniform, 0 = one token). An externally measured policy entropy (already normalised to
    [0, 1]) may be reported with :meth:`report_entropy` and then takes precedence.
    """

    def __init__(self, config: ColdStartConfig):
        self.config = config
        self.phase = "cold"
        self.step = 0
        self.switched_at_step: int | None = None
        self._window: deque[int] = deque()
        self._counts: Counter[int] = Counter()
        self._external_entropy: float | None = None
        self._entropy_cache: float | None = 1.0

    @property
    def profile(self) -> SchedProfile:
        return self.config.cold if self.phase == "cold" else self.config.stable

    def observe_tokens(self, tokens: Iterable[int]) -> None:
        """Add generated tokens to the entropy window."""
        cap = self.config.entropy_window_tokens
        for t in tokens:
            self._window.append(t)
            self._counts[t] += 1
            if len(self._window) > cap:
                old = self._window.popleft()
                self._counts[old] -= 1
                if not self._counts[old]:
                    del self._counts[old]
        self._entropy_cache = None

    def report_entropy(self, value: float) -> None:
        """Report a normalised policy entropy in [0, 1]. Raises ValueError outside that range."""
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"entropy must be in [0, 1], got {value}")
        self._external_entropy = float(value)

    @property
    def entropy(self) -> float:
        """Normalised output entropy in [0, 1]; 1.0 before any token was seen."""
        if self._external_entropy is not None:
            return self._external_entropy
        if self._entropy_cache is None:
            n = len(self._window)
            if n < 2:
                self._entropy_cache = 1.0
            else:
                h = -sum(c / n * math.log(c / n) for c in self._counts.values())
                self._entropy_cache = h / math.log(min(self.config.vocab_size, n))
        return self._entropy_cache

    def on_step(self, step: int) -> bool:
        """Record the training step (monotone). Returns True when this call switched to stable."""
        self.step = max(self.step, int(step))
        return self.maybe_switch()

    def maybe_switch(self) -> bool:
        """Switch cold -> stable when both thresholds hold, or at ``max_cold_steps``."""
        c = self.config
        if self.phase != "cold":
            return False
        if (self.step >= c.switch_step and self.entropy <= c.switch_entropy) or self.step >= c.max_cold_steps:
            self.phase = "stable"
            self.switched_at_step = self.step
            return True
        return False

    def metrics(self) -> dict:
        c = self.config
        return {
            "coldstart_phase": self.phase,
            "coldstart_step": self.step,
            "coldstart_output_entropy": round(self.entropy, 4),
            "coldstart_switch_step": c.switch_step,
            "coldstart_switch_entropy": c.switch_entropy,
            "coldstart_switched_at_step": self.switched_at_step,
        }
