"""Rate-limited logging: at most one line per interval per kind of problem.

Why: a broker outage makes every batch fail; logging each failure would flood the gateway's log
(and spend its CPU) exactly when it is under stress. Each kind logs its first occurrence at once,
then stays quiet for `interval_ms`, counting what it suppressed; the next line it logs says how
many were suppressed, and `report_suppressed` logs the remainder at shutdown. Time is passed in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["ThrottledLog"]


@dataclass(slots=True)
class _Kind:
    last_ms: int
    suppressed: int = 0


class ThrottledLog:
    """A logger wrapper that limits lines per `kind` (not thread-safe: one caller at a time)."""

    __slots__ = ("_kinds", "interval_ms", "logger")

    def __init__(self, logger: logging.Logger, interval_ms: int = 10_000) -> None:
        self.logger = logger
        self.interval_ms = interval_ms
        self._kinds: dict[str, _Kind] = {}

    def due(self, kind: str, now_ms: int) -> bool:
        """Whether a line of `kind` would be logged at `now_ms` (for callers that summarise)."""
        state = self._kinds.get(kind)
        return state is None or now_ms - state.last_ms >= self.interval_ms

    def log(self, kind: str, now_ms: int, level: int, message: str) -> bool:
        """Log `message` unless `kind` was logged less than `interval_ms` ago; True if logged."""
        state = self._kinds.get(kind)
        if state is not None and now_ms - state.last_ms < self.interval_ms:
            state.suppressed += 1
            return False
        suppressed = state.suppressed if state is not None else 0
        if suppressed:
            message += (
                f" ({suppressed} similar suppressed in the last {self.interval_ms / 1000:g} s)"
            )
        self.logger.log(level, "%s", message)
        self._kinds[kind] = _Kind(last_ms=now_ms)
        return True

    def suppressed(self) -> dict[str, int]:
        """Lines suppressed per kind since each kind's last logged line."""
        return {k: s.suppressed for k, s in self._kinds.items() if s.suppressed}

    def report_suppressed(self, level: int = logging.WARNING) -> None:
        """Log one line per kind that still has suppressed lines (at shutdown)."""
        for kind, count in self.suppressed().items():
            self.logger.log(level, "%d more %r problems were not logged (rate limit)", count, kind)
            self._kinds[kind].suppressed = 0
