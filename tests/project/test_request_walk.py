"""A batch's walk through a real worker, traced on a real server: every step goes down.

A worker (``work(burst=True)``, RQ's bookkeeping riding the batch's round trips) takes a mixed
batch (a fork, a fan-out with edits, a merge) in one dequeue; the trace records each call into the
project's code, with the module of its caller. A call from a lower layer into a higher one is a
climb back up (a rider, a prelude, a callback): there is none. The worker enters each of the
core's step entries (``core.forks``, ``core.merges``) once per step: once per request where a step
is a request's (its check, its source step and plan), once per batch where it is the batch's (the
child steps sent, the merge steps). The walk's figures (modules, stops) are printed for the record
(``pytest -s``)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from helpers import family
from redis import Redis

from sessionfork.clients.client import Client
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult, MergeResult, NewEvent
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.service import RequestService

SRC = Path(__file__).resolve().parents[2] / "src" / "sessionfork"
LAYER = {"core": 0, "protocol": 1, "clients": 2, "worker": 2, "ops": 3, "cli": 4}
CORE_STEPS = {"core.forks", "core.merges"}


def module_of(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    path = Path(frame.f_code.co_filename)
    if not path.is_relative_to(SRC):
        return None
    return ".".join(path.relative_to(SRC).with_suffix("").parts)


def traced(call: Any) -> tuple[Any, list[tuple[str | None, str, str]]]:
    """``call()``'s value and each call into the project's code it made: (caller's module, module,
    function)."""
    calls: list[tuple[str | None, str, str]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            callee = module_of(frame)
            if callee is not None:
                back = frame.f_back
                while back is not None and module_of(back) is None:  # through a library (RQ, redis-py, msgspec)
                    back = back.f_back
                calls.append((module_of(back), callee, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        value = call()
    finally:
        sys.setprofile(None)
    return value, calls


def layer(module: str) -> int:
    return LAYER[module.split(".")[0]]


def test_a_mixed_batch_through_a_real_worker_never_climbs_back_up_a_layer(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), [NewEvent("turn/start"), NewEvent("turn/end")])
    family(registry, "parent", ["kid"])
    client = Client(redis)
    service = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=16))
    client.submit(client.request("src", count=1, request_id="warm-up"))
    worker = RequestWorker([jobs.make_queue(redis, Settings())], service=service, connection=redis, abandoned_after=30,
                        batch=32)
    assert worker.work(burst=True, logging_level="WARNING") is True  # scripts loaded: the walk is a steady one
    ids = [client.submit(request) for request in [
        client.request("src", session_id="one", request_id="walk-fork"),
        client.request("src", session_ids=["a", "b"], if_length=2,
                       edits=[NewEvent("user/message", 1)], request_id="walk-fan-out"),
        client.merge_request("parent", "kid", mode="summary", summary={"done": True}, request_id="walk-merge"),
    ]]
    worked, calls = traced(lambda: worker.work(burst=True, logging_level="WARNING"))
    assert worked is True
    fork, fan_out, merge = (service.outcomes.get(request_id) for request_id in ids)
    assert isinstance(fork, ForkResult) and fork.ok and fork.child.id == "one", fork
    assert isinstance(fan_out, ForkResult) and fan_out.ok and [h.id for h in fan_out.sessions or []] == ["a", "b"]
    assert isinstance(merge, MergeResult), merge
    assert [name for _, _, name in calls if name == "begin"] == ["begin"]  # one batch: the three together
    climbs = sorted({(caller, callee) for caller, callee, _ in calls
                     if caller is not None and layer(callee) > layer(caller)})
    assert climbs == []  # nothing below the worker calls back into it (no rider, prelude or callback)
    entries = Counter((callee, name) for caller, callee, name in calls
                      if caller is not None and caller.startswith("worker") and callee in CORE_STEPS)
    assert entries == {
        ("core.forks", "check"): 2, ("core.forks", "source_ops"): 2, ("core.forks", "plan"): 2,  # per fork
        ("core.merges", "check"): 1,  # per merge, at the edge
        ("core.forks", "send_many"): 1, ("core.forks", "collect"): 1, ("core.merges", "run_many"): 1,  # per batch
    }, entries
    steps = [callee for caller, callee, _ in calls if caller == "worker.service" and callee != "worker.service"]
    walk = [m for i, m in enumerate(steps) if i == 0 or steps[i - 1] != m]
    print(f"\nthe batch's walk from the service: {' -> '.join(walk)}")
    print(f"{len(walk)} stops in {len(set(walk))} modules; into the core (layer 0) "
          f"{sum(1 for m in walk if layer(m) == 0)} times; most entries of one module: "
          f"{Counter(walk).most_common(1)[0]}")
