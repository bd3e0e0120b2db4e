"""A request's walk from the worker's handler, traced on a real server: every step goes down.

The trace records each call into the project's code while ``ForkService.handle`` runs a request
(a fan-out with edits, the worst case), with the module of its caller. A call from a lower layer
into a higher one is a climb back up (a rider, a prelude, a callback): there is none. The
handler enters the core's step entries (``core.forks``) once per step, and the walk's figures
(modules, stops, returns) are printed for the record (``pytest -s``)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from redis import Redis

from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult, NewEvent
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.service import ForkService

SRC = Path(__file__).resolve().parents[2] / "src" / "sessionfork"
LAYER = {"core": 0, "protocol": 1, "clients": 2, "worker": 2, "ops": 3, "cli": 4}


def module_of(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    path = Path(frame.f_code.co_filename)
    if not path.is_relative_to(SRC):
        return None
    return ".".join(path.relative_to(SRC).with_suffix("").parts)


def traced(call: Any) -> tuple[Any, list[tuple[str | None, str]]]:
    """``call()``'s value and each call into the project's code it made: (caller's module, module)."""
    calls: list[tuple[str | None, str]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            callee = module_of(frame)
            if callee is not None:
                back = frame.f_back
                while back is not None and module_of(back) is None:  # through a library (redis-py, msgspec)
                    back = back.f_back
                calls.append((module_of(back), callee))

    sys.setprofile(profile)
    try:
        value = call()
    finally:
        sys.setprofile(None)
    return value, calls


def layer(module: str) -> int:
    return LAYER[module.split(".")[0]]


def test_a_fan_out_with_edits_never_climbs_back_up_a_layer(redis: Redis) -> None:
    registry = Registry(redis)
    registry.append(registry.create("src"), [NewEvent("turn/start"), NewEvent("turn/end")])
    service = ForkService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="replies")
    service.handle('{"source":"src","count":1}', "warm-up")  # scripts loaded: the walk is a steady one
    payload = '{"source":"src","sessionIds":["a","b"],"ifLength":2,"edits":[{"type":"user/message","data":1}]}'
    reply, calls = traced(lambda: service.handle(payload, "walk-1"))
    assert isinstance(reply, ForkResult) and reply.ok and len(reply.sessions or []) == 2
    climbs = sorted({(caller, callee) for caller, callee in calls
                     if caller is not None and layer(callee) > layer(caller)})
    assert climbs == []  # nothing below the worker calls back into it (no rider, prelude or callback)
    entries = Counter(callee for caller, callee in calls if caller == "worker.service" and callee == "core.forks")
    assert entries["core.forks"] == 4  # check, source_ops, plan, create: once per step
    steps = [callee for caller, callee in calls if caller == "worker.service" and callee != "worker.service"]
    walk = [m for i, m in enumerate(steps) if i == 0 or steps[i - 1] != m]
    print(f"\nthe handler's walk: {' -> '.join(walk)}")
    print(f"{len(walk)} stops in {len(set(walk))} modules; into the core (layer 0) "
          f"{sum(1 for m in walk if layer(m) == 0)} times; most entries of one module: "
          f"{Counter(walk).most_common(1)[0]}")
