"""``SessionforkSaver`` against LangGraph's own checkpointer contract (``langgraph-checkpoint-
conformance``, every capability, base and extended) on a single server and on a Cluster, then a
real ``StateGraph`` over it: interrupted, resumed and time-travelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from cluster_fixtures import (  # noqa: F401  (fixtures: registered under their ``name=``)
    assert_no_crossslot,
    cluster_client_fixture,
    cluster_fixture,
    cluster_registry_fixture,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, Capability
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
from langgraph.checkpoint.conformance.report import CapabilityReport

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
