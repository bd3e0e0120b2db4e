"""The shipped Prometheus files, checked by Debian's ``promtool``: the rules are valid,
their unit tests (deploy/prometheus/tests/) pass with the shipped ``for`` durations, every alert has
a unit test that makes it fire and one that keeps it quiet, and the compose deployments' Prometheus
configs are valid with the rules they load."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus import DASHBOARD, ROOT, RULE_TESTS, RULES, shipped_rules, tool, with_for

CONFIGS = sorted((ROOT / "deploy" / "prometheus").glob("prometheus*.yml"))


def promtool(*args: str | Path) -> str:
    done = subprocess.run([tool("promtool"), *map(str, args)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def alerts() -> set[str]:
    return {rule["alert"] for group in shipped_rules()["groups"] for rule in group["rules"] if "alert" in rule}


def test_the_rules_are_valid() -> None:
    assert f"SUCCESS: {sum(len(g['rules']) for g in shipped_rules()['groups'])} rules found" in promtool(
        "check", "rules", RULES)


def test_the_alerts_are_the_six_operators_asked_for() -> None:
    assert alerts() == {"SessionforkQueueDepthGrowing", "SessionforkInternalErrors", "SessionforkLatencyHigh",
                        "SessionforkNoLiveWorker", "SessionforkWorkersSaturated", "SessionforkQueuePausedTooLong"}


def test_internal_errors_and_time_outs_page_and_expected_refusals_do_not() -> None:
    """Critical (a page): INTERNAL outcomes, answers too late for the schedulers' waits, no worker.
    Every other alert is a warning, and no alert reads the refusals (a dashboard panel)."""
    rules = [rule for group in shipped_rules()["groups"] for rule in group["rules"] if "alert" in rule]
    paging = {rule["alert"] for rule in rules if rule["labels"]["severity"] == "critical"}
    assert paging == {"SessionforkInternalErrors", "SessionforkLatencyHigh", "SessionforkNoLiveWorker"}
    assert {rule["labels"]["severity"] for rule in rules} == {"critical", "warning"}
    assert [rule["alert"] for rule in rules if "refusals" in rule["expr"] or "fork_errors" in rule["expr"]] == []
    assert any("code=\"INTERNAL\"" in rule.get("expr", "") for group in shipped_rules()["groups"]
               for rule in group["rules"] if rule.get("record") == "sessionfork:internal_errors:rate5m")


def anchors(page: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings (Python-Markdown's ``toc`` slugs)."""
    from markdown.extensions.toc import slugify

    return {slugify(line.lstrip("#").strip(), "-") for line in page.read_text().splitlines()
            if line.startswith("#") and not line.startswith("#!")}


def test_every_alert_links_its_runbook_a_docs_section_that_exists() -> None:
    rules = [rule for group in shipped_rules()["groups"] for rule in group["rules"] if "alert" in rule]
    for rule in rules:
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page.startswith("docs/") and (ROOT / page).is_file(), rule["alert"]
        assert anchor == rule["alert"].lower() and anchor in anchors(ROOT / page), rule["alert"]


@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda p: p.name)
def test_the_rules_unit_tests_pass(path: Path) -> None:
    assert "SUCCESS" in promtool("test", "rules", path)


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_keeps_it_quiet() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        test_file = yaml.safe_load(path.read_text())
        assert [(path.parent / f).resolve() for f in test_file["rule_files"]] == [RULES]  # the shipped file itself
        for case in test_file["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fired == alerts() and quiet == alerts(), (alerts() - fired, alerts() - quiet)


def test_with_for_changes_only_the_alerts_for() -> None:
    fast = with_for(shipped_rules(), "0s")
    for shipped, changed in zip(shipped_rules()["groups"], fast["groups"], strict=True):
        for old, new in zip(shipped["rules"], changed["rules"], strict=True):
            assert {k: v for k, v in new.items() if k != "for"} == {k: v for k, v in old.items() if k != "for"}
            assert new.get("for") == ("0s" if "alert" in old else None)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_compose_prometheus_configs_are_valid_and_load_the_rules(path: Path) -> None:
    out = promtool("check", "config", path)
    assert f"SUCCESS: {path} is valid" in out and "SUCCESS: 1 rule files found" in out, out
    config = yaml.safe_load(path.read_text())
    assert [job["job_name"] for job in config["scrape_configs"]] == ["sessionfork"]  # the rules read its `up`


def test_the_dashboard_filters_every_panel_by_its_shard_variable_and_shows_the_pauses() -> None:
    board = json.loads(DASHBOARD.read_text())
    (shard,) = [v for v in board["templating"]["list"] if v["name"] == "shard"]
    assert (shard["type"], shard["includeAll"], shard["multi"], shard["allValue"]) == ("query", True, True, ".*")
    targets = [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel["targets"]]
    assert [title for title, expr in targets if 'shard=~"$shard"' not in expr] == []
    assert any(expr.startswith("sessionfork:queue_paused:max") for _, expr in targets)
    assert any("sessionfork:refusals:ratio_rate5m" in expr for _, expr in targets)
