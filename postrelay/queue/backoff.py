"""How long a failed job waits before its next attempt."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol


class Backoff(Protocol):
    def delay(self, attempts: int) -> float:
        """Seconds to wait after the `attempts`-th attempt failed."""
        ...


@dataclass(frozen=True, slots=True)
class FixedBackoff:
    """The same delay after every failure (the hosted seed's 5 s)."""

    secs: float = 5.0

    def delay(self, attempts: int) -> float:
        return self.secs


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """base * 2^(attempts-1), capped, with "equal jitter": half fixed, half random, so a
    burst of failures does not retry in lock step."""

    base_secs: float = 5.0
    cap_secs: float = 3600.0
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay(self, attempts: int) -> float:
        exponent = min(max(attempts, 1) - 1, 62)  # 2**62 already dwarfs any cap
        ceiling = min(self.cap_secs, self.base_secs * 2.0**exponent)
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)


def backoff_from(kind: str, base_secs: float, cap_secs: float) -> Backoff:
    if kind == "exponential":
        return ExponentialBackoff(base_secs, cap_secs)
    return FixedBackoff(base_secs)
