"""`sessionfork worker` exits non-zero when RQ's loop stops on an unexpected error, 0 on a stop."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from sessionfork.cli import cli
from sessionfork.embedded import EmbeddedServer
from sessionfork.queue.worker import ForkWorker


def run_worker(server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, signalled: bool) -> int:
    def work(self: ForkWorker, **kwargs: Any) -> bool:
        self.stop_signalled = signalled
        return False  # what RQ's loop returns after "found an unhandled exception, quitting..."

    monkeypatch.setattr(ForkWorker, "work", work)
    result = CliRunner().invoke(cli, ["--redis-url", server.url, "worker", "--name", "exit-test"], obj={})
    return result.exit_code


def test_worker_loop_ending_on_its_own_exits_non_zero(server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_worker(server, monkeypatch, signalled=False) == 1


def test_worker_stopped_by_a_signal_exits_zero(server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_worker(server, monkeypatch, signalled=True) == 0
