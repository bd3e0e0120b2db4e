"""The documentation speaks of the product: every page of docs/, the README and the CHANGELOG state
what sessionfork does and what it measured, never the history of how it was built (an issue number,
"the ninth stop" of a piece of work). The Performance page reads as a page: at most 450 lines, no
sentence of its prose over 40 words.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
PERFORMANCE = DOCS / "performance.md"
MOST_LINES = 450
MOST_WORDS = 40

ORDINAL = r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\d+(?:st|nd|rd|th)"
HISTORY = re.compile("|".join([
    r"\bissues?\s+#?\d+",                       # "issue 31", "issues 28 and 29"
    r"\b(?:PR|pull request)\s*#?\d+",           # "PR #12"
    r"(?<![\w&/])#\d+\b",                       # "(28 #3)", "#45" (an anchor "#fan-out" or "&#39;" is not one)
    rf"\b(?:{ORDINAL}|this|that|previous|next|last)\s+stop\b",   # "the ninth stop", "this stop's changes"
    r"\bstops?\s+\d+\b",                        # "stop 9"
]), re.I)
"""A mention of how the product was built: an issue or pull-request number, or a "stop" of the work
(a step of it, as in "this stop" or "the ninth stop"); a worker's warm stop, "stops the worker" or
"the stop flag" are the product's and do not match."""


def history(text: str) -> list[str]:
    """Each line of ``text`` that tells how the product was built (``HISTORY``)."""
    return [line.strip() for line in text.splitlines() if HISTORY.search(line)]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_page_tells_no_history_of_how_it_was_built(path: Path) -> None:
    assert history(path.read_text()) == []


def test_the_history_check_finds_issue_numbers_and_stops_but_not_a_workers_stop() -> None:
    for told in ["Measured after issue 31's ninth stop.", "Branches that end (issue 28 #3):",
                 "as this stop's changes did", "(issues 27 and 29)", "since the 7th stop", "see #45", "PR #12",
                 "in stop 9"]:
        assert history(told) == [told], told
    for product in ["0 after a warm stop (SIGTERM)", "SIGTERM stops the worker", "the stop flag, start-up",
                    "then stop what it started", "it stops within a second", "a stop never strands a job",
                    "[batches](performance.md#batches)", "&#39;quoted&#39;", "stop the producers;",
                    "the workers take no new job until it stops"]:
        assert history(product) == [], product


def prose(text: str) -> list[str]:
    """The paragraphs and list items of a Markdown page, each as one line: no table, code block,
    HTML comment, heading or picture."""
    text = re.sub(r"<!--.*?-->", "\n", text, flags=re.S)
    text = re.sub(r"^\s*```.*?^\s*```", "\n", text, flags=re.S | re.M)
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "#", "![", "<")):
            current = []
            continue
        if re.match(r"(?:[-*+]|\d+\.)\s", stripped) or not current:
            current = [re.sub(r"^(?:[-*+]|\d+\.)\s+", "", stripped)]
            blocks.append(current)
        else:
            current.append(stripped)
    return [" ".join(block) for block in blocks]


def sentences(paragraph: str) -> list[str]:
    """``paragraph``'s sentences: split after a ``.``, ``!`` or ``?`` (and the ``**`` or quote that
    closes it) that a space and anything but a lower-case letter follow; a link counts as its text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", paragraph)
    return [s for s in re.split(r"(?<=[.!?])(?:\*\*|[*_)`'\"])?\s+(?=[^a-z])", text) if s.strip()]


def words(sentence: str) -> int:
    """The words of ``sentence``: its space-separated tokens holding a letter or a digit."""
    return sum(1 for token in sentence.split() if re.search(r"\w", token))


def test_the_performance_page_is_at_most_450_lines() -> None:
    assert len(PERFORMANCE.read_text().splitlines()) <= MOST_LINES


def test_no_sentence_of_the_performance_page_is_over_40_words() -> None:
    long = [s for p in prose(PERFORMANCE.read_text()) for s in sentences(p) if words(s) > MOST_WORDS]
    assert long == []


def test_the_sentence_count_reads_prose_only() -> None:
    page = "\n".join([
        "# A heading of many words " + "word " * 50,
        "",
        "First sentence here. Second one, with [a link](x.md#y) in it; still the second.",
        "It goes on over a line.",
        "",
        "| a table | " + "cell " * 50 + "|",
        "```python",
        "code " * 50,
        "```",
        "<!-- " + "comment " * 50 + "-->",
        "- an item: e.g. `this` here. **Bold end.** Then more",
        "- another",
    ])
    found = [s for p in prose(page) for s in sentences(p)]
    assert found == ["First sentence here.", "Second one, with a link in it; still the second.",
                     "It goes on over a line.", "an item: e.g.", "`this` here.", "**Bold end.", "Then more",
                     "another"]
    assert [words(s) for s in found] == [3, 10, 6, 3, 2, 2, 2, 1]
    assert words("p50 \u2192 2.8 ms \u2014 1.2\u00d7") == 4


def shipped_alerts() -> dict[str, dict[str, Any]]:
    """Each alert rule of deploy/prometheus/rules/, by its name."""
    import yaml

    return {rule["alert"]: rule for path in sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
            for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"] if "alert" in rule}


def test_the_first_week_page_says_what_each_shipped_alert_means_and_what_to_do() -> None:
    """Each alert of the shipped rules has its section (``### `Name` ``, anchor ``#name``, where a
    runbook link can point), saying its severity and ``for``, what it means and what to do; the page
    names no alert that is not shipped, and Operating links it."""
    page = (DOCS / "first-week.md").read_text()
    sections = dict(re.findall(r"^### `(\w+)`\n(.*?)(?=^#{1,3} |\Z)", page, flags=re.S | re.M))
    rules = shipped_alerts()
    assert rules and sorted(sections) == sorted(rules)
    units = {"m": "minute", "h": "hour", "s": "second"}
    for name, text in sections.items():
        severity, wait = rules[name]["labels"]["severity"], rules[name]["for"]
        amount, unit = int(wait[:-1]), units[wait[-1]]
        plural = "s" if amount > 1 else ""
        assert text.lstrip().startswith(f"**{severity.capitalize()}, after {amount} {unit}{plural}.**"), name
        assert "What to do" in text, name
    assert "](first-week.md" in (DOCS / "operating.md").read_text()
