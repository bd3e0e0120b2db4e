"""Hostile input, property-based: whatever a queue carries, the request ends as a typed
``INVALID_REQUEST`` outcome, the worker survives and logs no traceback, nothing is executed, and
the registry is untouched. ``ForkService.parse`` is checked alone too (no server, many examples).

Case counts per category are printed and written to ``<pytest tmp>/hostile*/case-counts.json``.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import rq
from helpers import clean_environ, cli_args, stop, turn, wait_registered, worker_name
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis

from sessionfork import jobs, keys, rules
from sessionfork.client import Client
from sessionfork.config import Settings
from sessionfork.embedded import EmbeddedServer, wait_until
from sessionfork.errors import ErrorCode, ForkError
from sessionfork.registry import Registry
from sessionfork.replies import Outcomes, wait_for_reply
from sessionfork.service import ForkService
from sessionfork.wire import ForkFailure, ForkResult, Header

SETTINGS = Settings()
LIMIT = SETTINGS.max_request_bytes
SOURCE = "src"
TIMEOUT = 10.0
FEW = settings(max_examples=10, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def many(n: int) -> settings:
    return settings(FEW, max_examples=n)


# -- hostile payloads ------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class Case:
    """One hostile request payload; ``expect`` is a text the INVALID_REQUEST message must contain
    (the field to blame, or the reason when no field is)."""

    kind: str
    payload: str
    expect: str
    job_id: str | None = None

    def __repr__(self) -> str:  # payloads run to 200 KB: show their start and size only
        return f"Case({self.kind!r}, {self.payload[:120]!r}... ({len(self.payload)} chars), {self.expect!r})"


# Finite floats: NaN is not JSON, and a payload that is not JSON names no field (random_bytes covers it).
_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=20)
JSON = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                         max_size=4), max_leaves=12)
BAD_IDS = st.one_of(
    st.text(st.characters(max_codepoint=0x1F), min_size=1, max_size=8),  # control characters
    st.text(st.characters(min_codepoint=0x80), min_size=1, max_size=12),  # beyond ASCII
    st.text(min_size=1, max_size=12).map(lambda s: f"ok{s}\u202e"),  # a right-to-left override
    st.integers(129, 400).map(lambda n: "a" * n),  # too long
    st.just(""), st.text(max_size=40),
).filter(lambda s: not rules.is_valid_id(s))


def _request(**fields: Any) -> str:
    return json.dumps({"source": SOURCE, **fields})


random_bytes = st.binary(max_size=300).map(lambda b: Case("bytes", b.decode("latin-1"), "invalid request"))
json_values = JSON.filter(lambda v: not (isinstance(v, dict) and "source" in v)).map(
    lambda v: Case(type(v).__name__, json.dumps(v), "invalid request"))


@st.composite
def deep_nesting(draw: st.DrawFn) -> Case:
    depth = draw(st.integers(5_000, 12_000))
    arrays = "[" * depth + "]" * depth
    return draw(st.sampled_from([
        Case("array", arrays, "invalid request"),
        Case("object", '{"a":' * (depth // 2) + "1" + "}" * (depth // 2), "invalid request"),  # < 64 KiB
        Case("in source", f'{{"source":{arrays}}}', "source"),
        Case("in sessionIds", f'{{"source":"{SOURCE}","sessionIds":{arrays}}}', "sessionIds"),
    ]))


@st.composite
def huge_strings(draw: st.DrawFn) -> Case:
    size = draw(st.integers(LIMIT + 1, 4 * LIMIT))
    field = draw(st.sampled_from(["source", "sessionId", "replyTo", "requestId", "padding"]))
    text = "\u00e9" * (size // 2)  # two bytes each in UTF-8
    return Case(field, json.dumps({"source": SOURCE, field: text}, ensure_ascii=False), "over the limit")


_WRONG: dict[str, Callable[[Any], bool]] = {
    "source": lambda v: not isinstance(v, str) and not (isinstance(v, dict) and set(v) == {"id", "instance"}
                                                        and all(isinstance(x, str) for x in v.values())),
    "requestId": lambda v: not isinstance(v, str), "sessionId": lambda v: not isinstance(v, str),
    "replyTo": lambda v: not isinstance(v, str), "count": lambda v: type(v) is not int,
    "sessionIds": lambda v: not isinstance(v, list) or any(not isinstance(x, str) for x in v),
}


@st.composite
def wrong_types(draw: st.DrawFn) -> Case:
    field = draw(st.sampled_from(sorted(_WRONG)))
    value = draw(JSON.filter(_WRONG[field]))
    payload = json.dumps({"source": value}) if field == "source" else _request(**{field: value})
    return Case(field, payload, field)


@st.composite
def hostile_ids(draw: st.DrawFn) -> Case:
    bad = draw(BAD_IDS)
    place = draw(st.sampled_from(["source", "source.id", "sessionId", "sessionIds", "requestId", "replyTo", "job id"]))
    if place == "job id":  # RQ accepts it (its alphabet), sessionfork's rule does not (too long)
        return Case(place, _request(), "requestId", job_id="long-" + "a" * draw(st.integers(124, 300)))
    if place == "replyTo":
        bad = draw(BAD_IDS.filter(lambda s: not (0 < len(s) <= 256 and s.isascii() and s.isprintable())))
    payload, expect = {
        "source": (json.dumps({"source": bad}), "source"),
        "source.id": (json.dumps({"source": {"id": bad, "instance": "x"}}), "source"),
        "sessionIds": (_request(sessionIds=["ok-1", bad]), "sessionIds[1]"),
    }.get(place, (_request(**{place: bad}), place))
    return Case(place, payload, expect)


PARSE_CATEGORIES = {"random_bytes": random_bytes, "json_values": json_values, "deep_nesting": deep_nesting(),
                    "huge_strings": huge_strings(), "wrong_types": wrong_types(), "hostile_ids": hostile_ids()}


# -- unit level: ForkService.parse alone -----------------------------------------------------------


@pytest.fixture(scope="module")
def unit_counts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    yield counts
    _report("parse", counts, tmp_path_factory)


@pytest.mark.parametrize(("category", "examples"), [
    ("random_bytes", 1500), ("json_values", 1500), ("deep_nesting", 100), ("huge_strings", 100),
    ("wrong_types", 2000), ("hostile_ids", 2000)])
def test_parse_rejects_hostile_payloads_naming_the_field(category: str, examples: int,
                                                         unit_counts: Counter[str]) -> None:
    service = ForkService(cast(Registry, object()), cast(Outcomes, object()), reply_channel=keys.DEFAULT_REPLY_CHANNEL,
                          max_request_bytes=LIMIT, max_fanout=SETTINGS.max_fanout)

    @many(examples)
    @given(PARSE_CATEGORIES[category])
    def rejected(case: Case) -> None:
        unit_counts[category] += 1
        with pytest.raises(ForkError) as refused:
            service.parse(case.payload, case.job_id or "job-1")
        assert refused.value.code is ErrorCode.INVALID_REQUEST
        assert case.expect in refused.value.message

    rejected()
    assert unit_counts[category] > 0


# -- a running worker ------------------------------------------------------------------------------


class _Pickled:
    """Unpickling this runs ``touch <path>``: proof that someone unpickled a job."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return os.system, (f"touch {shlex.quote(str(self.path))}",)


class Harness:
    """The module's worker, its server, and the checks every hostile case must pass."""

    def __init__(self, redis: Redis, proc: subprocess.Popen[bytes], log: Path, sentinel: Path) -> None:
        self.redis, self.proc, self.log, self.sentinel = redis, proc, log, sentinel
        self.queue = jobs.make_queue(redis, SETTINGS)
        self.pickle_queue = rq.Queue(SETTINGS.queue, connection=redis)  # RQ's default: pickle
        self.counts: Counter[str] = Counter()
        self.sessions = self.session_keys()

    def session_keys(self) -> set[bytes]:
        return set(self.redis.scan_iter(match="sf:s:*", count=10_000))

    def new_id(self, category: str) -> str:
        return f"h-{category.replace('_', '-')}-{uuid.uuid4().hex[:16]}"

    def payload(self, category: str, case: Case) -> None:
        request_id = f"{case.job_id}-{uuid.uuid4().hex}" if case.job_id else self.new_id(category)
        jobs.enqueue(self.queue, case.payload.encode(), request_id, SETTINGS)
        self.check(category, case.kind, request_id, case.expect)

    def raw_job(self, category: str, kind: str, data: bytes) -> None:
        request_id = self.new_id(category)
        self.redis.hset(f"rq:job:{request_id}", mapping={"data": data, "origin": SETTINGS.queue, "status": "queued"})
        self.redis.rpush(self.queue.key, request_id)
        # Whatever RQ makes of the data, ForkWorker's refusal names sessionfork's job function.
        self.check(category, kind, request_id, "sessionfork")

    def check(self, category: str, kind: str, request_id: str, expect: str) -> None:
        self.counts[category] += 1
        self.counts[f"{category}/{kind}"] += 1
        reply = wait_for_reply(self.redis, request_id, keys.DEFAULT_REPLY_CHANNEL, TIMEOUT)
        assert isinstance(reply, ForkFailure), reply
        assert reply.code == ErrorCode.INVALID_REQUEST.value
        assert expect in reply.message
        assert self.proc.poll() is None, "the worker died"
        assert not self.sentinel.exists(), "a hostile job was executed"
        assert self.session_keys() == self.sessions, "a hostile request wrote to the registry"

    def assert_healthy(self) -> None:
        """The worker logged no traceback and still forks a valid request."""
        assert "Traceback" not in self.log.read_text(errors="replace")
        reply = Client(self.redis, SETTINGS).fork(SOURCE, timeout=TIMEOUT)
        assert isinstance(reply, ForkResult) and reply.ok, reply
        assert isinstance(reply.session, Header)
        created = self.session_keys() - self.sessions
        assert created <= {keys.session(reply.session.id).encode(), keys.session_children(SOURCE).encode()}
        self.sessions |= created


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def harness(hostile_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    workdir = tmp_path_factory.mktemp("hostile")
    redis = hostile_server.client()
    Registry(redis).append(Registry(redis).create(SOURCE), turn(1))
    name = worker_name("hostile")
    log = workdir / "worker.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cli_args(hostile_server.url, "worker", "--name", name, "--log-level", "WARNING"),
                                env=clean_environ(), stdin=subprocess.DEVNULL, stderr=sink)
    try:
        wait_registered(redis, name)
        h = Harness(redis, proc, log, workdir / "executed")
        yield h
        _report("worker", h.counts, tmp_path_factory)
    finally:
        stop(proc)
        redis.close()


def _report(level: str, counts: Counter[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("hostile-counts") / f"case-counts-{level}.json"
    path.write_text(json.dumps(dict(sorted(counts.items())), indent=2))
    print(f"\nhostile cases tried ({level}, {sum(v for k, v in counts.items() if '/' not in k)}): "
          f"{json.dumps(dict(sorted(counts.items())))}\n  -> {path}")


@pytest.mark.parametrize(("category", "examples"), [
    ("random_bytes", 25), ("json_values", 30), ("deep_nesting", 10), ("huge_strings", 10),
    ("wrong_types", 40), ("hostile_ids", 40)])
def test_worker_answers_hostile_payloads_with_invalid_request(category: str, examples: int, harness: Harness) -> None:
    @many(examples)
    @given(PARSE_CATEGORIES[category])
    def answered(case: Case) -> None:
        harness.payload(category, case)

    answered()
    harness.assert_healthy()
    assert harness.counts[category] > 0


_CALLABLES = ["os.system", "builtins.eval", "builtins.exec", "subprocess.run", "posix.system", "pickle.loads",
              "sessionfork.jobs.fork.__globals__", "sessionfork.jobs.Fork", " sessionfork.jobs.fork"]


def _hostile_args(function: str, sentinel: Path) -> tuple[Any, ...]:
    touch = f"touch {shlex.quote(str(sentinel))}"
    if function.startswith(("builtins.", "pickle.")):
        return (f"__import__('os').system({touch!r})",)
    return (["touch", str(sentinel)],) if function.startswith("subprocess") else (touch,)


def test_worker_refuses_pickled_jobs_without_unpickling(harness: Harness) -> None:
    @FEW
    @given(st.sampled_from(["malicious object", "valid request", "text"]), st.text(max_size=50))
    def refused(kind: str, text: str) -> None:
        arg = {"malicious object": _Pickled(harness.sentinel), "valid request": _request(), "text": text}[kind]
        request_id = harness.new_id("pickled")
        harness.pickle_queue.enqueue_call(jobs.JOB_FUNCTION, args=(arg,), job_id=request_id)
        harness.check("pickled", kind, request_id, "not a JSON sessionfork job")

    refused()
    harness.assert_healthy()
    assert harness.counts["pickled"] > 0


def test_worker_refuses_jobs_naming_other_callables(harness: Harness) -> None:
    @many(20)
    @given(st.sampled_from(_CALLABLES), st.booleans())
    def refused(function: str, pickled: bool) -> None:
        queue = harness.pickle_queue if pickled else harness.queue
        request_id = harness.new_id("other_callables")
        queue.enqueue_call(function, args=_hostile_args(function, harness.sentinel), job_id=request_id)
        expect = "not a JSON sessionfork job" if pickled else "this worker runs only sessionfork.jobs.fork"
        harness.check("other_callables", f"{function}{' (pickle)' if pickled else ''}", request_id, expect)

    refused()
    harness.assert_healthy()
    assert harness.counts["other_callables"] > 0


def test_worker_refuses_fork_jobs_of_the_wrong_shape(harness: Harness) -> None:
    shapes: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
        "no argument": ((), {}), "two arguments": ((_request(), _request()), {}),
        "keyword": ((), {"payload": _request()}), "extra keyword": ((_request(),), {"x": 1}),
    }

    @many(15)
    @given(st.sampled_from([*shapes, "not a string"]), JSON.filter(lambda v: not isinstance(v, str)))
    def refused(kind: str, value: Any) -> None:
        args, kwargs = shapes.get(kind, ((value,), {}))
        request_id = harness.new_id("job_shape")
        harness.queue.enqueue_call(jobs.JOB_FUNCTION, args=args, kwargs=kwargs, job_id=request_id)
        harness.check("job_shape", kind, request_id, "takes exactly one argument")

    refused()
    harness.assert_healthy()
    assert harness.counts["job_shape"] > 0


def test_worker_refuses_raw_job_hashes_with_hostile_data(harness: Harness) -> None:
    depth = 10_000
    data = st.one_of(
        st.binary(max_size=200).map(lambda b: ("bytes", b)),
        st.binary(max_size=200).map(lambda b: ("zlib bytes", zlib.compress(b))),
        JSON.map(lambda v: ("json", json.dumps(v).encode())),
        st.tuples(JSON, JSON, JSON).map(lambda t: ("3-list", json.dumps(list(t)).encode())),
        st.just(("10,000-deep array", b"[" * depth + b"]" * depth)),
        st.just(("10,000-deep 4th item", f'["x",null,[],{"[" * depth}{"]" * depth}]'.encode())),
    )

    @many(20)
    @given(data)
    def refused(kind_data: tuple[str, bytes]) -> None:
        harness.raw_job("raw_job_hash", *kind_data)

    refused()
    harness.assert_healthy()
    assert harness.counts["raw_job_hash"] > 0


def test_enqueue_refuses_a_control_or_unicode_job_id_before_writing(harness: Harness) -> None:
    @FEW
    @given(BAD_IDS.filter(lambda s: re.fullmatch(r"[A-Za-z0-9_-]+", s) is None))
    def refused(job_id: str) -> None:
        harness.counts["hostile_job_ids"] += 1
        before = harness.redis.dbsize()
        with pytest.raises(ValueError, match="Job ID"):
            jobs.enqueue(harness.queue, _request().encode(), job_id, SETTINGS)
        assert harness.redis.dbsize() == before

    refused()
    assert harness.counts["hostile_job_ids"] > 0


@pytest.mark.xfail(strict=True, reason="src bug: Client.submit raises RQ's ValueError for request ids with '.' or ':',"
                                       " which rules.is_valid_id accepts (RQ job ids allow only [A-Za-z0-9_-])")
@pytest.mark.parametrize("request_id", ["req.1", "tenant:req-1"])
def test_client_submits_every_request_id_the_id_rule_accepts(request_id: str, harness: Harness) -> None:
    assert rules.is_valid_id(request_id)

    reply = Client(harness.redis, SETTINGS).fork(SOURCE, request_id=request_id, timeout=TIMEOUT)

    assert reply.request_id == request_id


# -- poison that reaches RQ before ForkWorker can refuse it (each kills its own worker) -------------


@pytest.fixture
def lone_worker(hostile_server: EmbeddedServer, tmp_path: Path) -> Iterator[tuple[Redis, str, subprocess.Popen[bytes]]]:
    """A worker of its own on a queue of its own, so a poisoned worker harms no other test."""
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    name = worker_name("poison")
    redis = hostile_server.client()
    with (tmp_path / "worker.log").open("wb") as sink:
        proc = subprocess.Popen(cli_args(hostile_server.url, "--queue", queue, "worker", "--name", name,
                                         "--log-level", "WARNING"),
                                env=clean_environ(), stdin=subprocess.DEVNULL, stderr=sink)
    try:
        wait_registered(redis, name)
        yield redis, queue, proc
    finally:
        stop(proc)
        redis.close()


def _refused_and_alive(redis: Redis, proc: subprocess.Popen[bytes], job_id: str) -> None:
    # A refusal takes milliseconds; 3 s keeps the (expected) failures of these tests cheap.
    stored = lambda: redis.hget(keys.request(job_id), "outcome") is not None  # noqa: E731
    wait_until(lambda: stored() or proc.poll() is not None, 3.0, f"an outcome for {job_id!r} or a dead worker")
    assert proc.poll() is None, f"the worker exited ({proc.returncode}) on job {job_id!r}"
    reply = wait_for_reply(redis, job_id, keys.DEFAULT_REPLY_CHANNEL, TIMEOUT)
    assert isinstance(reply, ForkFailure) and reply.code == ErrorCode.INVALID_REQUEST.value, reply


@pytest.mark.xfail(strict=True, reason="src bug: ForkWorker does not guard RQ's dequeue: Job(id) raises ValueError on "
                                       "an id outside [A-Za-z0-9_-], the worker quits (exit 0) and every restart "
                                       "quits again in the intermediate-queue cleanup")
def test_queue_entry_with_an_invalid_job_id_is_refused_and_the_worker_survives(
        lone_worker: tuple[Redis, str, subprocess.Popen[bytes]]) -> None:
    redis, queue, proc = lone_worker
    redis.rpush(f"rq:queue:{queue}", "bad.id")

    _refused_and_alive(redis, proc, "bad.id")


@pytest.mark.xfail(strict=True, reason="src bug: ForkWorker does not guard RQ's Job.restore: a malformed RQ field "
                                       "raises in dequeue, the worker quits (exit 0) and restarts quit again")
@pytest.mark.parametrize("field", [("status", "bogus"), ("created_at", "yesterday"), ("dependency_ids", "[")],
                         ids=lambda f: f[0])
def test_job_hash_with_a_malformed_rq_field_is_refused_and_the_worker_survives(
        field: tuple[str, str], lone_worker: tuple[Redis, str, subprocess.Popen[bytes]]) -> None:
    redis, queue, proc = lone_worker
    job_id = f"malformed-{field[0].replace('_', '-')}"
    data = json.dumps([jobs.JOB_FUNCTION, None, [_request()], {}]).encode()
    redis.hset(f"rq:job:{job_id}", mapping={"data": zlib.compress(data), "origin": queue, "status": "queued",
                                            field[0]: field[1]})
    redis.rpush(f"rq:queue:{queue}", job_id)

    _refused_and_alive(redis, proc, job_id)


@pytest.mark.xfail(strict=True, reason="src bug: a job hash without 'data' is dropped by RQ's dequeue "
                                       "(NoSuchJobError) and its request never gets an outcome")
def test_job_hash_without_data_gets_an_invalid_request_outcome(
        lone_worker: tuple[Redis, str, subprocess.Popen[bytes]]) -> None:
    redis, queue, proc = lone_worker
    redis.hset("rq:job:no-data", mapping={"origin": queue, "status": "queued"})
    redis.rpush(f"rq:queue:{queue}", "no-data")

    _refused_and_alive(redis, proc, "no-data")
