"""`sessionfork repair` makes a crashed session forkable again, and leaves balanced logs alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sessionfork import ErrorCode, ForkError, NewEvent, Registry, fork
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops.repair import repair


def crashed(registry: Registry, sid: str) -> None:
    handle = registry.create(sid)
    registry.append(handle, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1}),
                             NewEvent("turn/start", {"turn": 2}), NewEvent("step/start", {"step": 1}),
                             NewEvent("tool/call", {"id": "t1", "name": "grep"})])


def test_repaired_session_forks(registry: Registry) -> None:
    crashed(registry, "crashed")
    with pytest.raises(ForkError) as err:
        fork(registry, "crashed", "child")
    assert err.value.code is ErrorCode.OPEN_TURN
    added = repair(registry, "crashed")
    assert [e.type for e in added] == ["tool/result", "step/end", "turn/end"]
    assert fork(registry, "crashed", "child").seed_length == 8


def test_repair_continues_seq_and_repeats_the_last_time(registry: Registry) -> None:
    crashed(registry, "crashed")
    last = registry.events("crashed")[-1]
    added = repair(registry, "crashed")
    assert [e.seq for e in added] == [5, 6, 7]
    assert {e.time for e in added} == {last.time}
    assert registry.events("crashed")[5:] == added


def test_balanced_log_is_left_untouched(registry: Registry) -> None:
    handle = registry.create("fine")
    registry.append(handle, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    assert repair(registry, "fine") == []
    assert registry.length("fine") == 2


def test_repair_of_missing_session_is_not_found(registry: Registry) -> None:
    with pytest.raises(ForkError) as err:
        repair(registry, "nobody")
    assert err.value.code is ErrorCode.SESSION_NOT_FOUND


def test_repair_command_prints_what_it_appended(server: EmbeddedServer, registry: Registry) -> None:
    crashed(registry, "crashed")
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "repair", "crashed"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "tool/result, step/end, turn/end" in out.stdout


def test_repair_command_bad_id_is_one_clear_line(server: EmbeddedServer) -> None:
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "repair", "bad id!"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.startswith("error: INVALID_REQUEST") and "Traceback" not in out.stderr
