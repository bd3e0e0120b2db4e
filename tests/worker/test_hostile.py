"""Hostile input, property-based: whatever a queue carries, the request ends as a typed
``INVALID_REQUEST`` outcome, the worker survives without logging a traceback, nothing is executed
and the registry is untouched. ``RequestService.parse`` is also checked alone (no server).

Cases tried per category are printed and written to ``<pytest tmp>/hostile-counts*/*.json``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import rq
from helpers import clean_environ, cli_args, stop, stored_outcome, turn, worker_name
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis
from waits import wait_until

from sessionfork.clients.client import Client
from sessionfork.clients.waiting import wait_for_reply
from sessionfork.core import keys, rules
from sessionfork.core.config import Settings
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol import requests
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.jobs import fresh_workers

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

SETTINGS = Settings()
LIMIT = SETTINGS.max_request_bytes
SOURCE, MISSING = "src", "no-such-session"
TIMEOUT = 10.0
DEPTH = 10_000
FEW = settings(max_examples=10, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Job:
    """A hostile job; ``submit(harness, request_id)`` queues it. The INVALID_REQUEST message must
    contain ``expect`` (the field to blame, or the reason when no field is). A plain class, not a
    dataclass: Hypothesis prints dataclasses field by field, and payloads reach 200 KB."""

    def __init__(self, kind: str, expect: str, submit: Callable[[Harness, str], None], job_id: str | None = None,
                 payload: str = "") -> None:
        self.kind, self.expect, self.submit, self.payload = kind, expect, submit, payload
        self.job_id = job_id  # a hostile job id of the case's own (RQ-valid), else a fresh one

    def __repr__(self) -> str:
        return f"Job({self.kind!r}, {self.payload[:80]!r}...{len(self.payload)} chars, {self.expect!r})"


def payload_job(kind: str, payload: str, expect: str, job_id: str | None = None) -> Job:
    return Job(kind, expect, lambda h, rid: _enqueue(h.queue, payload, rid), job_id, payload)


def raw_job(kind: str, data: bytes) -> Job:
    """An RQ job hash written by hand (data is whatever RQ's deserializer gets)."""
    def submit(h: Harness, rid: str) -> None:
        h.redis.hset(f"rq:job:{rid}", mapping={"data": data, "origin": SETTINGS.queue, "status": "queued"})
        h.redis.rpush(h.queue.key, rid)
    return Job(kind, "sessionfork", submit)  # any refusal names sessionfork's job or its function


def _enqueue(queue: rq.Queue, payload: str, request_id: str) -> None:
    assert jobs.enqueue(queue, payload.encode(), request_id, SETTINGS)


def _request(**fields: Any) -> str:
    return json.dumps({"source": SOURCE, **fields})


# -- strategies -----------------------------------------------------------------------------------

# Finite floats only: NaN and Infinity are not JSON, and a payload that is not JSON names no field.
_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=20)
JSON = st.recursive(_scalars, lambda k: st.lists(k, max_size=4) | st.dictionaries(st.text(max_size=8), k, max_size=4),
                    max_leaves=12)
BAD_IDS = st.one_of(
    st.text(st.characters(max_codepoint=0x1F), min_size=1, max_size=8),  # control characters
    st.text(st.characters(min_codepoint=0x80, exclude_categories=["Cs"]), min_size=1, max_size=12),  # beyond ASCII
    st.text(max_size=12).map(lambda s: f"ok{s}\u202e"),  # a right-to-left override
    st.integers(129, 400).map(lambda n: "a" * n), st.just(""), st.text(max_size=40),
).filter(lambda s: not rules.is_valid_id(s))
_WRONG: dict[str, Callable[[Any], bool]] = {
    "source": lambda v: not isinstance(v, str) and not (
        isinstance(v, dict) and set(v) == {"id", "instance"} and all(isinstance(x, str) for x in v.values())),
    "requestId": lambda v: not isinstance(v, str), "sessionId": lambda v: not isinstance(v, str),
    "replyTo": lambda v: not isinstance(v, str), "count": lambda v: type(v) is not int,
    "sessionIds": lambda v: not isinstance(v, list) or any(not isinstance(x, str) for x in v),
    "boundary": lambda v: type(v) is not int,
}
_ARRAYS = "[" * DEPTH + "]" * DEPTH
# Nested values that reach a generic JSON decoder (see the deep-nesting test below); the depth bounds keep
# every payload under 64 KiB.
FATAL_NESTING = {"object": '{"a":' * DEPTH + "1" + "}" * DEPTH, "in source": f'{{"source":{_ARRAYS}}}',
                 "in sessionIds": f'{{"source":"{SOURCE}","sessionIds":{_ARRAYS}}}'}
_DEEP_EXPECT = {"object": "invalid request", "in source": "source", "in sessionIds": "sessionIds"}

random_bytes = st.binary(max_size=300).map(lambda b: payload_job("bytes", b.decode("latin-1"), "invalid request"))
json_values = JSON.filter(lambda v: not (isinstance(v, dict) and "source" in v)).map(
    lambda v: payload_job(type(v).__name__, json.dumps(v), "invalid request"))
deep_arrays = st.integers(1_000, 20_000).map(lambda d: payload_job("array", "[" * d + "]" * d, "invalid request"))
deep_raw = st.sampled_from([raw_job("job data", _ARRAYS.encode()),
                            raw_job("job data, 4th item", f'["x",null,[],{_ARRAYS}]'.encode())])
deep_all = deep_arrays | st.sampled_from([payload_job(k, p, _DEEP_EXPECT[k]) for k, p in FATAL_NESTING.items()])


@st.composite
def huge_strings(draw: st.DrawFn) -> Job:
    field = draw(st.sampled_from(["source", "sessionId", "replyTo", "requestId", "padding"]))
    text = "\u00e9" * (draw(st.integers(LIMIT + 1, 4 * LIMIT)) // 2)  # two bytes each in UTF-8
    return payload_job(field, json.dumps({"source": SOURCE, field: text}, ensure_ascii=False), "over the limit")


@st.composite
def wrong_types(draw: st.DrawFn) -> Job:
    field = draw(st.sampled_from(sorted(_WRONG)))
    value = draw(JSON.filter(_WRONG[field]))
    return payload_job(field, json.dumps({"source": value}) if field == "source" else _request(**{field: value}), field)


@st.composite
def hostile_ids(draw: st.DrawFn) -> Job:
    place = draw(st.sampled_from(["source", "source.id", "sessionId", "sessionIds", "requestId", "replyTo", "job id",
                                  "lone surrogate"]))
    if place == "lone surrogate":  # msgspec refuses the whole document; the refusal still names the field
        return payload_job(place, json.dumps({"source": "a" + chr(draw(st.integers(0xD800, 0xDFFF)))}),
                           "source holds a lone surrogate")
    if place == "job id":  # RQ's alphabet accepts it, sessionfork's rule does not (too long)
        return payload_job(place, _request(), "requestId", job_id="long-" + "a" * draw(st.integers(124, 300)))
    bad = draw(BAD_IDS if place != "replyTo" else BAD_IDS.filter(
        lambda s: not (0 < len(s) <= 256 and s.isascii() and s.isprintable())))
    payload, expect = {"source": (json.dumps({"source": bad}), "source"),
                       "source.id": (json.dumps({"source": {"id": bad, "instance": "x"}}), "source"),
                       "sessionIds": (_request(sessionIds=["ok-1", bad]), "sessionIds[1]"),
                       }.get(place, (_request(**{place: bad}), place))
    return payload_job(place, payload, expect)


class _Pickled:
    """Unpickling this runs ``touch <path>``: proof that someone unpickled a job."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return os.system, (f"touch {shlex.quote(str(self.path))}",)


@st.composite
def pickled(draw: st.DrawFn) -> Job:
    kind = draw(st.sampled_from(["malicious object", "valid request", "text"]))
    text = draw(st.text(max_size=50))
    def submit(h: Harness, rid: str) -> None:
        arg = {"malicious object": _Pickled(h.sentinel), "valid request": _request(), "text": text}[kind]
        h.pickle_queue.enqueue_call(jobs.JOB_FUNCTION, args=(arg,), job_id=rid)
    return Job(kind, "not a JSON sessionfork job", submit)


@st.composite
def other_callables(draw: st.DrawFn) -> Job:
    function = draw(st.sampled_from(["os.system", "builtins.eval", "builtins.exec", "subprocess.run", "posix.system",
                                     "sessionfork.jobs.fork.__globals__", "sessionfork.jobs.Fork"]))
    use_pickle = draw(st.booleans())
    def submit(h: Harness, rid: str) -> None:
        touch = f"touch {shlex.quote(str(h.sentinel))}"
        args = {"builtins": f"__import__('os').system({touch!r})", "subprocess": ["touch", str(h.sentinel)]}
        queue = h.pickle_queue if use_pickle else h.queue
        queue.enqueue_call(function, args=(args.get(function.split(".")[0], touch),), job_id=rid)
    expect = "not a JSON sessionfork job" if use_pickle else "this worker runs only sessionfork.jobs.fork"
    return Job(function + (" (pickle)" if use_pickle else ""), expect, submit)


@st.composite
def job_shape(draw: st.DrawFn) -> Job:
    shapes: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
              "no argument": ((), {}), "two arguments": ((_request(), _request()), {}),
              "keyword": ((), {"payload": _request()}), "extra keyword": ((_request(),), {"x": 1}),
              "not a string": ((draw(JSON.filter(lambda v: not isinstance(v, str))),), {})}
    kind = draw(st.sampled_from(sorted(shapes)))
    args, kwargs = shapes[kind]
    def submit(h: Harness, rid: str) -> None:
        h.queue.enqueue_call(jobs.JOB_FUNCTION, args=args, kwargs=kwargs, job_id=rid)
    return Job(kind, "takes exactly one argument", submit)


raw_job_hash = st.one_of(
    st.binary(max_size=200).map(lambda b: raw_job("bytes", b)),
    st.binary(max_size=200).map(lambda b: raw_job("zlib bytes", zlib.compress(b))),
    JSON.map(lambda v: raw_job("json", json.dumps(v).encode())),
    st.tuples(JSON, JSON, JSON, JSON).map(lambda t: raw_job("4-list", json.dumps(list(t)).encode())))

PARSE = {"random_bytes": random_bytes, "json_values": json_values, "deep_nesting": deep_all,
         "huge_strings": huge_strings(), "wrong_types": wrong_types(), "hostile_ids": hostile_ids()}
WORKER = {**PARSE, "deep_nesting": deep_arrays | deep_raw, "pickled": pickled(), "other_callables": other_callables(),
          "job_shape": job_shape(), "raw_job_hash": raw_job_hash}


def _report(level: str, counts: Counter[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("hostile-counts") / f"{level}.json"
    path.write_text(json.dumps(dict(sorted(counts.items())), indent=2))
    total = sum(v for k, v in counts.items() if "/" not in k)
    print(f"\nhostile cases tried ({level}, {total} in all): {json.dumps(dict(sorted(counts.items())))} -> {path}")


# -- unit level: RequestService.parse alone ------------------------------------------------------------


@pytest.fixture(scope="module")
def unit_counts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    yield counts
    _report("parse", counts, tmp_path_factory)


@pytest.mark.parametrize(("category", "examples"), [
    ("random_bytes", 500), ("json_values", 400), ("deep_nesting", 100), ("huge_strings", 100), ("wrong_types", 500),
    ("hostile_ids", 750)])
def test_parse_rejects_hostile_payloads_naming_the_field(category: str, examples: int,
                                                         unit_counts: Counter[str]) -> None:
    limits = Limits(max_request_bytes=LIMIT, max_fanout=SETTINGS.max_fanout)

    @settings(FEW, max_examples=examples)
    @given(PARSE[category])
    def rejected(job: Job) -> None:
        unit_counts[category] += 1
        unit_counts[f"{category}/{job.kind}"] += 1
        with pytest.raises(ForkError) as refused:
            requests.parse(job.payload, job.job_id or "job-1", limits)
        assert refused.value.code is ErrorCode.INVALID_REQUEST
        assert job.expect in refused.value.message

    rejected()
    assert unit_counts[category] > 0


# -- a running worker --------------------------------------------------------------------------------


@contextmanager
def _worker(server: EmbeddedServer, log: Path, queue: str = SETTINGS.queue) -> Iterator[subprocess.Popen[bytes]]:
    """A ``sessionfork worker`` process on ``queue``, registered; stopped on exit."""
    name = worker_name("hostile")
    with log.open("wb") as sink, server.client() as redis:
        proc = subprocess.Popen(cli_args(server.url, "--queue", queue, "worker", "--name", name, "--log-level",
                                         "WARNING"), env=clean_environ(), stdin=subprocess.DEVNULL, stderr=sink)
        try:
            wait_until(lambda: name in fresh_workers(redis, Settings(queue=queue)), 20, f"worker {name} to register")
            yield proc
        finally:
            stop(proc)


class Harness:
    """The module's worker and the checks every hostile case must pass."""

    def __init__(self, redis: Redis, proc: subprocess.Popen[bytes], log: Path, sentinel: Path) -> None:
        self.redis, self.proc, self.log, self.sentinel = redis, proc, log, sentinel
        self.queue = jobs.make_queue(redis, SETTINGS)
        self.pickle_queue = rq.Queue(SETTINGS.queue, connection=redis)  # RQ's default serializer: pickle
        self.counts: Counter[str] = Counter()
        self.sessions = self.session_keys()

    def session_keys(self) -> set[bytes]:
        return set(self.redis.scan_iter(match="sf:s:*", count=10_000))

    def run(self, category: str, job: Job) -> None:
        """Queue ``job``, then check its outcome, the worker, the sentinel and the registry."""
        self.counts.update([category, f"{category}/{job.kind}"])
        request_id = f"{job.job_id or 'h-' + category.replace('_', '-')}-{uuid.uuid4().hex}"
        job.submit(self, request_id)
        reply = wait_for_reply(self.redis, request_id, SETTINGS.reply_channel, TIMEOUT)
        assert isinstance(reply, ForkFailure), reply
        assert (reply.code, reply.request_id) == (ErrorCode.INVALID_REQUEST.value, request_id)
        assert job.expect in reply.message
        assert self.proc.poll() is None, "the worker died"
        assert not self.sentinel.exists(), "a hostile job was executed"
        assert self.session_keys() == self.sessions, "a hostile request wrote to the registry"

    def assert_healthy(self) -> None:
        """The worker logged no traceback and still forks a valid request."""
        assert "Traceback" not in self.log.read_text(errors="replace")
        reply = Client(self.redis, SETTINGS).fork(SOURCE, timeout=TIMEOUT)
        assert isinstance(reply, ForkResult) and isinstance(reply.session, Header), reply
        created = self.session_keys() - self.sessions
        assert created <= {keys.session(reply.session.id).encode(), keys.session_children(SOURCE).encode()}
        self.sessions |= created


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[EmbeddedServer]:
    """A server of this module's own, holding the one session hostile requests might touch."""
    with EmbeddedServer() as srv, srv.client() as redis:
        Registry(redis).append(Registry(redis).create(SOURCE), turn(1))
        yield srv


@pytest.fixture(scope="module")
def harness(hostile_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    workdir = tmp_path_factory.mktemp("hostile")
    with _worker(hostile_server, workdir / "worker.log") as proc, hostile_server.client() as redis:
        h = Harness(redis, proc, workdir / "worker.log", workdir / "executed")
        yield h
        _report("worker", h.counts, tmp_path_factory)


@pytest.mark.parametrize(("category", "examples"), [
    ("random_bytes", 30), ("json_values", 35), ("deep_nesting", 12), ("huge_strings", 12), ("wrong_types", 50),
    ("hostile_ids", 50), ("pickled", 12), ("other_callables", 20), ("job_shape", 15), ("raw_job_hash", 25)])
def test_worker_answers_hostile_jobs_with_invalid_request(category: str, examples: int, harness: Harness) -> None:
    @settings(FEW, max_examples=examples)
    @given(WORKER[category])
    def answered(job: Job) -> None:
        harness.run(category, job)

    answered()
    harness.assert_healthy()
    assert harness.counts[category] > 0


def test_enqueue_refuses_a_job_id_outside_rqs_alphabet_before_writing(harness: Harness) -> None:
    @FEW
    @given(BAD_IDS.filter(lambda s: re.fullmatch(r"[A-Za-z0-9_-]+", s) is None))
    def refused(job_id: str) -> None:
        harness.counts["hostile_job_ids"] += 1
        before = harness.redis.dbsize()
        with pytest.raises(ValueError, match=r"(?i)job.?id"):
            jobs.enqueue(harness.queue, _request().encode(), job_id, SETTINGS)
        assert harness.redis.dbsize() == before

    refused()
    assert harness.counts["hostile_job_ids"] > 0


@pytest.mark.parametrize("request_id", ["req.1", "tenant:req-1"])
def test_client_refuses_request_ids_rq_cannot_carry_with_a_clear_error(request_id: str, harness: Harness) -> None:
    # Valid session ids, but a request id is the RQ job id, which RQ limits to [A-Za-z0-9_-].
    assert rules.is_valid_id(request_id)
    before = harness.redis.dbsize()

    with pytest.raises(ForkError) as err:
        Client(harness.redis, SETTINGS).fork(MISSING, request_id=request_id, timeout=TIMEOUT)

    assert err.value.code is ErrorCode.INVALID_REQUEST and "[A-Za-z0-9_-]" in err.value.message
    assert harness.redis.dbsize() == before


# -- poison that would kill a plain RQ worker (each test runs a worker of its own, on a queue of its own) -


@dataclass(frozen=True)
class Lone:
    redis: Redis
    queue: rq.Queue
    proc: subprocess.Popen[bytes]

    def assert_refused_and_alive(self, job_id: str) -> None:
        """``job_id`` ends INVALID_REQUEST, and the worker then answers a valid request."""
        # Refusals take milliseconds: 3 s keeps the expected failures of these tests cheap.
        def stored_or_dead() -> bool:
            return stored_outcome(self.redis, job_id) is not None or self.proc.poll() is not None
        wait_until(stored_or_dead, 3.0, f"an outcome for {job_id!r}")
        reply = wait_for_reply(self.redis, job_id, SETTINGS.reply_channel, 0.1)
        assert reply is not None, f"no outcome for {job_id!r}; the worker exited with {self.proc.poll()}"
        assert isinstance(reply, ForkFailure) and reply.code == ErrorCode.INVALID_REQUEST.value, reply
        served = Client(self.redis, Settings(queue=self.queue.name)).fork(MISSING, timeout=3.0)
        assert isinstance(served, ForkFailure) and served.code == ErrorCode.SESSION_NOT_FOUND.value


@pytest.fixture
def lone(hostile_server: EmbeddedServer, tmp_path: Path) -> Iterator[Lone]:
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    with _worker(hostile_server, tmp_path / "worker.log", queue) as proc, hostile_server.client() as redis:
        yield Lone(redis, jobs.make_queue(redis, Settings(queue=queue)), proc)


@pytest.mark.parametrize("shape", sorted(FATAL_NESTING))
def test_worker_survives_a_request_nested_10000_deep(shape: str, lone: Lone) -> None:
    job_id = f"deep-{shape.replace(' ', '-')}"
    _enqueue(lone.queue, FATAL_NESTING[shape], job_id)

    lone.assert_refused_and_alive(job_id)


def test_worker_refuses_a_queue_entry_with_an_invalid_job_id(lone: Lone) -> None:
    lone.redis.rpush(lone.queue.key, "bad.id")

    lone.assert_refused_and_alive("bad.id")


@pytest.mark.parametrize(("field", "value"), [("status", "bogus"), ("created_at", "yesterday"),
                                              ("dependency_ids", "[")])
def test_worker_refuses_a_job_hash_with_a_malformed_rq_field(field: str, value: str, lone: Lone) -> None:
    data = zlib.compress(json.dumps([jobs.JOB_FUNCTION, None, [_request()], {}]).encode())
    job_id = f"malformed-{field.replace('_', '-')}"
    lone.redis.hset(f"rq:job:{job_id}", mapping={"data": data, "origin": lone.queue.name, "status": "queued",
                                                 field: value})
    lone.redis.rpush(lone.queue.key, job_id)

    lone.assert_refused_and_alive(job_id)


def test_worker_refuses_a_job_hash_without_data(lone: Lone) -> None:
    lone.redis.hset("rq:job:no-data", mapping={"origin": lone.queue.name, "status": "queued"})
    lone.redis.rpush(lone.queue.key, "no-data")

    lone.assert_refused_and_alive("no-data")
