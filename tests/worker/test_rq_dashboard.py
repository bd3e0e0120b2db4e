"""rq-dashboard, really started with the compose file's options, shows the fork jobs: request JSON and result."""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import SETTINGS, make_client, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis
from waits import wait_until

from sessionfork import NewEvent, Registry
from sessionfork.aio import AsyncClient
from sessionfork.core import wire
from sessionfork.embedded import EmbeddedServer, free_port

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

ROOT = Path(__file__).resolve().parents[2]


def compose_dashboard_argv(redis_url: str, port: int) -> list[str]:
    """The compose file's dashboard command, run by this interpreter, against ``redis_url`` on ``port``."""
    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["dashboard"]["command"]
    assert command[0] == "rq-dashboard" and "--json" in command
    options = list(command[1:])
    replaced = {"--redis-url": redis_url, "--bind": "127.0.0.1", "--port": str(port)}
    for flag, value in replaced.items():
        options[options.index(flag) + 1] = value
    return [sys.executable, "-m", "rq_dashboard", *options]


def get(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=10) as answer:
        return json.loads(answer.read())


def test_dashboard_shows_fork_jobs_with_request_and_result(server: EmbeddedServer, redis: Redis,
                                                          registry: Registry) -> None:
    handle = registry.create("dash-src")
    registry.append(handle, turn(1))
    busy = registry.create("dash-busy")
    registry.append(busy, [NewEvent("turn/start", {"turn": 1})])
    name = worker_name("dash")
    worker = start_worker(server.url, name)
    port = free_port()
    dashboard = subprocess.Popen(compose_dashboard_argv(server.url, port), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_registered(redis, name)
        client = make_client(redis)
        long_ids = [f"dash-child-{i}-{'x' * 40}" for i in range(3)]  # a request far over 75 characters
        sync_request = client.request("dash-src", session_ids=long_ids, request_id="dash-sync")
        client.submit(sync_request)
        sync_reply = client.wait(sync_request, timeout=20)
        refused = client.fork("dash-busy", request_id="dash-open", timeout=20)

        async def via_async() -> tuple[wire.ForkRequest, wire.Reply]:
            async with AsyncClient.from_url(server.url, SETTINGS) as aio:
                request = await aio.request("dash-src", session_id="dash-aio-child", request_id="dash-aio")
                await aio.submit(request)
                return request, await aio.wait(request, timeout=20)

        aio_request, aio_reply = asyncio.run(via_async())
        assert sync_reply.ok and aio_reply.ok and not refused.ok
        base = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            assert dashboard.poll() is None, dashboard.stderr.read().decode() if dashboard.stderr else ""
            try:
                get(base, "/0/data/queues.json")
            except (urllib.error.URLError, ConnectionError):
                return False
            return True

        wait_until(serving, 60, "rq-dashboard to serve")
        queues = {q["name"]: q for q in get(base, "/0/data/queues.json")["queues"]}
        assert queues[SETTINGS.queue]["finished_job_registry_count"] == 3
        listed = get(base, f"/0/data/jobs/{SETTINGS.queue}/finished/100/asc/1.json")["jobs"]
        assert {j["id"] for j in listed} == {"dash-sync", "dash-open", "dash-aio"}
        workers = get(base, "/0/data/workers.json")["workers"]
        assert [(w["name"], w["queues"]) for w in workers] == [(name, [SETTINGS.queue])]
        for request_id, request, reply in (("dash-sync", sync_request, sync_reply), ("dash-open", None, refused),
                                           ("dash-aio", aio_request, aio_reply)):
            job = get(base, f"/0/data/job/{request_id}.json")
            assert job["status"] == "finished" and job["origin"] == SETTINGS.queue
            assert job["result"] == json.loads(wire.encode(reply))  # the reply, as stored by RQ
            call = job["description"]  # sessionfork.jobs.fork('<request JSON>'), in full
            assert call.startswith("sessionfork.jobs.fork(") and call.endswith(")")
            shown = wire.decode_request(ast.literal_eval(call[len("sessionfork.jobs.fork("):-1]))
            assert shown.request_id == request_id and (request is None or shown == request)
        assert get(base, "/0/data/job/dash-open.json")["result"]["code"] == "OPEN_TURN"
        check = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["dashboard"]["healthcheck"]
        argv = [sys.executable if w == "python" else w.replace(":9181/", f":{port}/") for w in check["test"][1:]]
        assert subprocess.run(argv, timeout=30).returncode == 0  # the compose file's healthcheck passes
    finally:
        dashboard.terminate()
        dashboard.wait(15)
        if dashboard.stderr:
            dashboard.stderr.close()
        assert stop(worker) == 0
