"""``SessionforkSaver`` against LangGraph's own checkpointer contract (``langgraph-checkpoint-
conformance``, every capability, base and extended) on a single server and on a Cluster, then a
real ``StateGraph`` over it: interrupted, resumed and time-travelled."""

from __future__ import annotations

import asyncio
import operator
import threading
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypedDict

import pytest
from cluster_fixtures import assert_no_crossslot
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, Capability
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.conformance.spec import (
    test_copy_thread,
    test_delete_for_runs,
    test_delete_thread,
    test_get_tuple,
    test_list,
    test_prune,
    test_put,
    test_put_writes,
)
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import INTERRUPT
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from redis import Redis

from sessionfork.core import keys
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedCluster
from sessionfork.integrations.langgraph import SessionforkSaver

SUITE = {
    Capability.PUT: test_put.ALL_PUT_TESTS,
    Capability.PUT_WRITES: test_put_writes.ALL_PUT_WRITES_TESTS,
    Capability.GET_TUPLE: test_get_tuple.ALL_GET_TUPLE_TESTS,
    Capability.LIST: test_list.ALL_LIST_TESTS,
    Capability.DELETE_THREAD: test_delete_thread.ALL_DELETE_THREAD_TESTS,
    Capability.DELETE_FOR_RUNS: test_delete_for_runs.ALL_DELETE_FOR_RUNS_TESTS,
    Capability.COPY_THREAD: test_copy_thread.ALL_COPY_THREAD_TESTS,
    Capability.PRUNE: test_prune.ALL_PRUNE_TESTS,
}
"""Every capability of the suite and its tests, as the installed package lists them."""


def conformance(registry: Registry) -> CapabilityReport:
    """The whole suite, every capability, one fresh saver per capability (the suite's own runner)."""

    @checkpointer_test(name="SessionforkSaver")
    async def saver() -> AsyncIterator[SessionforkSaver]:
        yield SessionforkSaver(registry)

    report = asyncio.run(validate(saver))
    report.print_report()
    return report


def assert_whole_suite_passed(report: CapabilityReport) -> None:
    assert set(SUITE) == ALL_CAPABILITIES
    for capability, tests in SUITE.items():
        result = report.results[capability.value]
        assert result.detected, f"{capability.value} not detected"
        assert result.failures == [], f"{capability.value}: {result.failures}"
        assert (result.tests_passed, result.tests_failed, result.tests_skipped) == (len(tests), 0, 0), capability
    assert report.conformance_level() == "FULL"


def test_the_whole_conformance_suite_passes_on_one_server(registry: Registry) -> None:
    assert_whole_suite_passed(conformance(registry))


def test_the_whole_conformance_suite_passes_on_a_cluster(cluster: EmbeddedCluster, cluster_registry: Registry) -> None:
    assert_whole_suite_passed(conformance(cluster_registry))
    assert_no_crossslot(cluster)


# -- a real graph over the saver ----------------------------------------------------------------


class Plan(TypedDict):
    steps: Annotated[list[str], operator.add]
    answer: str


def plan(state: Plan) -> dict[str, Any]:
    return {"steps": ["plan"]}


def ask(state: Plan) -> dict[str, Any]:
    answer = interrupt({"question": "approve the plan?"})
    return {"steps": ["ask"], "answer": answer}


def act(state: Plan) -> dict[str, Any]:
    return {"steps": [f"act:{state['answer']}"]}


def planner(saver: SessionforkSaver) -> Any:
    builder = StateGraph(Plan)
    builder.add_node("plan", plan)
    builder.add_node("ask", ask)
    builder.add_node("act", act)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "ask")
    builder.add_edge("ask", "act")
    builder.add_edge("act", END)
    return builder.compile(checkpointer=saver)


def thread(name: str) -> RunnableConfig:
    return {"configurable": {"thread_id": f"{name}-{uuid.uuid4()}"}}


def test_a_graph_is_interrupted_then_resumed_by_another_saver(registry: Registry) -> None:
    config = thread("approve")
    first = planner(SessionforkSaver(registry)).invoke({"steps": []}, config)
    assert [i.value for i in first["__interrupt__"]] == [{"question": "approve the plan?"}]

    later = planner(SessionforkSaver(registry))   # another process's saver: nothing cached
    assert later.get_state(config).next == ("ask",)
    done = later.invoke(Command(resume="yes"), config)
    assert done["steps"] == ["plan", "ask", "act:yes"]
    assert later.get_state(config).next == ()


def test_a_graph_travels_back_to_an_earlier_checkpoint_and_continues_from_it(registry: Registry) -> None:
    graph, config = planner(SessionforkSaver(registry)), thread("travel")
    graph.invoke({"steps": []}, config)
    graph.invoke(Command(resume="yes"), config)
    history = list(graph.get_state_history(config))
    before_act = next(s for s in history if s.next == ("act",))
    assert before_act.values["answer"] == "yes"

    edited = graph.update_state(before_act.config, {"answer": "no"})
    done = graph.invoke(None, edited)
    assert done["steps"] == ["plan", "ask", "act:no"]
    assert graph.get_state(config).values["steps"] == ["plan", "ask", "act:no"]
    original_end = history[0]                      # the first run's final checkpoint is still there
    assert graph.get_state(original_end.config).values["steps"] == ["plan", "ask", "act:yes"]
    assert len(list(graph.get_state_history(config))) == len(history) + 2   # the edit and the act


def test_a_copied_thread_resumes_apart_from_its_source(registry: Registry) -> None:
    saver = SessionforkSaver(registry)
    graph, source, copy = planner(saver), thread("source"), thread("copy")
    graph.invoke({"steps": []}, source)
    saver.copy_thread(source["configurable"]["thread_id"], copy["configurable"]["thread_id"])

    assert graph.invoke(Command(resume="yes"), source)["steps"] == ["plan", "ask", "act:yes"]
    assert graph.invoke(Command(resume="no"), copy)["steps"] == ["plan", "ask", "act:no"]
    assert graph.get_state(source).values["answer"] == "yes"


def test_a_copied_thread_merges_back_and_its_source_continues_from_it(registry: Registry) -> None:
    saver = SessionforkSaver(registry)
    graph, source, copy = planner(saver), thread("main"), thread("branch")
    main, branch = source["configurable"]["thread_id"], copy["configurable"]["thread_id"]
    graph.invoke({"steps": []}, source)
    saver.copy_thread(main, branch)
    graph.invoke(Command(resume="yes"), source)
    graph.invoke(Command(resume="with edits"), copy)
    copied = saver.session_of(branch) or ""
    gained = registry.length(copied) - (registry.header(copied).seed_length or 0)

    merged = saver.merge_thread(branch, main)
    assert (merged.parent, merged.child) == (saver.session_of(main), saver.session_of(branch))
    assert merged.to_seq - merged.from_seq + 1 == gained
    assert registry.state_of(merged.child).merged_into is not None
    assert graph.get_state(source).values == {"steps": ["plan", "ask", "act:with edits"], "answer": "with edits"}
    assert graph.get_state(copy).values["answer"] == "with edits"
    with pytest.raises(ForkError) as raised:
        saver.merge_thread(branch, main)
    assert raised.value.code is ErrorCode.ALREADY_MERGED


def nested(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    """``planner`` with its question asked inside a subgraph (its checkpoints: a namespace of its own)."""
    inner = StateGraph(Plan)
    inner.add_node("ask", ask)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)
    outer = StateGraph(Plan)
    outer.add_node("plan", plan)
    outer.add_node("review", inner.compile())
    outer.add_node("act", act)
    outer.add_edge(START, "plan")
    outer.add_edge("plan", "review")
    outer.add_edge("review", "act")
    outer.add_edge("act", END)
    return outer.compile(checkpointer=checkpointer)


def nested_run(first: BaseCheckpointSaver[Any], second: BaseCheckpointSaver[Any]) -> tuple[set[str], list[str]]:
    """Run ``nested`` to its question on ``first``, resume it on ``second``: the namespaces stored
    while it waited (the subgraph's id-free prefix) and the final steps."""
    config = thread("nested")
    nested(first).invoke({"steps": []}, config)
    (task,) = nested(first).get_state(config, subgraphs=True).tasks
    assert task.name == "review" and task.state is not None
    stored = {t.config["configurable"]["checkpoint_ns"].split(":")[0] for t in first.list(
        {"configurable": {"thread_id": config["configurable"]["thread_id"]}})}
    done = nested(second).invoke(Command(resume="nested yes"), config)
    return stored, done["steps"]


def test_a_subgraph_interrupted_inside_resumes_from_its_namespace_as_over_langgraphs_own_saver(
        registry: Registry) -> None:
    memory = InMemorySaver()
    ours = nested_run(SessionforkSaver(registry), SessionforkSaver(registry))
    assert ours == nested_run(memory, memory)
    assert ours[0] == {"", "review"}
    assert ours[1][-1] == "act:nested yes"


async def run_async(saver: SessionforkSaver, config: RunnableConfig) -> list[str]:
    graph = planner(saver)
    await graph.ainvoke({"steps": []}, config)
    assert (await graph.aget_state(config)).next == ("ask",)
    done = await graph.ainvoke(Command(resume="later"), config)
    steps: list[str] = done["steps"]
    return steps


def test_a_graph_runs_on_the_async_methods(registry: Registry) -> None:
    assert asyncio.run(run_async(SessionforkSaver(registry), thread("async"))) == ["plan", "ask", "act:later"]


# -- the saver's own promises ---------------------------------------------------------------------


def put_steps(saver: SessionforkSaver, thread_id: str, n: int, ns: str = "") -> list[RunnableConfig]:
    """``n`` checkpoints on one thread and namespace, each the child of the one before, each with a
    pending write; step ``i``'s channel ``step`` is ``"<ns or root>/<i>"`` at version ``i + 1``."""
    stored: list[RunnableConfig] = []
    parent: str | None = None
    for step in range(n):
        config = generate_config(thread_id, checkpoint_ns=ns, checkpoint_id=parent)
        value = f"{ns or 'root'}/{step}"
        checkpoint = generate_checkpoint(channel_values={"step": value}, channel_versions={"step": step + 1})
        stored.append(saver.put(config, checkpoint, generate_metadata(step=step), {"step": step + 1}))
        saver.put_writes(stored[-1], [("note", f"after {step}")], f"task-{step}")
        parent = stored[-1]["configurable"]["checkpoint_id"]
    return stored


def test_copy_thread_forks_the_session_by_reference(registry: Registry) -> None:
    saver = SessionforkSaver(registry)
    source, target = f"long-{uuid.uuid4()}", f"copy-{uuid.uuid4()}"
    put_steps(saver, source, 50)
    saver.copy_thread(source, target)

    src, dst = saver.session_of(source), saver.session_of(target)
    assert src is not None and dst is not None and src != dst
    header = registry.header(dst)
    assert (header.parent_session, header.seed_length) == (src, registry.length(src))
    assert registry.redis.llen(keys.session_log(dst)) == 0          # not one event copied
    copied = list(SessionforkSaver(registry).list(generate_config(target)))
    assert [t.checkpoint["channel_values"]["step"] for t in copied] == [f"root/{i}" for i in range(49, -1, -1)]
    assert copied[0].pending_writes == [("task-49", "note", "after 49")]


def test_a_copy_keeps_every_checkpoint_when_its_source_is_pruned_or_deleted(registry: Registry) -> None:
    saver = SessionforkSaver(registry)
    source, target = f"src-{uuid.uuid4()}", f"copy-{uuid.uuid4()}"
    put_steps(saver, source, 5)
    saver.copy_thread(source, target)
    saver.prune([source], strategy="keep_latest")
    assert len(list(saver.list(generate_config(source)))) == 1
    saver.delete_thread(source)
    assert saver.session_of(source) is None
    assert len(list(SessionforkSaver(registry).list(generate_config(target)))) == 5


def test_namespaces_of_one_thread_never_mix(registry: Registry) -> None:
    saver, thread_id = SessionforkSaver(registry), f"ns-{uuid.uuid4()}"
    root = put_steps(saver, thread_id, 3)
    child = put_steps(saver, thread_id, 2, ns="child:1")
    reader = SessionforkSaver(registry)
    assert [t.config for t in reader.list(generate_config(thread_id))] == root[::-1]
    assert [t.config for t in reader.list(generate_config(thread_id, checkpoint_ns="child:1"))] == child[::-1]
    latest = reader.get_tuple(generate_config(thread_id, checkpoint_ns="child:1"))
    assert latest is not None and latest.checkpoint["channel_values"] == {"step": "child:1/1"}
    assert latest.pending_writes == [("task-1", "note", "after 1")]
    first = reader.get_tuple(root[0])                               # version 1 in both namespaces
    assert first is not None and first.checkpoint["channel_values"] == {"step": "root/0"}
    newest_root = reader.get_tuple(generate_config(thread_id))
    assert newest_root is not None and newest_root.config == root[-1]
    root_id = root[0]["configurable"]["checkpoint_id"]              # a root checkpoint, asked of the child's
    assert reader.get_tuple(generate_config(thread_id, checkpoint_ns="child:1", checkpoint_id=root_id)) is None


def test_a_task_write_stored_once_is_kept_and_a_special_write_replaced(registry: Registry) -> None:
    saver, thread_id = SessionforkSaver(registry), f"writes-{uuid.uuid4()}"
    stored = saver.put(generate_config(thread_id), generate_checkpoint(), generate_metadata(), {})
    saver.put_writes(stored, [("ch", "first"), (INTERRUPT, "asked")], "task")
    saver.put_writes(stored, [("ch", "again"), (INTERRUPT, "asked again")], "task")   # a retried task
    read = SessionforkSaver(registry).get_tuple(stored)
    assert read is not None
    assert sorted(read.pending_writes or []) == [("task", INTERRUPT, "asked again"), ("task", "ch", "first")]


def test_list_is_newest_first_whatever_order_the_puts_came_in(registry: Registry) -> None:
    saver, thread_id = SessionforkSaver(registry), f"order-{uuid.uuid4()}"
    checkpoints = [generate_checkpoint() for _ in range(4)]          # ids ascending in creation order
    for checkpoint in [checkpoints[2], checkpoints[0], checkpoints[3], checkpoints[1]]:
        saver.put(generate_config(thread_id), checkpoint, generate_metadata(), {})
    listed = [t.checkpoint["id"] for t in SessionforkSaver(registry).list(generate_config(thread_id))]
    assert listed == [c["id"] for c in reversed(checkpoints)]


def test_prune_keeps_the_latest_checkpoint_with_its_writes_and_values(registry: Registry) -> None:
    saver, thread_id = SessionforkSaver(registry), f"prune-{uuid.uuid4()}"
    stored = put_steps(saver, thread_id, 4)
    before = saver.session_of(thread_id)
    saver.prune([thread_id])
    after = saver.session_of(thread_id)
    assert after is not None and after != before and not registry.exists(before or "")
    (kept,) = SessionforkSaver(registry).list(generate_config(thread_id))
    assert kept.config == stored[-1]
    assert kept.checkpoint["channel_values"] == {"step": "root/3"}
    assert kept.pending_writes == [("task-3", "note", "after 3")]
    assert kept.parent_config is None                                # its parent is gone


def test_a_put_landing_during_a_prune_is_kept(registry: Registry) -> None:
    saver, writer, thread_id = SessionforkSaver(registry), SessionforkSaver(registry), f"race-{uuid.uuid4()}"
    stored = put_steps(saver, thread_id, 3)
    old = saver.session_of(thread_id)
    late = generate_checkpoint(channel_values={"step": 99}, channel_versions={"step": 99})
    compact = saver._compacted
    landed: list[int] = []

    def write_then_compact(*args: Any) -> Any:
        # the prune has read the old session; a writer that knows only the old one puts meanwhile
        writer.put(stored[-1], late, generate_metadata(step=3), {"step": 99})
        landed.append(registry.length(old or ""))
        return compact(*args)

    saver._compacted = write_then_compact  # type: ignore[method-assign]
    saver.prune([thread_id])
    assert landed == [7]           # 3 puts and their 3 writes, then the late put: in the old session
    assert saver.session_of(thread_id) != old and not registry.exists(old or "")
    listed = list(SessionforkSaver(registry).list(generate_config(thread_id)))
    assert [t.checkpoint["id"] for t in listed] == [late["id"], stored[-1]["configurable"]["checkpoint_id"]]
    assert listed[0].checkpoint["channel_values"] == {"step": 99}


def test_the_first_puts_of_one_thread_from_many_savers_share_one_session(registry: Registry) -> None:
    savers, thread_id = [SessionforkSaver(registry) for _ in range(4)], f"first-{uuid.uuid4()}"
    together, created, create = threading.Barrier(len(savers)), [], registry.create

    def create_together(*args: Any, **kwargs: Any) -> Any:
        together.wait(timeout=30)                                   # every saver creates before any names it
        handle = create(*args, **kwargs)
        created.append(handle.id)
        return handle

    registry.create = create_together  # type: ignore[method-assign]
    checkpoints = [generate_checkpoint() for _ in savers]
    with ThreadPoolExecutor(len(savers)) as pool:
        list(pool.map(lambda i: savers[i].put(generate_config(thread_id), checkpoints[i], generate_metadata(), {}),
                      range(len(savers))))
    assert len(created) == len(savers)                              # the race happened: four sessions made
    sid = savers[0].session_of(thread_id)
    assert [c for c in created if registry.exists(c)] == [sid]      # one names the thread, the others deleted
    listed = [t.checkpoint["id"] for t in SessionforkSaver(registry).list(generate_config(thread_id))]
    assert sorted(listed) == sorted(c["id"] for c in checkpoints)


def test_delete_for_runs_removes_only_those_runs_in_every_thread_copies_included(registry: Registry) -> None:
    saver = SessionforkSaver(registry)
    first, second, copy = (f"{n}-{uuid.uuid4()}" for n in ("first", "second", "copy"))
    doomed, kept = f"run-{uuid.uuid4()}", f"run-{uuid.uuid4()}"
    for thread_id in (first, second):
        saver.put(generate_config(thread_id), generate_checkpoint(), generate_metadata(run_id=doomed), {})
        saver.put(generate_config(thread_id), generate_checkpoint(), generate_metadata(run_id=kept), {})
    saver.copy_thread(first, copy)
    saver.delete_for_runs([doomed])
    reader = SessionforkSaver(registry)
    for thread_id in (first, second, copy):
        assert [t.metadata["run_id"] for t in reader.list(generate_config(thread_id))] == [kept]


def test_bad_input_is_a_typed_error_and_writes_nothing(registry: Registry) -> None:
    saver, thread_id = SessionforkSaver(registry), f"bad-{uuid.uuid4()}"
    put_steps(saver, thread_id, 2)
    length = registry.length(saver.session_of(thread_id) or "")
    with pytest.raises(ForkError) as raised:
        saver.prune([thread_id], strategy="keep_some")
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(ForkError) as raised:
        saver.prune(thread_id)
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    other = f"other-{uuid.uuid4()}"
    put_steps(saver, other, 1)
    with pytest.raises(ForkError) as raised:
        saver.copy_thread(thread_id, other)
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    assert "has checkpoints already" in raised.value.message
    assert registry.length(saver.session_of(thread_id) or "") == length
    assert len(list(saver.list(generate_config(other)))) == 1


def test_a_put_over_the_event_size_limit_is_a_typed_error_and_stores_no_checkpoint(redis: Redis) -> None:
    saver, thread_id = SessionforkSaver(Registry(redis, max_event_bytes=4096)), f"big-{uuid.uuid4()}"
    small = saver.put(generate_config(thread_id), generate_checkpoint(), generate_metadata(step=0), {})
    big = generate_checkpoint(channel_values={"text": "x" * 8192}, channel_versions={"text": 1})
    with pytest.raises(ForkError) as raised:
        saver.put(small, big, generate_metadata(step=1), {"text": 1})
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    assert [t.config for t in SessionforkSaver(Registry(redis)).list(generate_config(thread_id))] == [small]
