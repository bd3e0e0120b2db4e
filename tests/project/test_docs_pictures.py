"""Pictures where people look: Mermaid is enabled in the site (a ```mermaid block renders as a
diagram, not as code), and the pages people look at first carry their diagram: the moving parts (Home), a
fork's path (Guarantees), shards (Sharding), Sentinel (Deployment), a summary fork (Wire format). The
Performance page's charts are pinned with its tables in test_docs_bench.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import markdown
import pytest
from mkdocs.utils import yaml_load

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DIAGRAMS = {
    "index.md": ("flowchart", ["schedulers", "queue server", "workers", "session registry", "reply channel",
                               "outcome stream", "dashboards"]),
    "guarantees.md": ("sequenceDiagram", ["scheduler", "queue server", "worker", "registry", "source step",
                                          "child step", "record script"]),
    "sharding.md": ("flowchart", ["queue-0", "queue-1", "queue-2", "--shard 0", "registry"]),
    "deployment.md": ("flowchart", ["sentinel-1", "sentinel-2", "sentinel-3", "redis-replica", "primary"]),
    "wire-format.md": ("flowchart", ["summary child", "session/summary", "keepFrom", "renumbered"]),
    "development.md": ("sequenceDiagram", ["queue server", "RequestWorker", "RequestService", "begin", "end",
                                           "Started", "Finished", "send_many", "run_many"]),
}


def mermaid_blocks(text: str) -> list[str]:
    return re.findall(r"^```mermaid\n(.*?)^```", text, flags=re.S | re.M)


def site_html(page: str) -> str:
    """``page`` as the site renders it: the Markdown extensions and their settings of mkdocs.yml."""
    config = yaml_load((ROOT / "mkdocs.yml").read_text())
    names: list[str] = []
    settings: dict[str, object] = {}
    for item in config["markdown_extensions"]:
        name, conf = next(iter(item.items())) if isinstance(item, dict) else (item, {})
        names.append(name)
        settings[name] = conf
    return markdown.markdown((DOCS / page).read_text(), extensions=names, extension_configs=settings)


@pytest.mark.parametrize("page", DIAGRAMS)
def test_the_page_shows_its_diagram_as_a_mermaid_picture(page: str) -> None:
    kind, names = DIAGRAMS[page]
    (block,) = mermaid_blocks((DOCS / page).read_text())
    assert block.splitlines()[0].split()[0] == kind
    assert [name for name in names if name not in block] == []
    html = site_html(page)
    assert html.count('<pre class="mermaid"><code>') == 1, "the site renders the block as a diagram"
    assert "language-mermaid" not in html  # not highlighted as code


def test_a_diagram_never_holds_what_breaks_mermaid() -> None:
    """A ``;`` outside a quoted label ends a Mermaid statement (an entity such as ``&lt;`` aside), and
    ``end`` in lower case closes a subgraph: neither where Mermaid would read it so."""
    for page in DIAGRAMS:
        for block in mermaid_blocks((DOCS / page).read_text()):
            assert ";" not in re.sub(r'"[^"]*"', "", block), page
            labels = re.findall(r'"([^"]*)"', block)
            assert not [label for label in labels if re.search(r"\bend\b", label)], page
