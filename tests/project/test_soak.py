"""The soak run (``bench.soak``): 4 worker processes, 2 schedulers and 2 appenders for 4 s on
their own server; each test checks one property of the one run's report."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bench.soak import SoakReport, run_soak

from sessionfork.embedded import EmbeddedServer

SECONDS = 4.0
WORKERS = 4

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report() -> Iterator[SoakReport]:
    with EmbeddedServer() as server:
        result = run_soak(server.url, seconds=SECONDS, workers=WORKERS, schedulers=2, appenders=2)
    print(f"\n{result.render()}")
    yield result


def test_soak_submits_requests_and_creates_children(report: SoakReport) -> None:
    assert report.requests > 0
    assert report.outcomes_by_code.get("OK", 0) > 0
    assert report.children >= report.outcomes_by_code["OK"]


def test_soak_loses_no_request(report: SoakReport) -> None:
    assert report.lost == 0


def test_soak_answers_no_request_twice(report: SoakReport) -> None:
    assert report.duplicates == 0


def test_soak_outcome_counts_per_code_add_up_to_the_requests(report: SoakReport) -> None:
    assert sum(report.outcomes_by_code.values()) == report.requests
    assert set(report.outcomes_by_code) <= {"OK", "OPEN_TURN"}, report.outcomes_by_code


def test_soak_children_are_turn_boundary_prefixes_of_their_parents(report: SoakReport) -> None:
    assert report.bad_seeds == 0


def test_soak_memory_per_child_stays_flat(report: SoakReport) -> None:
    assert report.bytes_per_child_first_half > 0
    assert report.bytes_per_child_second_half <= 1.5 * report.bytes_per_child_first_half + 200


def test_soak_workers_exit_0_on_sigterm(report: SoakReport) -> None:
    assert report.worker_exit_codes == [0] * WORKERS


def test_soak_report_renders_every_figure(report: SoakReport) -> None:
    text = report.render()
    for label in ("requests", "children", "duplicates", "lost", "bad seeds", "bytes/child, 1st half",
                  "deleted by hand", "swept by retention",
                  "bytes/child, 2nd half", "worker exit codes", *report.outcomes_by_code):
        assert label in text, label
    assert report.clean
    assert text.endswith("clean")


def test_soak_deletes_and_sweeps_while_forking(report: SoakReport) -> None:
    # Half the children are reaped (a grandchild forked first), half of those deleted by hand, the
    # rest disposed and deleted by the workers' retention sweep; bad_seeds covers the grandchildren.
    assert report.deleted > 0 and report.swept > 0
    assert report.bad_seeds == 0 and report.lost == 0 and report.duplicates == 0
