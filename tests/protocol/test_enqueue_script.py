"""The enqueue script (``protocol/scripts/enqueue.lua``) on a real server: it sees conflicts with jobs
whichever client queued them, validates before it writes, compares numbers
exactly, agrees with ``wire.identity`` on random requests, and runs as the
``sf_enqueue`` function of the library ``sessionfork load-functions`` loads.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import msgspec
import pytest
from helpers import SETTINGS, make_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis
from redis.exceptions import ResponseError

from sessionfork.aio import AsyncClient
from sessionfork.core import keys, wire
from sessionfork.core.config import Settings
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol import enqueue as enqueue_module

QUEUE = "rq:queue:sessionfork"


def raw(redis: Redis, request: dict[str, Any] | str, *fields: Any, rid: str = "r1", route: str = "EVAL",
        fourth: str | None = "rq:queues") -> int:
    """Today's EVAL recipe (or FCALL), as a producer in any language sends it."""
    text = request if isinstance(request, str) else json.dumps(request)
    head = (route, enqueue_module.SOURCE) if route == "EVAL" else (route, enqueue_module.FUNCTION)
    call_keys = [f"rq:job:{rid}", QUEUE, keys.request(rid), *([fourth] if fourth else [])]
    return int(redis.execute_command(*head, len(call_keys), *call_keys, rid, text, *fields))  # type: ignore[no-untyped-call]


def nothing_written(redis: Redis, rid: str) -> bool:
    return not redis.exists(f"rq:job:{rid}", keys.request(rid)) and redis.llen(QUEUE) == 0


# -- conflicts with jobs the Python clients queued (zlib-compressed data) ------------


def test_a_raw_producer_sees_a_conflict_with_a_job_the_sync_client_queued(redis: Redis) -> None:
    client = make_client(redis)
    client.submit(client.request("sa", session_id="c1", request_id="py-1"))
    assert redis.hget("rq:job:py-1", "data")[:1] == b"x"  # type: ignore[index]  # zlib: not JSON
    assert raw(redis, {"requestId": "py-1", "source": "sb", "sessionId": "c1"}, rid="py-1") == -1
    assert raw(redis, {"requestId": "py-1", "source": "sa", "sessionId": "c1", "replyTo": "x"}, rid="py-1") == 0
    assert redis.lrange(QUEUE, 0, -1) == [b"py-1"]


def test_a_raw_producer_sees_a_conflict_with_a_job_the_asyncio_client_queued(server: EmbeddedServer,
                                                                             redis: Redis) -> None:
    async def main() -> None:
        async with AsyncClient.from_url(server.url, SETTINGS) as client:
            await client.submit(await client.request("sa", count=2, request_id="aio-1"))

    asyncio.run(main())
    assert raw(redis, {"requestId": "aio-1", "source": "sa", "count": 3}, rid="aio-1") == -1
    assert raw(redis, {"requestId": "aio-1", "source": "sa", "count": 2}, rid="aio-1") == 0


def test_the_python_clients_see_a_conflict_with_a_raw_producers_job(redis: Redis) -> None:
    assert raw(redis, {"requestId": "rw-1", "source": "sa"}, rid="rw-1") == 1
    client = make_client(redis)
    request = client.request("sb", request_id="rw-1")
    assert client._enqueuers[0](*enqueue_module.job_call("rw-1", wire.encode(request), client.settings,
                                                    __import__("datetime").datetime.now())) == -1


# -- validate before writing ---------------------------------------------------------


@pytest.mark.parametrize("fields", [("origin",), ("origin", "q", "status")])
def test_an_odd_number_of_job_fields_writes_nothing_and_a_correct_retry_enqueues(redis: Redis,
                                                                                 fields: tuple[str, ...]) -> None:
    request = {"requestId": "odd-1", "source": "sa"}
    with pytest.raises(ResponseError, match="pairs"):
        raw(redis, request, *fields, rid="odd-1")
    assert nothing_written(redis, "odd-1")
    assert raw(redis, request, "origin", "sessionfork", rid="odd-1") == 1
    assert redis.lrange(QUEUE, 0, -1) == [b"odd-1"] and redis.hget("rq:job:odd-1", "origin") == b"sessionfork"


@pytest.mark.parametrize(("key", "value"), [("rq:queues", "a string"), (QUEUE, "a string")])
def test_a_key_of_the_wrong_type_writes_nothing(redis: Redis, key: str, value: str) -> None:
    redis.set(key, value)
    with pytest.raises(ResponseError, match="not a"):
        raw(redis, {"requestId": "wt-1", "source": "sa"}, "origin", "q", rid="wt-1")
    assert not redis.exists("rq:job:wt-1") and redis.get(key) == value.encode()


def test_a_job_key_not_named_after_the_request_id_writes_nothing(redis: Redis) -> None:
    with pytest.raises(ResponseError, match="KEYS"):
        redis.eval(enqueue_module.SOURCE, 3, "rq:job:other", QUEUE, keys.request("id-1"), "id-1", "{}")
    assert not redis.exists("rq:job:other") and redis.llen(QUEUE) == 0


# -- numbers compared exactly ------------------------------------------------------


@pytest.mark.parametrize("claimed", [False, True])
def test_boundaries_two_to_the_53_and_one_more_are_different_requests(redis: Redis, claimed: bool) -> None:
    first = {"requestId": "big", "source": "sa", "sessionId": "c", "boundary": 2**53}
    assert raw(redis, first, rid="big") == 1
    if claimed:  # as the worker keeps it when it claims the id
        redis.hset(keys.request("big"), "request", wire.identity(wire.decode_request(json.dumps(first))))
    assert raw(redis, {**first, "boundary": 2**53 + 1}, rid="big") == -1
    assert raw(redis, {**first, "boundary": 2**53}, rid="big") == 0
    assert raw(redis, '{"boundary": 9007199254740992, "source": "sa", "sessionId": "c"}', rid="big") == 0


# -- one identity, Python's, field by field ---------------------------------------------


def test_the_scripts_identity_fields_are_pythons() -> None:
    """The script's copy of ``wire.identity``'s definition (its fields, in order, and how many are
    always kept) is Python's: a change to either side fails here."""
    listed = re.search(r"local FIELDS = \{([^}]*)\}", enqueue_module.SOURCE)
    kept = re.search(r"^local KEPT = (\d+) ", enqueue_module.SOURCE, flags=re.M)
    assert listed is not None and kept is not None
    assert tuple(re.findall(r"'([^']*)'", listed.group(1))) == wire.IDENTITY_FIELDS
    assert int(kept.group(1)) == wire.IDENTITY_KEPT


ids = st.text("ab1.e-\"\\/\u00e9\u2028", min_size=1, max_size=4)  # digits, dots, escapes, non-ASCII
handles = st.builds(wire.LiveHandle, id=ids, instance=st.text("xy", min_size=1, max_size=2))
numbers = st.one_of(st.integers(0, 3), st.integers(2**53 - 1, 2**53 + 2), st.integers(2**63 - 2, 2**64 - 1))


values = st.recursive(st.one_of(st.none(), st.booleans(), numbers, ids, st.sampled_from([1.5, -0.0, 1e300, 2.0])),
                      lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(ids, inner, max_size=2)),
                      max_leaves=4)
edits = st.fixed_dictionaries({"type": ids}, optional={"data": values, "surfaceOp": values, "a\u00e9": values})


@st.composite
def requests(draw: st.DrawFn) -> wire.ForkRequest:
    kind = draw(st.sampled_from(["one", "id", "ids", "count"]))
    extra: dict[str, Any] = {}
    if kind == "id":
        extra["session_id"] = draw(ids)
    elif kind == "ids":
        extra["session_ids"] = draw(st.lists(ids, min_size=1, max_size=3))
    elif kind == "count":
        extra["count"] = draw(numbers)
    if draw(st.booleans()):
        extra["boundary"] = draw(numbers)
    if draw(st.booleans()):
        extra["if_length"] = draw(numbers)
    if kind != "id" and draw(st.booleans()):  # variants: exclusive with the child fields and edits
        extra.pop("session_ids", None)
        extra.pop("count", None)
        extra["variants"] = draw(st.lists(st.builds(
            wire.Variant, session_id=st.one_of(st.just(msgspec.UNSET), ids),
            edits=st.one_of(st.just(msgspec.UNSET), st.lists(edits, min_size=1, max_size=2))), min_size=1, max_size=2))
    elif draw(st.booleans()):
        extra["edits"] = draw(st.lists(edits, min_size=1, max_size=2))
    if draw(st.booleans()):
        extra["summary"] = wire.Summary(keep_from=draw(numbers), data=draw(values))
    if draw(st.booleans()):
        extra["reply_to"] = draw(st.sampled_from(["sf:replies", "sf:replies:1.5e3", "sf:replies:12345678901234567"]))
    return wire.ForkRequest(source=draw(st.one_of(ids, handles)), request_id="prop", **extra)


def _json_text(request: wire.AnyRequest, shuffled: bool) -> str:
    """The request as another language might write it: keys in any order, spaces, escapes. (A
    fraction, an exponent or 16 digits anywhere sends the script down its exact, slower reader.)"""
    body = msgspec.to_builtins(request)
    items = sorted(body.items(), reverse=shuffled)
    return json.dumps(dict(items), indent=1 if shuffled else None, ensure_ascii=shuffled)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=requests(), second=requests(), same_source=st.booleans(), shuffled=st.booleans())
def test_the_script_and_wire_identity_agree_on_random_requests(redis: Redis, first: wire.ForkRequest,
                                                               second: wire.ForkRequest, same_source: bool,
                                                               shuffled: bool) -> None:
    if same_source:  # make equal identities frequent
        second = msgspec.structs.replace(first, reply_to=second.reply_to)
    expected = 0 if wire.identity(first) == wire.identity(second) else -1
    redis.flushall()
    client = make_client(redis)
    client.submit(first)  # queued by the sync client: compressed data, the identity field compared
    assert raw(redis, _json_text(second, shuffled), rid="prop") == expected
    redis.delete("rq:job:prop")  # claimed, the job gone: the identity the worker keeps is compared
    redis.hset(keys.request("prop"), mapping={"digest": "d", "request": wire.identity(first)})
    assert raw(redis, _json_text(second, shuffled), rid="prop") == expected


# -- merges' and selects' identity, Python's ------------------------------------------

ranges = st.builds(wire.MergeRange, from_seq=numbers, to_seq=numbers)
unset = st.just(msgspec.UNSET)


@st.composite
def merge_requests(draw: st.DrawFn) -> wire.MergeRequest | wire.SelectRequest:
    """A merge or a select, any of its fields given or not (the script compares, the worker validates)."""
    common: dict[str, Any] = {
        "parent": draw(st.one_of(ids, handles)), "mode": draw(st.sampled_from(["summary", "events"])),
        "summary": draw(st.one_of(unset, values)), "range": draw(st.one_of(unset, ranges)),
        "if_parent_length": draw(st.one_of(unset, numbers)), "if_child_length": draw(st.one_of(unset, numbers)),
        "reply_to": draw(st.one_of(unset, st.sampled_from(["sf:replies", "sf:replies:2"]))), "request_id": "prop"}
    if draw(st.booleans()):
        return wire.MergeRequest(op="merge", child=draw(ids), **common)
    candidates = draw(st.lists(ids, min_size=1, max_size=3))
    winner = draw(st.one_of(st.sampled_from(candidates), ids))
    return wire.SelectRequest(op="select", candidates=candidates, winner=winner, **common)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.one_of(merge_requests(), requests()), second=st.one_of(merge_requests(), requests()),
       same=st.sampled_from(["no", "reply", "one field"]), field=st.integers(0, 20), shuffled=st.booleans())
def test_the_script_and_wire_identity_agree_on_random_merges_and_selects(redis: Redis, first: wire.AnyRequest,
                                                                         second: wire.AnyRequest, same: str,
                                                                         field: int, shuffled: bool) -> None:
    """As for forks: a merge or a select against another (or a fork: a different request), queued
    or claimed; ``same`` makes equal identities (``reply``: only the reply channel differs) and
    identities one field apart (``one field``: ``first`` with one field of ``second``) frequent."""
    if same != "no" and type(second) is type(first):
        names = [f.name for f in msgspec.structs.fields(first) if f.name not in ("op", "request_id")]
        name = "reply_to" if same == "reply" else names[field % len(names)]
        second = msgspec.structs.replace(first, **{name: getattr(second, name)})
    expected = 0 if wire.identity(first) == wire.identity(second) else -1
    redis.flushall()
    make_client(redis).submit(first)
    assert raw(redis, _json_text(second, shuffled), rid="prop") == expected
    redis.delete("rq:job:prop")
    redis.hset(keys.request("prop"), mapping={"digest": "d", "request": wire.identity(first)})
    assert raw(redis, _json_text(second, shuffled), rid="prop") == expected


# -- the same script as a Redis function ---------------------------------------------


def test_the_library_is_the_script_and_fcall_answers_as_eval(redis: Redis) -> None:
    assert enqueue_module.load_library(redis) == "sessionfork"
    assert enqueue_module.load_library(redis) == "sessionfork"  # again: replaced, not an error
    request = {"requestId": "fc-1", "source": "sa"}
    assert raw(redis, request, "origin", "q", rid="fc-1", route="FCALL") == 1
    assert raw(redis, request, rid="fc-1", route="FCALL") == 0
    assert raw(redis, {**request, "source": "sb"}, rid="fc-1", route="FCALL") == -1
    with pytest.raises(ResponseError, match="pairs"):
        raw(redis, request, "odd", rid="fc-2", route="FCALL")
    assert not redis.exists("rq:job:fc-2")


@pytest.mark.parametrize(("mode", "loaded", "used"), [("auto", True, "fcall"), ("auto", False, "evalsha"),
                                                      ("eval", True, "evalsha"), ("fcall", True, "fcall")])
def test_the_clients_route_follows_the_setting_and_the_library(redis: Redis, mode: str, loaded: bool,
                                                               used: str) -> None:
    redis.function_flush()
    if loaded:
        enqueue_module.load_library(redis)
    redis.config_resetstat()
    client = make_client(redis, enqueue=mode)
    client.submit(client.request("sa", request_id="route-1"))
    assert redis.lrange(QUEUE, 0, -1) == [b"route-1"]
    stats: Any = redis.info("commandstats")
    assert f"cmdstat_{used}" in stats
    assert ("cmdstat_evalsha" in stats) == (used == "evalsha")


def test_fcall_mode_without_the_library_names_the_command_that_loads_it(redis: Redis) -> None:
    redis.function_flush()
    client = make_client(redis, enqueue="fcall")
    with pytest.raises(ResponseError, match="load-functions"):
        client.submit(client.request("sa", request_id="nolib-1"))
    assert nothing_written(redis, "nolib-1")


def test_an_unknown_enqueue_mode_is_a_config_error() -> None:
    from sessionfork.core.config import ConfigError, from_environ

    with pytest.raises(ConfigError, match="SESSIONFORK_ENQUEUE"):
        from_environ({"SESSIONFORK_ENQUEUE": "lua"})
    assert from_environ({"SESSIONFORK_ENQUEUE": "fcall"}).enqueue == "fcall" and Settings().enqueue == "auto"


def test_the_job_function_is_one_constant_whoever_writes_data(redis: Redis) -> None:
    import zlib

    from sessionfork.protocol import rq_layout as layout

    assert raw(redis, {"requestId": "fn-1", "source": "sa"}, rid="fn-1") == 1  # the script's default data
    by_script = json.loads(redis.hget("rq:job:fn-1", "data") or b"")
    client = make_client(redis)
    client.submit(client.request("sa", request_id="fn-2"))  # the clients' data: rq_layout.job_fields
    by_client = json.loads(zlib.decompress(redis.hget("rq:job:fn-2", "data") or b""))
    assert by_script[0] == by_client[0] == layout.JOB_FUNCTION
    assert by_script[1:] == [None, ['{"requestId": "fn-1", "source": "sa"}'], {}] and by_client[1] is None


def test_a_job_an_older_script_queued_is_compared_through_its_plain_json_data(redis: Redis) -> None:
    request = '{"requestId": "old-1", "source": "sa", "boundary": 9007199254740993}'
    redis.hset("rq:job:old-1", mapping={"data": json.dumps(["sessionfork.jobs.fork", None, [request], {}]),
                                        "status": "queued"})  # no sf_identity: written before it existed
    redis.rpush(QUEUE, "old-1")
    assert raw(redis, {"requestId": "old-1", "source": "sa", "boundary": 2**53}, rid="old-1") == -1
    assert raw(redis, request, rid="old-1") == 0
    assert redis.llen(QUEUE) == 1


def test_a_library_of_another_release_is_never_run_by_the_clients(redis: Redis) -> None:
    stale = enqueue_module.library().replace(enqueue_module.VERSIONED, "sf_enqueue_000000000000")
    redis.function_load(stale, replace=True)  # as an older release loaded it
    client = make_client(redis, enqueue="fcall")
    with pytest.raises(ResponseError, match="load-functions"):
        client.submit(client.request("sa", request_id="stale-1"))
    assert nothing_written(redis, "stale-1")
    enqueue_module.load_library(redis)
    client.submit(client.request("sa", request_id="stale-1"))
    assert redis.lrange(QUEUE, 0, -1) == [b"stale-1"]


# -- a request over the limit is refused before it is read ----------------------------


def test_the_scripts_limits_are_the_workers() -> None:
    from sessionfork.core import rules, settings
    from sessionfork.protocol.requests import Limits

    def constant(name: str) -> int:
        found = re.search(rf"^local {name} = (\d+) ", enqueue_module.SOURCE, re.MULTILINE)
        assert found is not None, name
        return int(found.group(1))

    assert constant("MAX_REQUEST_BYTES") == settings.REQUEST_LIMIT == Settings().max_request_bytes
    assert Limits().max_request_bytes == settings.REQUEST_LIMIT == settings.BOUNDS["max_request_bytes"][1]
    assert constant("MAX_DATA_DEPTH") == rules.MAX_DATA_DEPTH


@pytest.mark.parametrize("route", ["EVAL", "EVALSHA", "FCALL", "VERSIONED"])
def test_a_request_over_the_limit_is_refused_naming_it_on_every_route_and_one_at_it_enqueues(
        redis: Redis, route: str) -> None:
    from sessionfork.core.settings import REQUEST_LIMIT

    enqueue_module.load_library(redis)
    head = {"EVAL": ("EVAL", enqueue_module.SOURCE), "EVALSHA": ("EVALSHA", redis.script_load(enqueue_module.SOURCE)),
            "FCALL": ("FCALL", enqueue_module.FUNCTION), "VERSIONED": ("FCALL", enqueue_module.VERSIONED)}[route]
    body = '{"requestId":"lim","source":"sa","summary":{"keepFrom":1,"data":"%s"}}'
    at_limit = body % ("x" * (REQUEST_LIMIT - len(body % "")))
    call_keys = ["rq:job:lim", QUEUE, keys.request("lim")]

    def answer(text: str) -> Any:
        try:
            return redis.execute_command(*head, 3, *call_keys, "lim", text)  # type: ignore[no-untyped-call]
        except ResponseError as exc:
            return str(exc)

    assert answer(at_limit + " ") == f"enqueue: request is {REQUEST_LIMIT + 1} bytes, over the limit of {REQUEST_LIMIT}"
    assert nothing_written(redis, "lim")
    assert len(at_limit.encode()) == REQUEST_LIMIT
    assert answer(at_limit) == 1


def test_the_python_clients_refuse_a_request_over_the_limit_before_sending_it(redis: Redis) -> None:
    from sessionfork import NewEvent
    from sessionfork.core.errors import ErrorCode, ForkError
    from sessionfork.core.settings import REQUEST_LIMIT

    client = make_client(redis)
    redis.config_resetstat()
    with pytest.raises(Exception) as raised:  # which one is the point: asserted below
        client.submit(client.request("sa", request_id="big-1", edits=[NewEvent("x", "y" * REQUEST_LIMIT)]))
    assert isinstance(raised.value, ForkError) and raised.value.code is ErrorCode.INVALID_REQUEST, raised.value
    assert f"over the limit of {REQUEST_LIMIT}" in raised.value.message
    stats: Any = redis.info("commandstats")
    assert not any(name in stats for name in ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval"))
    assert nothing_written(redis, "big-1")



@pytest.mark.parametrize("padding", [70_000, 500_000])  # the request over the limit; its job data too big to read
def test_a_job_an_older_script_queued_over_the_limit_is_a_different_request(redis: Redis, padding: int) -> None:
    """A request over the limit (queued by RQ's own enqueue, say) is refused by the worker: a
    request within it, even the same but for its spaces, is not answered by that refusal (-1)."""
    request = '{"requestId": "old-2", "source": "sa"}'
    redis.hset("rq:job:old-2", mapping={"data": json.dumps(["sessionfork.jobs.fork", None, [request + " " * padding],
                                                            {}]), "status": "queued"})
    assert raw(redis, request, rid="old-2") == -1
    assert redis.llen(QUEUE) == 0


# -- one identity for the raw request and the worker's kept form, at every depth ------

scalars = st.one_of(st.sampled_from([1.5, -0.0, 1e300, 2.0, 0.1, 5e-324, "", None, True]),
                    st.integers(-(2**63), 2**64 - 1), ids)


@st.composite
def deep_values(draw: st.DrawFn) -> Any:
    """A value nested 0 to MAX_DATA_DEPTH levels (the worker's whole range, its deepest often), its
    leaf and its siblings floats, empty containers, big integers, keys in any order."""
    from sessionfork.core import rules

    def leaf(inside: int) -> Any:  # a leaf within ``inside`` containers: an empty one only if there is room
        return draw(scalars if inside >= rules.MAX_DATA_DEPTH else scalars | st.sampled_from([{}, []]))

    wraps = draw(st.integers(0, rules.MAX_DATA_DEPTH) | st.just(rules.MAX_DATA_DEPTH))
    value = leaf(wraps)
    for n in range(wraps):  # the n-th container from the inside sits within wraps - n - 1 others
        siblings = [leaf(wraps - n) for _ in range(draw(st.integers(0, 1)))]
        if draw(st.booleans()):
            value = [value, *siblings]
        else:
            value = {draw(ids): value, **{f"k{i}": s for i, s in enumerate(siblings)}}
    return value


@st.composite
def deep_requests(draw: st.DrawFn) -> wire.ForkRequest:
    data = draw(deep_values())
    place = draw(st.sampled_from(["edits", "variants", "summary"]))
    edit = {"type": "x", "data": data}
    if place == "edits":
        return wire.ForkRequest(source="sa", request_id="deep", edits=[edit])
    if place == "variants":
        return wire.ForkRequest(source="sa", request_id="deep", variants=[wire.Variant(edits=[edit])])
    return wire.ForkRequest(source="sa", request_id="deep", summary=wire.Summary(keep_from=1, data=data))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=deep_requests(), second=deep_requests(), shuffled=st.booleans())
def test_the_script_reads_a_raw_request_and_the_workers_kept_form_alike_at_every_accepted_depth(
        redis: Redis, first: wire.ForkRequest, second: wire.ForkRequest, shuffled: bool) -> None:
    from sessionfork.protocol.requests import Limits, parse

    text = _json_text(first, shuffled)
    kept = wire.identity(parse(text, "deep", Limits()))  # the worker accepts it, and keeps this
    redis.flushall()
    assert raw(redis, text, rid="deep") == 1
    redis.delete("rq:job:deep")
    redis.hset(keys.request("deep"), mapping={"digest": "d", "request": kept})
    assert raw(redis, text, rid="deep") == 0  # the identical retry, once the worker holds the request
    other = _json_text(second, not shuffled)
    assert raw(redis, other, rid="deep") == (0 if wire.identity(second) == kept else -1)


def test_a_select_with_its_candidates_reordered_is_another_request(redis: Redis) -> None:
    """docs/guarantees.md: the candidates' order is part of a select's identity, for the enqueue
    script (a raw producer's ``-1``) and for the clients' digest (their ``IDEMPOTENCY_CONFLICT``)."""
    first = {"op": "select", "parent": "p", "candidates": ["a", "b"], "winner": "a", "mode": "events"}
    assert raw(redis, first, rid="sel-1") == 1
    assert raw(redis, first, rid="sel-1") == 0  # the same request
    assert raw(redis, {**first, "candidates": ["b", "a"]}, rid="sel-1") == -1
    assert redis.llen(QUEUE) == 1
    client = make_client(redis)
    ordered = client.select_request("p", ["a", "b"], "a", mode="events", request_id="sel-2")
    reordered = client.select_request("p", ["b", "a"], "a", mode="events", request_id="sel-2")
    assert wire.digest(ordered) != wire.digest(reordered)
