"""A tiny run of the LangGraph checkpointers' bench (``bench.langgraph``), so it cannot rot: no
timing is asserted (its figures are not measurements here), PostgreSQL's peer left out."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import langgraph as bench

TINY = {"steps": 5, "gets": 5, "long": 40}


def test_each_peer_measures_every_figure_and_the_copies_are_whole() -> None:
    results = {}
    with bench.sessionfork_peer() as (saver, fresh, size):
        results["sessionfork"] = bench.measure("sessionfork", saver, fresh, size, TINY)
    with tempfile.TemporaryDirectory() as folder, bench.sqlite_peer(Path(folder)) as (lite, fresh_lite, lite_size):
        results["sqlite"] = bench.measure("sqlite", lite, fresh_lite, lite_size, TINY)
    names = ["put/s", "get/s", "copy_thread 10 steps (ms)", "bytes per checkpoint", "copy_thread 40 steps (ms)",
             "first get, new saver, 40 steps (ms)"]
    for measures in results.values():
        assert list(measures) == names
        assert all(value > 0 for value in measures.values()), measures
    table = bench.render(results)
    assert table.splitlines()[0] == "| measure | SessionforkSaver | sqlite (LangGraph's SqliteSaver) |"
    assert "| bytes per checkpoint |" in table


def test_a_copy_by_hand_keeps_every_checkpoint_and_write() -> None:
    with tempfile.TemporaryDirectory() as folder, bench.sqlite_peer(Path(folder)) as (lite, _fresh, _size):
        bench.build(lite, "source", 3, writes=True)
        bench.copied_by_hand(lite, "source", "target")
        copied = list(lite.list({"configurable": {"thread_id": "target"}}))
        assert [t.checkpoint["channel_values"]["step"] for t in copied] == [2, 1, 0]
        assert [t.pending_writes for t in copied] == [[("task-2", "step", 3)], [("task-1", "step", 2)],
                                                      [("task-0", "step", 1)]]
