"""``sessionfork console`` in a real browser (Playwright driving Debian's chromium) against a live
worker, each under its ACL user (``console_fixtures``): search by request and session id, the live
view's filter, pause and resume, the token, escaping, and no ACL denial. The live view's time bound
is test_console_live.py (serial)."""

from __future__ import annotations

import html
import subprocess
import time
import urllib.parse
from datetime import datetime

import pytest
from console_fixtures import HOSTILE, TOKEN, Deployment, answer, fork, shot, user_url
from helpers import clean_environ, cli_args, turn
from playwright.sync_api import Browser, Page, expect
from redis import Redis
from redis.exceptions import NoPermissionError
from waits import wait_until

from sessionfork.core.errors import ErrorCode
from sessionfork.core.wire import ForkFailure, ForkResult, NewEvent, SelectResult
from sessionfork.ops import acl, pauses


def test_a_request_page_shows_when_where_and_what_it_answered(deployment: Deployment, page: Page) -> None:
    before = time.time()
    reply = fork(deployment, "root", "root-a")
    after = time.time()

    page.goto(f"{deployment.url}/search?q={reply.request_id}")

    section = page.locator("#request")
    assert reply.request_id in section.locator("h2").inner_text()
    assert section.locator("h2 .pill.code").inner_text() == "OK"
    assert section.locator("h2 .pill.status-answered").inner_text() == "answered"
    shown = [section.locator(f"dd.{name}").inner_text() for name in ("enqueued", "started", "answered")]
    assert "-" not in shown, shown  # each time known
    times = [_utc(text) for text in shown]
    assert before - 0.01 <= times[0] <= times[1] <= times[2] <= after + 0.01, (before, times, after)
    assert section.locator("dd.worker").inner_text() == deployment.worker
    assert section.locator("dd.attempts").inner_text() == "1"
    assert section.locator("dd.op").inner_text() == "fork"
    run = float(section.locator("dd.run").inner_text().removesuffix(" ms"))
    assert 0 < run <= (times[2] - times[1]) * 1000 + 1
    asked = dict(zip(section.locator("table.asked th").all_inner_texts(),
                     section.locator("table.asked td").all_inner_texts(), strict=True))
    assert asked == {"source": '"root"', "sessionId": '"root-a"'}  # as the scheduler sent it
    assert "identity" not in section.inner_text().lower() and "digest" not in section.inner_text().lower()
    assert '"parentSession": "root"' in section.locator("details.reply pre").text_content()
    shot(page, "search-request")
    section.locator("dd.children").get_by_role("link", name="root-a").click()  # the child, one click away
    assert page.locator("#session h2").inner_text() == "Session root-a"


def test_a_failed_requests_page_shows_its_code_and_message(deployment: Deployment, page: Page) -> None:
    missing = deployment.client.fork("no-such-source", timeout=10)
    assert isinstance(missing, ForkFailure)

    page.goto(f"{deployment.url}/search?q={missing.request_id}")

    error = page.locator("#request p.error")
    expect(error.locator(".message")).to_have_text(missing.message)
    assert error.locator(".code").inner_text() == "SESSION_NOT_FOUND"
    assert page.locator("#request dd.children").inner_text() == "none"
    shot(page, "search-failed-request")
    page.locator("#request h2 a.code").click()  # the code: its outcomes, one click away
    assert urllib.parse.urlparse(page.url).query == "code=SESSION_NOT_FOUND"


def _utc(text: str) -> float:
    return datetime.fromisoformat(text + "+00:00").timestamp()


def test_search_finds_a_session_with_its_state_length_and_lineage(deployment: Deployment, page: Page) -> None:
    fork(deployment, "root", "root-b")
    fork(deployment, "root-b", "root-b-1")

    page.goto(f"{deployment.url}/search?q=root-b")

    section = page.locator("#session")
    assert section.locator("dd.state").inner_text() == "live"
    assert "4 events" in section.inner_text()
    assert '"parentSession": "root"' in section.locator("pre.json").inner_text()
    tree = section.locator("ul.tree li")
    assert [tree.nth(i).locator("a").inner_text() for i in range(tree.count())] == ["root", "root-b", "root-b-1"]
    shot(page, "search-session")
    section.get_by_role("link", name="root-b-1").click()  # a link per node
    assert page.locator("#session h2").inner_text() == "Session root-b-1"


def test_a_select_is_a_live_row_and_its_merge_edge_is_in_the_lineage(deployment: Deployment, page: Page) -> None:
    registry, client = deployment.registry, deployment.client
    registry.append(registry.create("sel", cwd="/work"), turn(1))
    fan = client.fork("sel", session_ids=["sel-a", "sel-b"], timeout=10)
    assert isinstance(fan, ForkResult) and fan.ok, fan
    for child in ("sel-a", "sel-b"):
        registry.append(child, [NewEvent("turn/start", {}), NewEvent("turn/end", {"reason": "completed"})])
    page.goto(deployment.url)
    page.wait_for_selector("body[data-live=on]")

    picked = client.select("sel", ["sel-a", "sel-b"], "sel-b", mode="events", timeout=10)
    assert isinstance(picked, SelectResult), picked
    row = page.wait_for_selector(f'#live tbody tr[data-request="{picked.request_id}"]')
    assert row is not None and "\tselect\tOK\tsel-b\t" in row.inner_text()

    page.goto(f"{deployment.url}/search?q=sel")
    lines = page.locator("#session ul.tree li").all_inner_texts()
    assert any(line.startswith("sel-a") and "abandoned" in line for line in lines), lines
    edge = f"merged into sel at seq {picked.from_seq}"
    assert any(line.startswith("sel-b") and edge in line for line in lines), lines
    shot(page, "search-merge")
    page.locator("#session li", has_text="sel-b").get_by_role("link", name="sel", exact=True).click()
    assert page.locator("#session h2").inner_text() == "Session sel"  # the merge edge is a link


def test_an_unknown_id_is_a_not_found_page(deployment: Deployment, page: Page) -> None:
    response = page.goto(f"{deployment.url}/search?q=nothing-here")

    assert response is not None and response.status == 404
    assert "No request and no session with id nothing-here" in page.locator("main").inner_text()


def test_the_live_view_filters_by_code(deployment: Deployment, page: Page) -> None:
    page.goto(f"{deployment.url}/?code=SESSION_NOT_FOUND")
    page.wait_for_selector("body[data-live=on]")

    ok = fork(deployment, "root", "root-filtered")
    missing = deployment.client.fork("no-such-session", session_id="never", timeout=10)
    assert isinstance(missing, ForkFailure) and missing.code == "SESSION_NOT_FOUND"
    page.wait_for_selector(f'#live tbody tr[data-request="{missing.request_id}"]')

    assert page.locator(f'#live tbody tr[data-request="{ok.request_id}"]').count() == 0


def test_the_outcomes_table_keeps_only_the_source_asked(deployment: Deployment, page: Page) -> None:
    registry = deployment.registry
    for source in ("src-a", "src-b"):
        registry.append(registry.create(source, cwd="/work"), turn(1))
    from_a = [fork(deployment, "src-a", f"src-a-{i}").request_id for i in range(2)]
    from_b = [fork(deployment, "src-b", f"src-b-{i}").request_id for i in range(2)]

    page.goto(f"{deployment.url}/?source=src-b")

    shown = page.locator("#live tbody tr").evaluate_all("rows => rows.map(r => r.dataset.request)")
    assert sorted(shown) == sorted(from_b), (shown, from_a)
    assert page.locator("form.filter input[name=source]").input_value() == "src-b"


def _stat(page: Page, code: str, column: str) -> str:
    cells = page.locator(f'#stats tr[data-code="{code}"] td.{column}')
    return cells.inner_text() if cells.count() else ""


def test_the_overview_counts_and_charts_each_outcome_live(deployment: Deployment, page: Page) -> None:
    page.goto(deployment.url)
    page.wait_for_selector("body[data-live=on]")
    page.evaluate("window.__loaded = true")  # gone if the page reloads
    total, errors = int(page.inner_text("#total")), int(page.inner_text("#errors"))
    ok = int(_stat(page, "OK", "count") or 0)
    missing = int(_stat(page, "SESSION_NOT_FOUND", "count") or 0)

    fork(deployment, "root", "root-counted")
    failed = deployment.client.fork("no-such-source", timeout=10)
    assert isinstance(failed, ForkFailure)
    expect(page.locator("#total")).to_have_text(str(total + 2))  # live: no reload

    assert page.evaluate("window.__loaded") is True
    assert int(_stat(page, "OK", "count")) == ok + 1
    assert int(_stat(page, "SESSION_NOT_FOUND", "count")) == missing + 1
    assert int(page.inner_text("#errors")) == errors + 1
    share = float(page.inner_text("#error-share"))
    assert abs(share - 100 * (errors + 1) / (total + 2)) < 0.06, share
    assert float(_stat(page, "OK", "rate")) == pytest.approx((ok + 1) / 300, abs=0.001)
    bars = page.locator("#chart rect.bar:not(.err)")
    assert bars.count() == 60
    assert sum(int(c) for c in bars.evaluate_all("bars => bars.map(b => b.dataset.count)")) == total + 2
    newest = bars.evaluate_all("bars => bars.slice(-2).map(b => Number(b.dataset.count))")
    assert sum(newest) >= 2, newest  # the newest bars hold them (the two may straddle a bar's edge)
    assert page.locator("#chart rect.bar.err").count() >= 1
    assert page.locator("#chart polyline.pct").count() == 1
    shot(page, "overview")


def test_the_filters_are_lists_and_errors_only_keeps_the_failures(deployment: Deployment, page: Page) -> None:
    page.goto(deployment.url)
    codes = page.locator("form.filter select[name=code] option").all_inner_texts()
    assert codes == ["any", "OK", *sorted(code.value for code in ErrorCode)]
    assert page.locator("form.filter select[name=op] option").all_inner_texts() == ["any", "fork", "merge", "select"]
    fork(deployment, "root", "root-before-errors")
    before = deployment.client.fork("no-such-source", timeout=10)
    assert isinstance(before, ForkFailure)
    page.check("form.filter input[name=errors]")
    with page.expect_navigation():
        page.click("form.filter button")
    page.wait_for_selector("body[data-live=on]")  # this page's stream is open
    assert "errors=1" in page.url

    served = page.locator("#live tbody td a.code").all_inner_texts()
    assert "SESSION_NOT_FOUND" in served and "OK" not in served
    ok = fork(deployment, "root", "root-errors-only")
    failed = deployment.client.fork("no-such-source", timeout=10)
    assert isinstance(failed, ForkFailure)
    page.wait_for_selector(f'#live tbody tr[data-request="{failed.request_id}"]')
    assert page.locator(f'#live tbody tr[data-request="{ok.request_id}"]').count() == 0
    expect(page.locator('#stats tr[data-code="OK"] td.count')).to_have_count(1)  # counted still


def test_a_code_is_a_link_to_its_outcomes(deployment: Deployment, page: Page) -> None:
    failed = deployment.client.fork("no-such-source", timeout=10)
    assert isinstance(failed, ForkFailure)
    page.goto(deployment.url)

    page.locator('#stats tr[data-code="SESSION_NOT_FOUND"] a.code').click()

    assert urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query).get("code") == ["SESSION_NOT_FOUND"]
    assert page.locator("form.filter select[name=code]").input_value() == "SESSION_NOT_FOUND"
    assert set(page.locator("#live tbody td a.code").all_inner_texts()) == {"SESSION_NOT_FOUND"}
    assert page.locator('#stats tr.picked').get_attribute("data-code") == "SESSION_NOT_FOUND"


@pytest.mark.parametrize("width", [390, 1280])
def test_every_page_fits_the_screens_width(deployment: Deployment, browser: Browser, width: int) -> None:
    reply = fork(deployment, "root", f"root-w{width}")
    failed = deployment.client.fork("no-such-source", timeout=10)
    assert isinstance(failed, ForkFailure)
    context = browser.new_context(viewport={"width": width, "height": 844})
    page = context.new_page()
    try:
        for name, path in (("outcomes", "/"), ("request", f"/search?q={reply.request_id}"),
                           ("failed-request", f"/search?q={failed.request_id}"), ("session", "/search?q=root"),
                           ("workers", "/workers")):
            page.goto(deployment.url + path)
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{name} at {width} px is {overflow} px too wide"
            shot(page, f"{name}-{width}")
    finally:
        context.close()


def test_pause_stops_the_shards_worker_and_resume_restarts_it(deployment: Deployment, page: Page) -> None:
    admin, client = deployment.admin, deployment.client
    page.goto(f"{deployment.url}/workers")
    page.fill("#shard-0 input[name=token]", TOKEN)
    page.fill("#shard-0 input[name=reason]", "deploy")
    page.click("#shard-0 button")

    assert page.locator("#shard-0 .pill").inner_text() == "paused"
    assert pauses.is_paused(admin)
    wait_until(lambda: admin.hget(f"rq:worker:{deployment.worker}", "state") == b"suspended", 10,
               "the worker to see the pause")
    request = client.request("root", session_id="root-paused")
    client.submit(request)
    queued_at = time.time()
    # The suspended worker polls the pause once a second, heart-beating each time: two beats after
    # the enqueue, it has looked twice and left the job queued.
    wait_until(lambda: _heartbeat(admin, deployment.worker) > queued_at + 1.0, 10, "two polls of the paused worker")
    assert admin.llen("rq:queue:sessionfork") == 1
    page.goto(f"{deployment.url}/workers")
    assert page.locator("#shard-0 .depth").inner_text() == "1"
    assert page.locator("#shard-0 td.state").inner_text() == "suspended"
    health = subprocess.run(cli_args(user_url(deployment.server, acl.WORKER), "health"), env=clean_environ(),
                            capture_output=True, text=True, timeout=30, check=False)
    assert "paused: queue 'sessionfork'" in health.stdout
    assert "deploy" in page.locator("#audit tbody tr").first.inner_text()
    shot(page, "workers-paused")

    page.fill("#shard-0 input[name=token]", TOKEN)
    page.click("#shard-0 button")

    assert page.locator("#shard-0 .pill").inner_text() == "running"
    reply = client.wait(request, 10)
    assert isinstance(reply, ForkResult) and reply.ok
    actions = [row.split("\t")[2] for row in page.locator("#audit tbody tr").all_inner_texts()[:2]]
    assert actions == ["resume", "pause"]


def test_the_workers_page_refreshes_its_state_queue_and_audit_in_place(deployment: Deployment, page: Page) -> None:
    admin, client = deployment.admin, deployment.client
    page.goto(f"{deployment.url}/workers")
    page.evaluate("window.__loaded = true")  # gone if the page reloads
    page.fill("#shard-0 input[name=token]", "typed, not sent")
    pauses.pause(admin, "tests", "refresh")  # from elsewhere: rq suspend, another console
    try:
        wait_until(lambda: admin.hget(f"rq:worker:{deployment.worker}", "state") == b"suspended", 10,
                   "the worker to see the pause")
        requests = [client.request("root", session_id=f"root-queued-{i}") for i in range(2)]
        for request in requests:
            client.submit(request)

        expect(page.locator("#shard-0 .pill")).to_have_text("paused", timeout=15_000)
        expect(page.locator("#shard-0 table.queued tbody tr")).to_have_count(2, timeout=15_000)
        queued = page.locator("#shard-0 table.queued tbody tr").evaluate_all("rows => rows.map(r => r.dataset.request)")
        assert queued == [r.request_id for r in requests]  # the next to run first
        assert all(age.endswith(" s") for age in page.locator("#shard-0 td.age").all_inner_texts())
        assert page.locator("#shard-0 .depth").inner_text() == "2"
        assert "refresh" in page.locator("#audit tbody tr").first.inner_text()
        shot(page, "workers-queued")
    finally:
        pauses.resume(admin, "tests", "refresh")
    for request in requests:
        assert isinstance(client.wait(request, 10), ForkResult)
    expect(page.locator("#shard-0 .pill")).to_have_text("running", timeout=15_000)
    expect(page.locator("#shard-0 table.queued")).to_have_count(0, timeout=15_000)

    assert page.evaluate("window.__loaded") is True
    assert page.input_value("#shard-0 input[name=token]") == "typed, not sent"


def test_the_workers_page_counts_what_each_worker_answered(deployment: Deployment, page: Page) -> None:
    page.goto(f"{deployment.url}/workers")
    cell = page.locator(f'#shard-0 tr[data-worker="{deployment.worker}"] td.answered')
    before = int(cell.inner_text())

    for i in range(3):
        fork(deployment, "root", f"root-counted-{i}")
    failed = deployment.client.fork("no-such-source", timeout=10)  # a refusal is answered too
    assert isinstance(failed, ForkFailure)
    page.goto(f"{deployment.url}/workers")

    assert int(cell.inner_text()) == before + 4


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _heartbeat(admin: Redis, worker: str) -> float:
    raw = admin.hget(f"rq:worker:{worker}", "last_heartbeat")
    return 0.0 if raw is None else datetime.fromisoformat(_text(raw).replace("Z", "+00:00")).timestamp()


def test_an_action_without_the_token_is_refused(deployment: Deployment, page: Page) -> None:
    page.goto(f"{deployment.url}/workers")
    with page.expect_response(lambda r: r.url.endswith("/shards/0/pause")) as sent:
        page.click("#shard-0 button")  # no token typed

    assert sent.value.status == 403
    assert "a valid console token is needed" in page.locator("main").inner_text()
    assert not pauses.is_paused(deployment.admin)
    assert answer(f"{deployment.url}/shards/0/pause", b"token=wrong")[0] == 403
    assert answer(f"{deployment.url}/shards/0/pause", b"", {"Authorization": "Bearer wrong"})[0] == 403
    assert not pauses.is_paused(deployment.admin)


def test_hostile_ids_and_event_data_render_escaped(deployment: Deployment, page: Page) -> None:
    registry = deployment.registry
    registry.append(registry.create("hostile", cwd=HOSTILE), turn(1))
    page.goto(deployment.url)
    page.wait_for_selector("body[data-live=on]")
    fork(deployment, "hostile", "hostile-child")
    refused = deployment.client.fork(HOSTILE, timeout=10)  # the message quotes the source given
    assert isinstance(refused, ForkFailure) and HOSTILE in refused.message

    row = page.wait_for_selector(f'#live tbody tr[data-request="{refused.request_id}"]')
    assert row is not None and HOSTILE in row.inner_text()  # shown as text
    page.goto(f"{deployment.url}/search?q=hostile-child")
    assert HOSTILE in page.locator("#session pre.json").inner_text()
    page.goto(f"{deployment.url}/search?q={urllib.parse.quote(HOSTILE)}")
    assert HOSTILE in page.locator("main").inner_text()
    page.goto(deployment.url)  # the server-side rows too

    assert page.locator("main img").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_every_page_escapes_hostile_ids_messages_reasons_and_event_data(deployment: Deployment, page: Page) -> None:
    registry, client, quoted = deployment.registry, deployment.client, urllib.parse.quote(HOSTILE)
    if not registry.exists("hostile-page"):
        registry.append(registry.create("hostile-page", cwd=HOSTILE), turn(1))  # event data
    made = fork(deployment, "hostile-page", "hostile-page-child")
    refused = client.fork(HOSTILE, timeout=10)  # an error message quoting it
    assert isinstance(refused, ForkFailure) and HOSTILE in refused.message
    for action in ("pause", "resume"):  # an audit reason
        assert answer(f"{deployment.url}/shards/0/{action}", f"token={TOKEN}&reason={quoted}".encode())[0] == 303
    pages = {"outcomes": "/", "outcomes of a failed code": f"/?code={refused.code}",
             "filter echoed": f"/?code={quoted}&op={quoted}&source={quoted}",
             "failed request": f"/search?q={refused.request_id}", "request": f"/search?q={made.request_id}",
             "session": "/search?q=hostile-page-child", "not found": f"/search?q={quoted}", "workers": "/workers"}

    raw = {name: answer(deployment.url + path)[1] for name, path in pages.items()}
    assert {name: HOSTILE in text for name, text in raw.items()} == dict.fromkeys(pages, False)
    assert {name: html.escape(HOSTILE, quote=False) in text for name, text in raw.items()} == dict.fromkeys(pages, True)
    for name, path in pages.items():  # and a browser makes no element of it
        page.goto(deployment.url + path)
        assert page.locator("img").count() == 0, name
    assert page.evaluate("window.__pwned") is None


def test_the_console_sends_nothing_its_acl_user_may_not(deployment: Deployment) -> None:
    denials = [entry for entry in deployment.admin.acl_log() if _text(entry["username"]) == acl.CONSOLE]

    assert denials == []
    console = Redis.from_url(user_url(deployment.server, acl.CONSOLE))
    try:
        for refused in (lambda: console.hset("sf:req:x", "outcome", "forged"), lambda: console.delete("rq:queue:x"),
                        lambda: console.eval("return 1", 0)):
            with pytest.raises(NoPermissionError):
                refused()
    finally:
        console.close()
