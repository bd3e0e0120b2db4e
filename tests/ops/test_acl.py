"""Least-privilege ACL users (``sessionfork.ops.acl``): the whole flow runs under them, and each role
is refused (NOPERM) outside its part of the key space and command set."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import (
    SETTINGS,
    apply_acl,
    clean_environ,
    cli_args,
    make_client,
    stop,
    stored_outcome,
    turn,
    wait_registered,
    worker_name,
)
from redis import Redis
from redis.exceptions import NoPermissionError
from waits import outcome_of, raised, wait_until

from sessionfork.core import forks, keys, wire
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult, Header, NewEvent, Reply, Usage
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import acl
from sessionfork.ops.persist import JsonlBackend
from sessionfork.protocol import enqueue as enqueue_module
from sessionfork.worker.rq_seam.worker import RQ_MAJOR

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

PASSWORDS = {acl.SCHEDULER: "scheduler-secret", acl.WORKER: "worker-secret", acl.HOST: "host-secret",
             acl.PERSIST: "persist-secret", acl.CONSOLE: "console-secret"}
EXPECTED_DENIALS = set() if RQ_MAJOR >= 3 else {(acl.WORKER, "command", "client|list")}
"""RQ 2 asks CLIENT LIST for its own address, denied on purpose (see acl.py); RQ 3 asks CLIENT INFO."""


@dataclass(frozen=True)
class Flow:
    """What the module's one run of the whole flow left behind."""

    reply: Reply
    request_id: str
    boundary_reply: Reply
    seed_boundary_reply: Reply
    denials: set[tuple[str, str, str]]
    worker_log: Path


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.fixture(scope="module")
def acl_server() -> Iterator[EmbeddedServer]:
    """A server of this module's own, with the three users created by a default-user client."""
    with EmbeddedServer() as srv:
        admin = srv.client()
        apply_acl(admin, SETTINGS, PASSWORDS)
        admin.close()
        # the operator's step: load the enqueue library (FCALL sf_enqueue), as an admin
        subprocess.run(cli_args(srv.url, "load-functions"), env=clean_environ(), check=True, timeout=60,
                       capture_output=True)
        yield srv


@pytest.fixture(scope="module")
def admin(acl_server: EmbeddedServer) -> Iterator[Redis]:
    client = acl_server.client()
    yield client
    client.close()


def _url(server: EmbeddedServer, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[user]}@127.0.0.1:{server.port}/0"


@pytest.fixture(scope="module")
def scheduler(acl_server: EmbeddedServer) -> Iterator[Redis]:
    client = Redis.from_url(_url(acl_server, acl.SCHEDULER))
    yield client
    client.close()


@pytest.fixture(scope="module")
def host(acl_server: EmbeddedServer) -> Iterator[Redis]:
    client = Redis.from_url(_url(acl_server, acl.HOST))
    yield client
    client.close()


@pytest.fixture(scope="module")
def flow(acl_server: EmbeddedServer, admin: Redis, scheduler: Redis, host: Redis,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flow]:
    """Host creates and appends "a"; a worker runs as sf-worker; the scheduler forks "a" and waits."""
    registry = Registry(host)
    registry.append(registry.create("a", cwd="/w"), turn(1))
    running = [*turn(1), *turn(2), NewEvent("turn/start", {"turn": 3})]  # a turn still running
    registry.append(registry.create("r", cwd="/w"), running)
    name = worker_name("acl")
    log_path = tmp_path_factory.mktemp("acl") / "worker.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(cli_args(_url(acl_server, acl.WORKER), "worker", "--name", name, "--log-level", "WARNING"),
                            env=clean_environ(), stdin=subprocess.DEVNULL, stderr=log)
    try:
        wait_registered(admin, name)
        client = make_client(scheduler)
        request = client.request("a", session_id="child-1")
        client.submit(request)
        reply = client.wait(request, 10)
        # Boundary forks read turn indexes: the source's (source step), and, for a boundary inside
        # an inherited seed, the ancestor's. The host reads the last completed turn.
        boundary_reply = client.fork("r", session_id="r-at-2", boundary=registry.last_turn_end("r"), timeout=10)
        seed_reply = client.fork("child-1", session_id="in-seed", boundary=3, timeout=10)
        denials = {(_text(e["username"]), _text(e["reason"]), _text(e["object"]))
                   for e in admin.acl_log()}
        assert isinstance(request.request_id, str)
        yield Flow(reply, request.request_id, boundary_reply, seed_reply, denials, log_path)
    finally:
        assert stop(proc) == 0
        log.close()


# -- the rules as text ----------------------------------------------------------------------------


def test_rules_give_one_setuser_line_per_role_starting_from_nothing() -> None:
    lines = acl.acl_rules(Settings(), PASSWORDS)

    heads = [shlex.split(line)[:9] for line in lines]
    assert heads == [["ACL", "SETUSER", user, "resetpass", "resetkeys", "resetchannels", "clearselectors",
                      "-@all", "on"] for user in (acl.SCHEDULER, acl.WORKER, acl.HOST, acl.PERSIST, acl.CONSOLE)]


def test_rules_store_password_hashes_never_passwords() -> None:
    text = acl.render(acl.acl_rules(Settings(), PASSWORDS))

    assert not any(password in text for password in PASSWORDS.values())
    assert "#" + hashlib.sha256(b"worker-secret").hexdigest() in text


def test_rules_refuse_a_missing_password() -> None:
    with pytest.raises(ValueError, match="sf-host"):
        acl.acl_rules(Settings(), {acl.SCHEDULER: "a", acl.WORKER: "b"})


def test_rules_refuse_an_empty_password() -> None:
    with pytest.raises(ValueError, match="sf-worker"):
        acl.acl_rules(Settings(), {**PASSWORDS, acl.WORKER: ""})


def test_rules_escape_glob_characters_of_the_queue_and_reply_channel() -> None:
    settings = Settings(queue="q*[1]", reply_channel="r?")

    scheduler = shlex.split(acl.acl_rules(settings, PASSWORDS)[0])

    assert "~rq:queue:q\\*\\[1\\]" in scheduler
    assert {"&r\\?", "&r\\?:*"} <= set(scheduler)


def test_cluster_settings_grant_the_topology_commands_to_host_and_worker_only() -> None:
    scheduler, worker, host, _, _ = (set(shlex.split(line)) for line in acl.acl_rules(Settings(cluster=True),
                                                                                       PASSWORDS))

    assert "+cluster|slots" in worker
    assert "+cluster|slots" in host
    assert "+cluster|slots" not in scheduler


def test_wait_replicas_grants_wait_to_the_worker() -> None:
    worker = shlex.split(acl.acl_rules(Settings(wait_replicas=1), PASSWORDS)[1])

    assert "+wait" in worker


def test_render_puts_one_command_per_line() -> None:
    lines = acl.acl_rules(Settings(), PASSWORDS)

    assert acl.render(lines).splitlines() == lines


# -- the whole flow under the three users ---------------------------------------------------------


def test_scheduler_fork_is_served_by_the_worker_user(flow: Flow, admin: Redis) -> None:
    assert isinstance(flow.reply, ForkResult), flow.reply
    assert flow.reply.ok
    assert isinstance(flow.reply.session, Header)
    assert (flow.reply.session.id, flow.reply.session.parent_session) == ("child-1", "a")
    assert admin.hget(keys.session("child-1"), "parent") == b"a"  # the compact layout's field


def test_boundary_forks_run_under_the_worker_user(flow: Flow) -> None:
    assert isinstance(flow.boundary_reply, ForkResult), flow.boundary_reply
    assert isinstance(flow.boundary_reply.session, Header)
    assert (flow.boundary_reply.session.id, flow.boundary_reply.session.seed_length) == ("r-at-2", 8)
    assert isinstance(flow.seed_boundary_reply, ForkResult), flow.seed_boundary_reply
    assert isinstance(flow.seed_boundary_reply.session, Header)
    assert (flow.seed_boundary_reply.session.parent_session, flow.seed_boundary_reply.session.seed_length) \
        == ("child-1", 4)


def test_flow_meets_no_acl_denial_but_the_deliberate_client_list(flow: Flow) -> None:
    assert flow.denials == EXPECTED_DENIALS


def test_the_scheduler_enqueues_with_fcall_never_a_script(flow: Flow, admin: Redis) -> None:
    stats: Any = admin.info("commandstats")
    assert stats["cmdstat_fcall"]["calls"] >= 3  # the flow's three forks; an EVALSHA would be a denial


def test_host_reads_back_the_session_it_wrote(flow: Flow, host: Redis) -> None:
    assert [e.type for e in Registry(host).events("a")] == [e.type for e in turn(1)]


def test_host_appends_usage_and_reads_a_subtree(flow: Flow, host: Redis) -> None:
    registry = Registry(host)
    registry.create("u-root")
    forks.fork(registry, "u-root", "u-child")
    appended = outcome_of(lambda: registry.append("u-child", turn(1), usage=Usage(input_tokens=3, cost_micros=2)))
    assert isinstance(appended, list), appended  # no ACL failure in the script
    assert registry.usage("u-root").subtree == Usage(input_tokens=3, cost_micros=2)  # the root's totals
    assert registry.usage("u-child").subtree == Usage(input_tokens=3, cost_micros=2)  # the walk (subtree.lua)


def test_scheduler_reads_the_outcome_stream(flow: Flow, scheduler: Redis) -> None:
    entries: Any = scheduler.xrange(keys.OUTCOME_STREAM)

    assert flow.request_id.encode() in [fields[b"requestId"] for _, fields in entries]


# -- refusals -------------------------------------------------------------------------------------


def test_scheduler_cannot_write_a_session(flow: Flow, scheduler: Redis) -> None:
    with pytest.raises(NoPermissionError):
        scheduler.hset(keys.session("x"), "header", "{}")


def test_scheduler_cannot_create_a_session_through_the_registry(flow: Flow, scheduler: Redis, admin: Redis) -> None:
    with pytest.raises(NoPermissionError):
        Registry(scheduler).create("x")
    assert admin.exists(keys.session("x")) == 0


def test_scheduler_cannot_delete_a_job(flow: Flow, scheduler: Redis, admin: Redis) -> None:
    job_key = f"rq:job:{flow.request_id}"

    with pytest.raises(NoPermissionError):
        scheduler.delete(job_key)
    assert admin.exists(job_key) == 1


def test_scheduler_cannot_expire_a_job(flow: Flow, scheduler: Redis) -> None:
    with pytest.raises(NoPermissionError):
        scheduler.expire(f"rq:job:{flow.request_id}", 1)


def test_scheduler_cannot_write_a_fork_request_record(flow: Flow, scheduler: Redis) -> None:
    with pytest.raises(NoPermissionError):
        scheduler.hset(keys.request(flow.request_id), "outcome", "{}")


def test_host_cannot_push_to_the_queue(flow: Flow, host: Redis) -> None:
    with pytest.raises(NoPermissionError):
        host.lpush(f"rq:queue:{keys.DEFAULT_QUEUE}", "job-1")


def test_host_cannot_read_fork_requests(flow: Flow, host: Redis) -> None:
    with pytest.raises(NoPermissionError):
        host.hmget(keys.request(flow.request_id), ["outcome"])


@pytest.mark.parametrize("command", [
    ("FLUSHALL",), ("CONFIG", "GET", "*"), ("KEYS", "*"), ("ACL", "LIST"), ("CLIENT", "LIST"),
    ("CONFIG", "SET", "maxclients", "10000"), ("MONITOR",), ("SCRIPT", "FLUSH"), ("SHUTDOWN", "NOSAVE"),
], ids=lambda c: " ".join(c))
def test_worker_cannot_run_admin_commands(acl_server: EmbeddedServer, command: tuple[str, ...]) -> None:
    worker = Redis.from_url(_url(acl_server, acl.WORKER))
    try:
        with pytest.raises(NoPermissionError):
            worker.execute_command(*command)  # type: ignore[no-untyped-call]
    finally:
        worker.close()


def test_worker_logs_no_traceback(flow: Flow) -> None:
    assert "Traceback" not in flow.worker_log.read_text(errors="replace")


def test_persistence_backend_runs_as_its_own_user(acl_server: EmbeddedServer, host: Redis, tmp_path: Path) -> None:
    sid = f"persisted-{uuid.uuid4().hex[:8]}"
    handle = Registry(host).create(sid)
    Registry(host).append(handle, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    with Redis.from_url(_url(acl_server, acl.PERSIST)) as client:
        backend = JsonlBackend(Registry(client), tmp_path, consumer="acl-test")
        wait_until(lambda: backend.step() >= 0 and (tmp_path / "_no-cwd" / f"{sid}.jsonl").exists(), 20,
                   "the persisted file")
        lines = (tmp_path / "_no-cwd" / f"{sid}.jsonl").read_text().splitlines()
        assert len(lines) == 3
        with pytest.raises(NoPermissionError):
            client.hset(keys.session("x"), "header", "{}")
        with pytest.raises(NoPermissionError):
            client.delete(keys.LIFECYCLE_STREAM)


def test_host_forks_disposes_and_deletes_sessions(host: Redis) -> None:
    from sessionfork.core import forks

    registry = Registry(host)
    sid = f"mortal-{uuid.uuid4().hex[:8]}"
    registry.append(registry.create(sid), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    forks.fork(registry, sid, f"{sid}.kid")
    registry.dispose(sid)
    assert registry.delete(sid) == "deleted"
    assert registry.delete(f"{sid}.kid") == "deleted"


@pytest.mark.parametrize("role", [acl.HOST, acl.WORKER])
def test_deletion_frees_a_summary_childs_source_under_the_role(acl_server: EmbeddedServer, host: Redis,
                                                                 role: str) -> None:
    """Deleting the source of summary children, then one of them, runs release.lua's freeing (needs
    index, placeholders, turn index) under the host's and the worker's (retention) user."""
    from sessionfork import Summary
    from sessionfork.core import forks

    sid = f"summed-{uuid.uuid4().hex[:8]}"
    registry = Registry(host)
    registry.append(registry.create(sid), [*turn(1), *turn(2), *turn(3)])
    forks.fork(registry, sid, f"{sid}.k8", summary=Summary(keep_from=8, data="two turns"))
    forks.fork(registry, sid, f"{sid}.k4", summary=Summary(keep_from=4, data="one turn"))
    kept = registry.events(f"{sid}.k8")
    with Redis.from_url(_url(acl_server, role)) as client:
        deleting = Registry(client)
        assert deleting.delete(sid) == "deleted"
        assert deleting.delete(f"{sid}.k4") == "deleted"
        assert client.hget(keys.session(sid), "freed") == b"8"
        assert deleting.events(f"{sid}.k8") == kept


def test_persistence_backend_writes_only_its_marks(acl_server: EmbeddedServer) -> None:
    with Redis.from_url(_url(acl_server, acl.PERSIST)) as client:
        client.set(keys.session_persisted("x"), 3)
        client.delete(keys.session_persisted("x"))
        with pytest.raises(NoPermissionError):
            client.set(keys.session_log("x"), 3)
        with pytest.raises(NoPermissionError):
            client.delete(keys.session("x"))


def test_the_scheduler_runs_the_enqueue_function_but_cannot_write_a_request_record(
        flow: Flow, scheduler: Redis, admin: Redis) -> None:
    def enqueue(rid: str, source: str) -> int:
        request = msgspec.json.encode({"requestId": rid, "source": source, "sessionId": f"{rid}-c"})
        return int(scheduler.fcall(enqueue_module.FUNCTION, 4, f"rq:job:{rid}", f"rq:queue:{SETTINGS.queue}",
                                   keys.request(rid), "rq:queues", rid, request, "origin", SETTINGS.queue,
                                   "status", "queued"))

    rid = f"raw-{uuid.uuid4().hex[:8]}"
    assert (enqueue(rid, "a"), enqueue(rid, "a"), enqueue(rid, "b")) == (1, 0, -1)  # queued: the job compared
    wait_until(lambda: stored_outcome(scheduler, rid) is not None, 10, "the sf-worker's outcome")
    assert b'"ok":true' in (stored_outcome(scheduler, rid) or b"")  # served by the worker
    admin.delete(f"rq:job:{rid}")  # as with result_ttl 0: the worker's record alone remembers the request
    assert (enqueue(rid, "a"), enqueue(rid, "b")) == (0, -1)
    with pytest.raises(NoPermissionError):
        scheduler.hset(keys.request(rid), "outcome", "forged")
    assert b"forged" not in (stored_outcome(admin, rid) or b"")


LOOP = "local n = 0 while true do n = n + 1 end"


@pytest.mark.parametrize("command", [
    ("EVAL", LOOP, "0"), ("EVALSHA", hashlib.sha1(LOOP.encode()).hexdigest(), "0"), ("SCRIPT", "LOAD", LOOP),
    ("EVAL_RO", LOOP, "0"),
    ("FUNCTION", "LOAD", f"#!lua name=loop\nredis.register_function('loop', function() {LOOP} end)"),
    ("FUNCTION", "DELETE", "sessionfork"), ("FUNCTION", "FLUSH"),
    ("EVAL", "return redis.call('HSET', KEYS[3], 'outcome', 'forged')", "3", "rq:job:x", "rq:queue:sessionfork",
     "sf:req:x"),
])
def test_the_scheduler_can_run_no_code_of_its_own(flow: Flow, scheduler: Redis, admin: Redis,
                                                   command: tuple[str, ...]) -> None:
    denied = raised(lambda: scheduler.execute_command(*command))  # type: ignore[no-untyped-call]
    assert isinstance(denied, NoPermissionError), repr(denied)  # a loop that ran times out instead
    assert admin.ping() and admin.function_list(library="loop") == []
    assert admin.function_list(library="sessionfork") != []


def test_without_the_library_the_scheduler_is_told_to_load_it(flow: Flow, scheduler: Redis, admin: Redis) -> None:
    admin.function_delete("sessionfork")
    try:
        client = make_client(scheduler)
        with pytest.raises(NoPermissionError, match="sessionfork load-functions"):
            client.submit(client.request("a", request_id="nolib-1"))
        assert not admin.exists("rq:job:nolib-1")
        enqueue_module.load_library(admin)  # the operator's fix: the same client works again
        client.submit(client.request("a", request_id="nolib-1"))
        assert admin.exists("rq:job:nolib-1")
    finally:
        enqueue_module.load_library(admin)


def test_the_scheduler_reads_its_reply_with_fcall_sf_outcome(flow: Flow, scheduler: Redis) -> None:
    """The any-language recipe's step 3 is one FCALL, which the sf-scheduler role may run
    (FCALL on sf:req:*; the function reads with the caller's HMGET)."""
    read = scheduler.execute_command("FCALL", enqueue_module.OUTCOME_FUNCTION, 1,  # type: ignore[no-untyped-call]
                                     keys.request(flow.request_id))
    assert read == wire.encode(flow.reply)
