"""The tests' waits on a condition, with a deadline, and their reads of what a call gives: a wait
that ends unmet, or a call that raises where it should answer, is the test's verdict.

Each fails the test with an ``AssertionError`` naming what did not happen in time (never a
``TimeoutError`` or ``subprocess.TimeoutExpired``): "the worker registers again within 10 s" is
a promise of the test, and ``run.py mutations`` counts only a failed assertion as a caught break.
"""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sessionfork import embedded

T = TypeVar("T")


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.01) -> None:
    """Poll ``predicate()`` until true; at the deadline, fail the test naming ``what``."""
    try:
        embedded.wait_until(predicate, timeout, what, interval)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def exited(process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float, what: str = "the process") -> int:
    """``process``'s exit status once it exits; when it is still running at the deadline, fail the
    test saying so (the process is left to the caller's clean-up)."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} still running {timeout}s later") from None


def outcome_of(call: Callable[[], T]) -> T | str:
    """``call()``'s value, or the exception it raised as text (``"KeyError: 'x'"``): for a test that
    asserts what a call gives, so that a call raising where it should answer fails that assertion,
    naming the exception (a client's ``TimeoutError`` included: no reply in time)."""
    try:
        return call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def raised(call: Callable[[], object]) -> Exception:
    """The exception ``call()`` raises, whatever its type, for the test to assert on; a call that
    returns fails the test (as ``pytest.raises``, but a wrong type is the test's assertion too)."""
    try:
        value = call()
    except Exception as exc:
        return exc
    raise AssertionError(f"did not raise (returned {value!r})")


async def araised(call: Callable[[], Awaitable[object]]) -> Exception:
    """``raised`` for a coroutine's call."""
    try:
        value = await call()
    except Exception as exc:
        return exc
    raise AssertionError(f"did not raise (returned {value!r})")


async def aoutcome_of(call: Callable[[], Awaitable[T]]) -> T | str:
    """``outcome_of`` for a coroutine's call."""
    try:
        return await call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
