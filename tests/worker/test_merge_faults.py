"""SIGKILLed workers mid-merge and mid-select: a worker process killed after the parent's
step wrote the merge turn, before the marks and the outcome (and, for a select, between the winner's
mark and the losers'), leaves a job RQ's started registry hands to another worker, whose run of it
answers the first merge: one outcome, one merge turn in the parent, the marks written.

The kill is pinned by a worker process that dies at that point (``DIES_IN_MERGE``: the worker's own
entry point with the merge's mark step replaced by a SIGKILL, as ``test_faults_dequeue_window.py``
pins a kill after the dequeue); the test then reads where it landed before recovery runs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter

import pytest
from fault_fixtures import wait_all_outcomes
from helpers import (
    SETTINGS,
    clean_environ,
    make_client,
    outcome_entries,
    start_worker,
    stored_outcome,
    worker_name,
)
from helpers import (
    family_forked_singly as family,
)
from redis import Redis
from waits import exited

from sessionfork.core import keys, merges, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import MergeRequest, MergeResult, SelectRequest, SelectResult
from sessionfork.embedded import EmbeddedServer

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.rq]  # serial: as every fault test

DIES_IN_MERGE = """
import dataclasses, os, signal, sys
from sessionfork.core.merge_steps import MergeSteps

marked = MergeSteps._mark_many


def dies(self, done):
    # The parent's step wrote the merge turn; the marks and the outcome are still to come. A request
    # id "after-winner-..." gets the winner's mark first: the kill lands between it and the losers'.
    for run, merged in done:
        if run.merge.request_id.startswith("after-winner-"):
            marked(self, [(run, dataclasses.replace(merged, abandoned=()))])
    os.kill(os.getpid(), signal.SIGKILL)


MergeSteps._mark_many = dies
from sessionfork.cli import main

sys.argv = ["sessionfork", *sys.argv[1:]]
main()
"""

MERGE, SELECT, WINNER_ONLY = "before-marks-merge", "before-marks-select", "after-winner-select"
GONE = "before-marks-gone"
"""A merge whose child is deleted after the kill, before the rescue: its retry answers the first merge."""


def start_dying_worker(url: str) -> subprocess.Popen[bytes]:
    """A worker that SIGKILLs itself in the first merge or select it runs, after the parent's step.

    It takes one request at a time (``SESSIONFORK_BATCH=1``): each of the test's dying workers is to
    die in its own request, and a batch would strand its other entries in RQ's intermediate queue
    until the stranded-job requeue (batches' kills: ``test_batch_kills.py``)."""
    return subprocess.Popen([sys.executable, "-c", DIES_IN_MERGE, "--redis-url", url, "worker", "--name",
                             worker_name("dies-in-merge"), "--log-level", "WARNING"],
                            env=clean_environ(SESSIONFORK_BATCH=1), stdin=subprocess.DEVNULL)


def merge_turns(registry: Registry, parent: str) -> list[int]:
    """The seqs of the parent's merge turns' ``turn/start``."""
    return [e.seq for e in registry.events(parent) if e.type == "turn/start" and e.data == {"trigger": "merge"}]


def test_a_worker_killed_mid_merge_and_mid_select_leaves_one_outcome_and_one_merge(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    registry = Registry(rds)
    family(registry, "pm", ["km"])
    family(registry, "ps", ["s0", "s1", "s2"])
    family(registry, "pw", ["w0", "w1", "w2"])
    family(registry, "pg", ["kg"])
    client = make_client(rds)
    requests: dict[str, MergeRequest | SelectRequest] = {
        MERGE: client.merge_request("pm", "km", mode="events", request_id=MERGE),
        SELECT: client.select_request("ps", ["s0", "s1", "s2"], "s1", mode="events", request_id=SELECT),
        WINNER_ONLY: client.select_request("pw", ["w0", "w1", "w2"], "w2", mode="summary", summary={"best": "w2"},
                                           request_id=WINNER_ONLY),
        GONE: client.merge_request("pg", "kg", mode="summary", summary={"gone": True}, request_id=GONE),
    }
    for request in requests.values():
        client.submit(request)
    dying = [start_dying_worker(own_server.url) for _ in requests]  # each dies in the first request it takes
    procs.extend(dying)
    assert [exited(proc, 30, "a worker dying in its merge") for proc in dying] == [-signal.SIGKILL] * 4

    # Where the kills landed: each parent's step done (its merge turn and its merges index), no
    # outcome; the merged child unmarked, but for WINNER_ONLY; no loser abandoned.
    assert [registry.length(p) for p in ("pm", "ps", "pw", "pg")] == [4 + 2 + 4 + 1, 4 + 2 + 4 + 1, 4 + 4, 4 + 4]
    for parent, rid in (("pm", MERGE), ("ps", SELECT), ("pw", WINNER_ONLY), ("pg", GONE)):
        index = {wire.text(k): wire.text(v) for k, v in rds.hgetall(keys.session_merges(parent)).items()}
        assert [v.split()[0] for k, v in index.items() if k.startswith('["m",')] == [rid]  # it names the request
        assert stored_outcome(rds, rid) is None
    assert [registry.state_of(s).state for s in ("km", "s0", "s1", "s2", "w0", "w1", "w2")] == [
        "live", "live", "live", "live", "live", "live", "merged"]
    assert outcome_entries(rds) == []
    # Before the rescue the sessions change: GONE's child is deleted; a merge of SELECT's loser s0
    # is refused (the select, still to end, holds it).
    registry.delete("kg")
    with pytest.raises(ForkError) as refused:
        merges.merge(registry, "ps", "s0", mode="summary", summary="late", request_id="late-merge")
    assert refused.value.code is ErrorCode.ALREADY_MERGED and f'request "{SELECT}"' in refused.value.message

    procs.append(start_worker(own_server.url, worker_name("rescuer"), SESSIONFORK_WORKER_TTL=16))
    bound = SETTINGS.abandoned_after + 2 * SETTINGS.maintenance_interval + 1  # as the dequeue-window kill
    wait_all_outcomes(rds, list(requests), timeout=bound + 10)

    entries = outcome_entries(rds)
    assert Counter(e.request for e in entries) == dict.fromkeys(requests, 1)  # one outcome each
    for entry in entries:
        assert entry.code == "OK" and entry.raw == stored_outcome(rds, entry.request)
    replies = {e.request: e.reply for e in entries}
    merged, selected, winner_only, gone = replies[MERGE], replies[SELECT], replies[WINNER_ONLY], replies[GONE]
    assert isinstance(gone, MergeResult) and (gone.from_seq, gone.length) == (4, 8)
    assert isinstance(merged, MergeResult) and (merged.from_seq, merged.to_seq, merged.length) == (4, 10, 11)
    assert isinstance(selected, SelectResult) and (selected.winner, selected.abandoned) == ("s1", ["s0", "s2"])
    assert isinstance(winner_only, SelectResult) and winner_only.abandoned == ["w0", "w1"]
    assert (selected.length, winner_only.length) == (11, 8)

    # One merge turn per parent (its length grew once), one merge in each merges index.
    for parent, rid, length in (("pm", MERGE, 11), ("ps", SELECT, 11), ("pw", WINNER_ONLY, 8)):
        assert registry.length(parent) == length and merge_turns(registry, parent) == [4]
        index = {wire.text(k): wire.text(v) for k, v in rds.hgetall(keys.session_merges(parent)).items()}
        assert [v.split()[0] for k, v in index.items() if k.startswith('["m",')] == [rid]
    assert [registry.state_of(s).state for s in ("km", "s0", "s1", "s2", "w0", "w1", "w2")] == [
        "merged", "abandoned", "merged", "abandoned", "abandoned", "abandoned", "merged"]
    assert json.loads(rds.hget(keys.session("km"), "mergedinto") or "") == ["pm", 4, MERGE]
    assert {registry.state_of(s).abandoned_by for s in ("s0", "s2")} == {SELECT}
    assert {registry.state_of(s).abandoned_by for s in ("w0", "w1")} == {WINNER_ONLY}
