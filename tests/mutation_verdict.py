"""A pytest plugin for ``python3 run.py mutations`` (loaded with ``-p tests.mutation_verdict``).

It tells *how* each test failed, so that the runner scores a break as caught only when a test
failed an assertion: it writes one JSON line per failed report to the file named by
``SESSIONFORK_MUTATION_REPORT`` (``nodeid``, ``when``: setup, call, teardown or collect,
``assertion``: whether the failure is an assertion of the test, ``text``: the exception's line)
and stops the run at the first assertion failure (errors do not stop it: a later test may still
fail an assertion). An assertion is an ``AssertionError`` (an ``assert``) or a ``pytest.fail`` /
``pytest.raises`` failure in the test's call phase, or a group of them (hypothesis); not a
pytest-timeout failure, an error in a fixture, a collection failure or any other exception.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

REPORT_ENV = "SESSIONFORK_MUTATION_REPORT"
TIMEOUT_PREFIX = "Timeout (>"  # pytest-timeout's failure message: the test ran out of time, it asserted nothing


def is_assertion(exc: BaseException) -> bool:
    """Whether ``exc`` is the test's own verdict: an assert, ``pytest.fail`` or ``pytest.raises`` (not a time-out)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_assertion(inner) for inner in exc.exceptions)
    if isinstance(exc, AssertionError):
        return True
    return isinstance(exc, pytest.fail.Exception) and not str(exc).startswith(TIMEOUT_PREFIX)


def _write(row: dict[str, Any]) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    excinfo = call.excinfo
    assertion = call.when == "call" and excinfo is not None and is_assertion(excinfo.value)
    text = excinfo.exconly()[:4000] if excinfo is not None else str(report.longrepr)[-4000:]
    _write({"nodeid": item.nodeid, "when": call.when, "assertion": assertion, "text": text})
    if assertion:
        item.session.shouldstop = "stopped at the first failed assertion"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"nodeid": report.nodeid, "when": "collect", "assertion": False, "text": str(report.longrepr)[-4000:]})
