"""A registry clock the tests move by hand (``Clock``), its start (``T0``: 2027) and an hour in ms;
``tests/conftest.py`` serves it as the ``clock`` fixture and a registry on it as ``timed``."""

from __future__ import annotations

T0 = 1_800_000_000_000
HOUR = 3_600_000


class Clock:
    """Epoch milliseconds, ``now``: set it to move time."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now
