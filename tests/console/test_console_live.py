"""The console's live view in a real browser: an outcome is on the page within a second of its fork,
and with a live tab open a hung Redis is an error banner there while every other page answers
within its bound (serial: time bounds; the fixtures are ``console_fixtures``'s, and ``bare``: a
server of its own with nothing on it); and an empty deployment's pages."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from console_fixtures import Deployment, fork, free_port, shot, up
from helpers import clean_environ, cli_args, stop
from playwright.sync_api import Browser, Page, expect
from waits import wait_until

from sessionfork.embedded import EmbeddedServer

pytestmark = pytest.mark.serial  # asserts a time bound


def test_a_live_outcome_appears_within_a_second_of_the_fork(deployment: Deployment, page: Page) -> None:
    page.goto(deployment.url)
    page.wait_for_selector("body[data-live=on]")  # the event stream is open

    reply = fork(deployment, "root", "root-live")
    forked = time.monotonic()
    row = page.wait_for_selector(f'#live tbody tr[data-request="{reply.request_id}"]', timeout=1000)

    assert time.monotonic() - forked < 1.0
    assert row is not None and "root-live" in row.inner_text()
    shot(page, "outcomes")


@pytest.fixture
def bare() -> Iterator[tuple[EmbeddedServer, str]]:
    """A server of its own with nothing on it and the console (the CLI command) reading it, each
    read bounded at ``BOUND`` seconds; no worker."""
    with EmbeddedServer() as server:
        port = free_port()
        console = subprocess.Popen(cli_args(server.url, "console", "--port", str(port), "--bound", str(BOUND)),
                                   env=clean_environ(), stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: console.poll() is not None or up(url), 30, "the console to answer")
            assert console.poll() is None, "the console exited"
            yield server, url
        finally:
            assert server.process is not None
            server.process.send_signal(signal.SIGCONT)
            assert stop(console) == 0


BOUND = 1.0


def test_with_a_live_tab_open_a_hung_redis_is_a_banner_and_every_other_page_answers_in_time(
        bare: tuple[EmbeddedServer, str], browser: Browser) -> None:
    server, url = bare
    assert server.process is not None
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    live, other = context.new_page(), context.new_page()
    live.goto(url)
    live.wait_for_selector("body[data-live=on]")

    server.process.send_signal(signal.SIGSTOP)  # hung: accepts connections, never answers
    try:
        expect(live.locator("#fault")).to_be_visible(timeout=(4 * BOUND + 2) * 1000)
        answers = {}
        for path in ("/", "/search?q=a", "/workers"):
            started = time.monotonic()
            response = other.goto(url + path)
            answers[path] = (response.status if response else 0, time.monotonic() - started)
            assert "Redis unreachable or failing" in other.locator("#fault").inner_text()
        shot(live, "outcomes-redis-hung")
    finally:
        server.process.send_signal(signal.SIGCONT)
    expect(live.locator("#fault")).to_be_hidden(timeout=(4 * BOUND + 2) * 1000)
    context.close()

    assert {path: status for path, (status, _) in answers.items()} == dict.fromkeys(answers, 503)
    assert max(took for _, took in answers.values()) < 2 * BOUND + 1, answers


def test_every_page_of_an_empty_deployment_says_so(bare: tuple[EmbeddedServer, str], page: Page) -> None:
    _, url = bare

    page.goto(url)
    assert page.locator("#stats tbody").inner_text() == "no outcome in this window"
    assert page.inner_text("#total") == "0" and page.inner_text("#error-share") == "0.0"
    assert page.locator("#chart rect.bar").count() == 60
    assert page.locator("#live tbody tr").count() == 0
    page.goto(f"{url}/workers")
    assert page.locator("#shard-0 table.workers tbody").inner_text() == "no registered worker"
    assert "none" in page.locator("#shard-0 h3").inner_text()
    assert page.locator("#audit tbody").inner_text() == "no action yet"
    response = page.goto(f"{url}/search?q=anything")
    assert response is not None and response.status == 404
