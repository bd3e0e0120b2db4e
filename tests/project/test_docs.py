"""The documentation is the contract: README.md and every docs/*.md page.

Every ``python`` block runs: a page's blocks in order, as one script, against a real server and a
real worker (``redis://localhost:6379/0`` replaced by the test's server). The pages run as a reader
follows them: the README, then the site's pages in navigation order, all on ONE server and database,
and the whole round twice, so no page depends on a database of its own or on running once (session
ids are never reused: the examples take new ones). A line ``print(...)  # text`` promises that
``text`` is printed (``…`` standing for any text, such as a generated id). The ``sessionfork`` lines
of the Getting started page's ``sh`` blocks run too (all but ``worker``, which the test runs
itself), in a shell, with the ``SOURCE=…`` line its Python example printed. The CLI table, the
settings table and the error codes match the code (tests/project/test_docs_api.py type-checks the
examples).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import run
from click.testing import CliRunner
from redis import Redis
from waits import wait_until

from sessionfork.cli import cli
from sessionfork.core import config
from sessionfork.core.config import Settings
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.jobs import fresh_workers

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
PLACEHOLDER = "redis://localhost:6379/0"


def page(name: str) -> str:
    return (DOCS / name).read_text()


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def promised_output(script: str) -> list[str]:
    return re.findall(r"^\s*print\(.*\)\s+# (.+?)\s*$", script, flags=re.M)


def printed(expected: str, out: str) -> bool:
    """Whether ``out`` holds the promised ``expected``, each ``…`` in it matching any text on one line."""
    pattern = "[^\n]+?".join(re.escape(part) for part in expected.split("\u2026"))
    return re.search(pattern, out) is not None


def sh_commands(text: str) -> list[str]:
    blocks = re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)
    return [line.split("#")[0].rstrip(" &") for block in blocks for line in block.splitlines()
            if line.startswith("sessionfork ")]


def reading_order() -> list[Path]:
    """The README, then the site's pages in the order of its navigation (``mkdocs.yml``)."""
    nav = re.findall(r"^\s*- (?:[^:\n]+: )?([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    return [ROOT / "README.md", *(DOCS / name for name in nav)]


EXAMPLE_PAGES = [p for p in reading_order() if python_blocks(p.read_text())]


def test_the_pages_with_examples_are_found_in_reading_order() -> None:
    names = [p.relative_to(ROOT).as_posix() for p in EXAMPLE_PAGES]
    assert names[:4] == ["README.md", "docs/getting-started.md", "docs/agent-hosts.md", "docs/schedulers.md"]
    assert {p.relative_to(ROOT).as_posix() for p in PAGES if python_blocks(p.read_text())} == set(names)


def test_a_promise_with_an_ellipsis_matches_any_text_on_its_line() -> None:
    assert printed('session "session-…" has 2 events', 'x session "session-1f0c.a" has 2 events\n')
    assert not printed('session "session-…" has 2 events', 'session "session-" has 2 events')
    assert not printed("True 2", "True 3")


def run_worker(url: str, name: str) -> subprocess.Popen[bytes]:
    """A worker process, once it has registered (so a SIGTERM finds its handler installed)."""
    worker = subprocess.Popen([sys.executable, "-m", "sessionfork", "--redis-url", url, "worker",
                               "--name", name, "--log-level", "WARNING"])
    with Redis.from_url(url, socket_timeout=5) as conn:
        wait_until(lambda: worker.poll() is not None or name in fresh_workers(conn, Settings()), 60,
                   "the worker registered")
    assert worker.poll() is None, "the worker exited"
    return worker


def run_page(path: Path, url: str) -> str:
    """Run ``path``'s Python examples against ``url`` (and Getting started's CLI lines after them);
    their output."""
    text = path.read_text()
    script = "\n".join(python_blocks(text))
    assert PLACEHOLDER in script, f"{path.name}: its examples name no server"
    script = script.replace(PLACEHOLDER, url) + "\nprint('examples ok')\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (path.name, out.stderr)
    for expected in promised_output(script):
        assert printed(expected, out.stdout), (path.name, expected, out.stdout)
    assert out.stdout.rstrip().endswith("examples ok")
    if path.name == "getting-started.md":
        commands = sh_commands(text)
        assert len(commands) == 4 and commands[0].split()[-3:] == ["worker", "--name", "w1"]
        source = re.findall(r"^SOURCE=(\S+)$", out.stdout, flags=re.M)
        assert len(source) == 1 and "SOURCE=session-\u2026 " in text, out.stdout
        env = {**os.environ, "SOURCE": source[0],
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        for line in commands[1:]:
            run = subprocess.run(["bash", "-c", line.replace(PLACEHOLDER, url)], capture_output=True, text=True,
                                 timeout=60, env=env)
            assert run.returncode == 0, (line, run.stdout, run.stderr)
            assert run.stdout.strip(), line
    return out.stdout


def test_the_pages_run_in_order_on_one_server_twice(server: EmbeddedServer) -> None:
    """README, Getting started, Agent hosts, Schedulers, ... as a reader follows them, on one
    database, then all again: no page needs a server of its own, none can run only once."""
    db = 1
    url = server.url.rsplit("/", 1)[0] + f"/{db}"
    with server.client() as setup:
        setup.execute_command("SELECT", db)
        setup.flushdb()
    worker = run_worker(url, "docs")
    try:
        for _ in range(2):
            for path in EXAMPLE_PAGES:
                run_page(path, url)
    finally:
        worker.terminate()
        assert worker.wait(30) == 0


def test_the_promised_messages_are_checked() -> None:
    """The error messages the agent-host examples print are part of what the run checks."""
    promised = promised_output("\n".join(python_blocks(page("agent-hosts.md"))))
    assert 'cannot fork session "session-\u2026" inside an open turn (last event: tool/call)' in promised
    assert 'cannot fork session "session-\u2026" at boundary 4: inside the turn opened at seq 3' in promised


def test_every_command_in_the_cli_table_exists() -> None:
    table = page("cli.md")
    documented = set(re.findall(r"^\| `([a-z-]+)", table, flags=re.M))
    listed = CliRunner().invoke(cli, ["--help"]).output
    commands = set(re.findall(r"^  ([a-z-]+) ", listed[listed.index("Commands:"):], flags=re.M))
    assert documented == commands


def test_every_setting_is_documented_with_its_default() -> None:
    table = page("configuration.md")
    documented = set(re.findall(r"^\| `([A-Z_]+)`", table, flags=re.M))
    assert documented == set(config.ENV.values())
    defaults = config.Settings()
    for field, var in config.ENV.items():
        value = getattr(defaults, field)
        if isinstance(value, int) and not isinstance(value, bool):
            assert re.search(rf"^\| `{var}` \| {value} \|", table, flags=re.M), var
    for field, (low, high) in config.BOUNDS.items():  # the range column states the checked bounds
        shown = "\u2013".join(str(int(b)) if float(b).is_integer() else str(b) for b in (low, high))
        assert re.search(rf"^\| `{config.ENV[field]}` \| [^|]+ \| {shown} \|", table, flags=re.M), field


def test_every_error_code_is_documented() -> None:
    from sessionfork import ErrorCode

    codes = page("wire-format.md")
    for code in ErrorCode:
        assert f"| `{code.value}` |" in codes


PUBLIC_MODULES = ["sessionfork", "sessionfork.client", "sessionfork.aio", "sessionfork.embedded",
                  "sessionfork.integrations.langgraph"]


def test_the_api_reference_documents_the_public_names_and_nothing_else() -> None:
    """Each name of a public module's ``__all__`` is in the reference once (a name several modules
    export, such as ``ForkResult``, under the first of them), and the reference names nothing else."""
    import importlib

    reference = page("reference.md")
    documented = re.findall(r"^::: (\S+)$", reference, flags=re.M)
    expected: list[str] = []
    seen: set[int] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) not in seen:
                seen.add(id(obj))
                expected.append(f"{module_name}.{name}")
    assert sorted(documented) == sorted(expected)


REGISTRY_SURFACE = {"create", "append", "events", "header", "length", "last_turn_end", "instance", "exists",
                    "children", "state_of", "dispose", "flush", "delete"}
"""What an agent host calls on a ``Registry``: the reference shows these members and no other (the
fork steps, ``resolve``, ``ask_flush``... are the library's own)."""


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for p in DOCS.glob("*.md"):
        assert f": {p.name}\n" in nav, p.name


def test_the_readme_is_a_front_page_linking_into_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "python3 run.py demo" in readme and "python3 run.py test" in readme
    linked = set(re.findall(r"\]\(docs/([a-z-]+\.md)\)", readme))
    assert linked == {p.name for p in DOCS.glob("*.md")}, "every page is linked from the README"
    assert "](lineage.png)" in page("lineage.md") and (DOCS / "lineage.png").exists()


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """The test command's docs build (``run.docs_build``), with this interpreter's mkdocs."""
    cmd = run.docs_build(Path(sys.executable).parent, site, config)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as the test command builds it (strictly), once for the tests that read it."""
    built = tmp_path_factory.mktemp("built") / "site"
    done = build(ROOT / "mkdocs.yml", built)
    assert done.returncode == 0, done.stderr
    return built


def test_the_site_builds_strictly_and_a_broken_link_anchor_or_reference_fails_it(site: Path, tmp_path: Path) -> None:
    reference = (site / "reference" / "index.html").read_text()
    assert reference.count('id="sessionfork.Registry"') == 1
    assert set(re.findall(r'id="sessionfork\.Registry\.(\w+)"', reference)) == REGISTRY_SURFACE
    for name in ["ForkResult", "ForkResult.child", "ForkFailure", "Reply", "fork_many"]:
        assert f'id="sessionfork.{name}"' in reference, name
    assert 'id="sessionfork.embedded.EmbeddedServer"' in reference
    copy = tmp_path / "copy"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "src").symlink_to(ROOT / "src")
    guarantees = (copy / "docs" / "guarantees.md").read_text()
    index = (copy / "docs" / "index.md").read_text()
    reference = (copy / "docs" / "reference.md").read_text()
    # A broken link and a broken anchor in one build (both are reported after every page is made), then
    # a missing API reference (mkdocstrings stops the build at it): each named in the failed build.
    for broken, expected in [
        ({"guarantees.md": guarantees.replace("](storage.md)", "](storag.md)", 1),
          "index.md": index.replace("](guarantees.md)", "](guarantees.md#no-such-section)", 1)},
         ["storag.md", "no-such-section"]),
        ({"reference.md": reference.replace("::: sessionfork.fork\n", "::: sessionfork.forks_gone\n")},
         ["sessionfork.forks_gone"]),
    ]:
        for page_name, text in [("guarantees.md", guarantees), ("index.md", index), ("reference.md", reference)]:
            (copy / "docs" / page_name).write_text(broken.get(page_name, text))
        done = build(copy / "mkdocs.yml", tmp_path / "broken-site")
        assert done.returncode != 0 and all(e in done.stderr for e in expected), (expected, done.stderr[-2000:])


# -- the site reads offline: nothing from another host -------------------------------------------

MERMAID = DOCS / "assets" / "javascripts" / "mermaid-11.17.2.min.js"
MERMAID_SHA256 = "581ed7d74bd9048d0e3a91363927d72ef22942d7722546b27f7cc29e35390eb8"
"""npm's ``mermaid@11.17.2``, ``dist/mermaid.min.js`` as published (``npm pack mermaid@11.17.2``)."""
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//|@import\s+url\(\s*["']?(?:https?:)?//""", re.I)
"""A page or stylesheet asking the browser for another host: a script, a stylesheet, a font, a picture."""


def external_references(site: Path) -> list[str]:
    """Each reference to another host that a built page, or a stylesheet of the site, makes the browser
    load: ``<script src>``, ``<link href>`` (stylesheets, fonts, preconnects), ``<img src>``,
    ``<iframe src>``, ``@import`` (a plain ``<a href>`` to another site is a link, not a load)."""
    found = []
    for path in sorted(site.rglob("*.html")):
        for tag in re.findall(r"<(?:script|link|img|iframe|source)\b[^>]*>", path.read_text()):
            if EXTERNAL.search(tag):
                found.append(f"{path.relative_to(site)}: {tag}")
    for path in sorted(site.rglob("*.css")):
        found += [f"{path.relative_to(site)}: {m}" for m in re.findall(r"@import[^;]*", path.read_text())
                  if EXTERNAL.search(m)]
    return found


def test_no_page_of_the_site_loads_anything_from_another_host(site: Path) -> None:
    """Mermaid ships with the site (pinned, as npm published it) and the theme uses the system's fonts:
    no page asks a CDN or Google Fonts for a script, a stylesheet or a font."""
    import hashlib

    assert hashlib.sha256(MERMAID.read_bytes()).hexdigest() == MERMAID_SHA256
    assert external_references(site) == []
    for name in ["index", "guarantees", "sharding", "deployment", "wire-format"]:  # the pages with diagrams
        html = (site / ("index.html" if name == "index" else f"{name}/index.html")).read_text()
        assert re.search(r'<script src="[./]*assets/javascripts/mermaid-11\.17\.2\.min\.js"', html), name
    assert external_references_of('<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">')
    assert external_references_of('<script src="//unpkg.com/mermaid@11/dist/mermaid.min.js"></script>')
    assert not external_references_of('<a href="https://keepachangelog.com/">Keep a Changelog</a>')


def external_references_of(html: str) -> list[str]:
    """``external_references`` of one page holding ``html`` (the check's own check)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "index.html").write_text(html)
        return external_references(Path(folder))


def serve(site: Path) -> tuple[str, Callable[[], None]]:
    """``site`` served over HTTP on a free local port: its address and how to stop it."""
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()

    return f"http://127.0.0.1:{httpd.server_address[1]}/", stop


OVERLAPS = """() => {
  const hits = [];
  for (const nav of document.querySelectorAll('.md-typeset pre > .md-code__nav')) {
    const button = nav.getBoundingClientRect();
    const walker = document.createTreeWalker(nav.parentElement.querySelector('code'), NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (!node.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const r of range.getClientRects()) {
        if (r.width > 0 && r.left < button.right && r.right > button.left && r.top < button.bottom
            && r.bottom > button.top) hits.push(node.textContent.trim().slice(0, 60));
      }
    }
  }
  return hits;
}"""
"""The text of every code block that lies under its copy button, in the page as laid out."""
DRAWN = """() => !document.querySelector('pre.mermaid')
  && [...document.querySelectorAll('div.mermaid')].some(d => d.getBoundingClientRect().height > 50)"""
"""Whether material has swapped the page's Mermaid block for its drawn picture (which it does once
``mermaid`` is loaded: the block's ``pre`` goes, a ``div`` as tall as the picture stands in its place)."""
BUTTONS = "() => document.querySelectorAll('.md-code__nav').length > 0"


def test_the_diagrams_draw_with_every_other_host_blocked_and_the_copy_button_covers_no_code(site: Path) -> None:
    """In Chromium, with every request to another host refused: each page's Mermaid block is drawn
    (material swaps the block for the diagram's picture), nothing asks another host, and no code
    block's text, its end-of-line comments included, lies under its copy button, at 1,280 and 390 px."""
    from browser import chromium
    from playwright.sync_api import Route, sync_playwright

    base, stop = serve(site)
    asked: list[str] = []

    def only_local(route: Route) -> None:
        if route.request.url.startswith(base):
            route.continue_()
        else:
            asked.append(route.request.url)
            route.abort()

    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
            try:
                for width in (1280, 390):
                    context = browser.new_context(viewport={"width": width, "height": 900})
                    context.route("**/*", only_local)
                    page = context.new_page()
                    for name in ["", "guarantees/", "sharding/", "deployment/", "wire-format/"]:
                        page.goto(base + name)
                        wait_until(functools.partial(page.evaluate, DRAWN), 30,
                                   f"the diagram of /{name} drawn at {width} px", interval=0.1)
                    for name in ["getting-started/", "operating/", "sharding/", "any-language/"]:
                        page.goto(base + name)
                        wait_until(functools.partial(page.evaluate, BUTTONS), 30,
                                   f"/{name}'s copy buttons at {width} px", interval=0.1)
                        assert page.evaluate(OVERLAPS) == [], (name, width)
                    context.close()
            finally:
                browser.close()
    finally:
        stop()
    assert asked == []
