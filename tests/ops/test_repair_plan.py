"""The repair rule: what closes an open turn, as the original harness does on reload."""

from typing import Any

from sessionfork.core.wire import Event
from sessionfork.ops.repair import plan_repair


def log(*events: tuple[str, Any]) -> list[Event]:
    return [Event(kind, seq, 1000 + seq, data) for seq, (kind, data) in enumerate(events)]


def kinds(plan: list[Any]) -> list[str]:
    return [e.type for e in plan]


def test_balanced_log_needs_nothing() -> None:
    assert plan_repair(log(("turn/start", {"turn": 1}), ("turn/end", {"turn": 1}))) == []


def test_empty_log_needs_nothing() -> None:
    assert plan_repair([]) == []


def test_open_turn_gets_an_interrupted_turn_end() -> None:
    plan = plan_repair(log(("turn/start", {"turn": 3}), ("user/message", {})))
    assert kinds(plan) == ["turn/end"]
    assert plan[0].data == {"turn": 3, "reason": {"kind": "interrupted"}}


def test_unanswered_tool_calls_get_error_results_in_order() -> None:
    plan = plan_repair(log(("turn/start", {"turn": 1}), ("tool/call", {"id": "a", "name": "ls"}),
                           ("tool/call", {"id": "b", "name": "cat"}), ("tool/result", {"id": "a"})))
    assert kinds(plan) == ["tool/result", "turn/end"]
    assert plan[0].data == {"id": "b", "name": "cat", "error": {"name": "InterruptedError", "code": "interrupted"}}


def test_tool_call_id_key_is_kept() -> None:
    plan = plan_repair(log(("turn/start", {"turn": 1}), ("tool/call", {"toolCallId": "x"})))
    assert plan[0].data["toolCallId"] == "x"


def test_open_step_gets_a_step_end_before_the_turn_end() -> None:
    plan = plan_repair(log(("turn/start", {"turn": 1}), ("step/start", {"step": 2}), ("tool/call", {"callId": "c"})))
    assert kinds(plan) == ["tool/result", "step/end", "turn/end"]
    assert plan[1].data == {"step": 2}


def test_closed_step_gets_no_step_end() -> None:
    plan = plan_repair(log(("turn/start", {"turn": 1}), ("step/start", {}), ("step/end", {}),
                           ("assistant/message", {})))
    assert kinds(plan) == ["turn/end"]


def test_only_the_last_turn_is_considered() -> None:
    plan = plan_repair(log(("turn/start", {"turn": 1}), ("tool/call", {"id": "old"}), ("turn/end", {}),
                           ("turn/start", {"turn": 2}), ("assistant/chunk", {})))
    assert kinds(plan) == ["turn/end"]
