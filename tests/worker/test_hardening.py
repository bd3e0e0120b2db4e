"""Hostile job hashes, lost replies, transient outages and racing attempts never break a promise."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rq.job import Job
from waits import outcome_of, raised

from sessionfork import ErrorCode, ForkError, LiveHandle, NewEvent, Registry
from sessionfork.clients.client import Client
from sessionfork.clients.waiting import wait_for_reply
from sessionfork.core.config import Settings
from sessionfork.core.wire import ForkFailure, ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.rq_seam.entries import ForkJob
from sessionfork.worker.service import RequestService

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

TURN = [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})]


def service(redis: Redis, registry: Registry | None = None) -> RequestService:
    return RequestService(registry or Registry(redis), Outcomes(redis, ttl=600, stream_maxlen=1000),
                       reply_channel="sf:replies", limits=Limits(max_fanout=16))


def worker(redis: Redis, svc: RequestService, **kwargs: Any) -> RequestWorker:
    return RequestWorker([jobs.make_queue(redis, Settings())], service=svc, connection=redis, abandoned_after=30,
                      **kwargs)


@pytest.fixture
def hook_server() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/hook", hits
    httpd.shutdown()
    httpd.server_close()
    thread.join(10)


def test_webhooks_and_callbacks_in_a_job_hash_are_never_used(redis: Redis, hook_server: tuple[str, list[str]]) -> None:
    url, hits = hook_server
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    hooks = json.dumps([{"url": url, "job_status": "failed", "method": "POST", "headers": {}, "timeout": 5}])
    redis.hset("rq:job:evil", mapping={
        "data": json.dumps(["os.system", None, ["true"], {}]), "origin": "sessionfork", "status": "queued",
        "created_at": now, "enqueued_at": now, "timeout": "30", "webhooks": hooks,
        "failure_callback_name": "os.abort", "success_callback_name": "os.abort",
        "stopped_callback_name": "os.abort", "description": "x"})
    redis.rpush("rq:queue:sessionfork", "evil")
    # Callbacks: RQ would call them from its perform path; the worker loads jobs as ForkJob, which
    # drops their names, so no path can reach them (plain RQ would import os.abort here).
    loaded = ForkJob.fetch("evil", connection=redis, serializer=jobs.JSONSerializer)
    assert (loaded.success_callback, loaded.failure_callback, loaded.stopped_callback) == (None, None, None)
    assert loaded.webhooks == []
    assert Job.fetch("evil", connection=redis, serializer=jobs.JSONSerializer).failure_callback is os.abort
    # Webhooks: RQ sends them when a job fails, which is what the worker does with this one.
    worker(redis, service(redis)).work(burst=True, logging_level="ERROR")
    reply = wait_for_reply(redis, "evil", "sf:replies", 5)
    assert isinstance(reply, ForkFailure) and reply.code == "INVALID_REQUEST"
    assert redis.hget("rq:job:evil", "status") == b"failed"
    assert hits == []


def test_a_transient_outage_on_the_last_attempt_is_retried_not_reported(redis: Redis, registry: Registry,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    registry.append(registry.create("src"), TURN)
    svc = service(redis, registry)
    real = registry.forks.child_step
    calls = {"n": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RedisConnectionError("blip")
        return real(*args, **kwargs)

    monkeypatch.setattr(registry.forks, "child_step", flaky)
    payload = '{"source":"src","sessionId":"c1"}'
    with pytest.raises(RedisConnectionError):
        svc.handle(payload, "r1", final_attempt=True)
    assert svc.outcomes.get("r1") is None  # not INTERNAL: the worker backs off and runs it again
    assert svc.handle(payload, "r1", final_attempt=True).ok


def test_an_internal_outcome_names_the_children_created_before_the_failure(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    strict = Registry(redis, wait_replicas=1, wait_timeout_ms=10)  # no replica will ever acknowledge
    svc = service(redis, strict)
    redis.script_flush()  # and no script loaded: the calls that meet NOSCRIPT run before the WAIT is judged
    with pytest.raises(Exception, match="replica"):
        svc.handle('{"source":"src","sessionIds":["k1","k2"]}', "r1", final_attempt=True)
    reply = svc.outcomes.get("r1")
    assert isinstance(reply, ForkFailure) and reply.code == "INTERNAL"
    assert reply.message.endswith("created before the failure: k1, k2")


def test_two_attempts_of_one_fan_out_give_every_child_the_same_seed(redis: Redis, registry: Registry,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    registry.append(registry.create("src"), TURN)
    first, second = service(redis, registry), service(redis, registry)
    payload = '{"source":"src","sessionIds":["k1","k2"]}'
    remember = first.outcomes.keep_snapshots

    def racing(fan_outs: Any) -> Any:
        # The first attempt took its snapshot; before it stores it, the source moves on and a
        # second attempt of the same request creates one child, then dies.
        registry.append("src", TURN)
        step = registry.forks.child_step

        def dies(snap2: Any, spec: Any, ids: Any = None) -> Any:
            first = step(snap2, spec, list(ids or spec.child_ids)[:1])  # its first child made, then it dies
            registry.forks.children_of(first, registry.forks.run_children([first])[0])
            raise RuntimeError("second attempt dies")

        monkeypatch.setattr(registry.forks, "child_step", dies)
        with pytest.raises(RuntimeError):
            second.handle(payload, "fan-1", final_attempt=False)
        monkeypatch.setattr(registry.forks, "child_step", step)
        return remember(fan_outs)

    monkeypatch.setattr(first.outcomes, "keep_snapshots", racing)
    reply = first.handle(payload, "fan-1")
    assert isinstance(reply, ForkResult) and reply.sessions
    assert {h.seed_length for h in reply.sessions} == {4}


def test_a_count_fan_out_run_again_creates_the_children_its_first_attempt_planned(
        redis: Redis, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    # Generated ids: the second attempt's id factory would name other children; the claim hands it
    # the first attempt's, so the request ends with exactly its 3 children, the one made first among them.
    registry.append(registry.create("src"), TURN)
    first, second = service(redis, registry), service(redis, registry)
    names = iter(f"gen-{i}" for i in range(100))
    first._new_id = second._new_id = lambda: next(names)  # type: ignore[method-assign]
    step = registry.forks.child_step

    def dies(snap: Any, spec: Any, ids: Any = None) -> Any:
        first = step(snap, spec, list(ids or spec.child_ids)[:1])  # its first child made, then it dies
        registry.forks.children_of(first, registry.forks.run_children([first])[0])
        raise RuntimeError("first attempt dies after its first child")

    payload = '{"source":"src","count":3}'
    monkeypatch.setattr(registry.forks, "child_step", dies)
    assert isinstance(raised(lambda: first.handle(payload, "count-1", final_attempt=False)), RuntimeError)
    monkeypatch.setattr(registry.forks, "child_step", step)
    reply = second.handle(payload, "count-1")
    assert isinstance(reply, ForkResult) and reply.ok
    assert [h.id for h in reply.sessions or []] == ["gen-0", "gen-1", "gen-2"]
    assert sorted(registry.children("src")) == ["gen-0", "gen-1", "gen-2"]


def test_a_retried_append_is_never_doubled(redis: Redis) -> None:
    # The same call id is what a client's retry of one append sends.
    registry = Registry(redis, new_call_id=lambda: "same")
    handle = registry.create("s")
    first = registry.append(handle, [NewEvent("user/message", {"n": 1})])
    again = registry.append(handle, [NewEvent("user/message", {"n": 1})])
    assert [e.seq for e in first] == [e.seq for e in again] == [0]
    assert registry.length("s") == 1


def test_a_retried_create_is_recognised_as_its_own(redis: Redis) -> None:
    registry = Registry(redis, new_token=lambda: "same")
    first = registry.create("s")
    assert outcome_of(lambda: registry.create("s")) == first == LiveHandle("s", "same")
    other = raised(lambda: Registry(redis).create("s"))  # any other caller: SESSION_ALREADY_EXISTS
    assert isinstance(other, ForkError) and other.code is ErrorCode.SESSION_ALREADY_EXISTS, other


def test_a_fan_out_where_every_id_exists_is_an_error(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    registry.create("a")
    registry.create("b")
    reply = service(redis, registry).handle('{"source":"src","sessionIds":["a","b"]}', "r1")
    assert isinstance(reply, ForkFailure) and reply.code == "SESSION_ALREADY_EXISTS"


def test_a_live_handle_with_an_empty_instance_is_invalid(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    reply = service(redis, registry).handle('{"source":{"id":"src","instance":""}}', "r1")
    assert isinstance(reply, ForkFailure) and reply.code == "INVALID_REQUEST"
    with pytest.raises(ForkError) as err:
        registry.append(LiveHandle("src", ""), TURN)
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_a_waiter_on_a_decoding_client_gets_its_reply(server: EmbeddedServer, redis: Redis,
                                                      registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    decoding = Redis(port=server.port, decode_responses=True)
    client = Client(decoding)
    request = client.request("src", session_id="c1")
    waiting = threading.Thread(target=lambda: client.wait(request, 10), daemon=True)
    waiting.start()
    client.submit(request)
    worker(redis, service(redis, registry)).work(burst=True, logging_level="ERROR")
    assert client.wait(request, 10).ok
    waiting.join(10)
    decoding.close()


def test_an_outage_during_maintenance_does_not_stop_the_worker(redis: Redis, registry: Registry,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    request = client.request("src", session_id="c1")
    client.submit(request)
    fork_worker = worker(redis, service(redis, registry))
    real = fork_worker._requeue_stranded
    calls = {"n": 0}

    def outage() -> None:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RedisConnectionError("server restarting")
        real()

    monkeypatch.setattr(fork_worker, "_requeue_stranded", outage)
    fork_worker.work(burst=True, logging_level="ERROR")
    assert calls["n"] >= 3
    assert client.wait(request, 5).ok
