"""Model-based test: random create/append/fork/snapshot/dispose sequences, forks at any boundary
included, against the real registry agree with a small in-memory model, outcome by outcome, and in
every session's stored state."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis import Redis

from sessionfork.core import errors, forks
from sessionfork.core.errors import ForkError
from sessionfork.core.registry import Registry, SessionRef
from sessionfork.core.wire import UNSET, Header, LiveHandle, NewEvent, SeedMeta

IDS = [f"s{i}" for i in range(8)]
REQUESTS = [None, "r0", "r1"]
CHUNKS = {
    "open": ["turn/start"],
    "step": ["step/start"],
    "user": ["user/message"],
    "tool": ["tool/call"],
    "close": ["turn/end"],
    "whole turn": ["turn/start", "user/message", "assistant/message", "turn/end"],
    "close and reopen": ["turn/end", "turn/start"],
    "standalone": ["todo/write"],
}
STALE_TOKEN = "stale-token"

ids = st.sampled_from(IDS)
ref_kinds = st.sampled_from(["id", "handle", "stale"])
live_kinds = st.sampled_from(["id", "handle"])
cwds = st.sampled_from([None, "/w", ""])
chunks = st.sampled_from(sorted(CHUNKS))
requests = st.sampled_from(REQUESTS)

StoredEvent = tuple[str, int, int, Any]  # (type, seq, time, data)
Outcome = tuple[str, Any]


@dataclass
class ModelSession:
    header: Header
    token: str
    events: list[StoredEvent] = field(default_factory=list)
    live: bool = True
    request: str | None = None
    children: set[str] = field(default_factory=set)


def outcome_of(action: Any, label: str = "") -> Outcome:
    try:
        result: Outcome = ("ok", action())
    except ForkError as exc:
        result = ("error", (exc.code, exc.message))
    if label:  # shown by --hypothesis-show-statistics
        event(f"{label}: {result[0] if result[0] == 'ok' else result[1][0].value}")
    return result


def error(exc: ForkError) -> Outcome:
    return ("error", (exc.code, exc.message))


class ForkMachine(RuleBasedStateMachine):
    def __init__(self, client: Redis) -> None:
        super().__init__()
        client.flushdb()
        self.now = 1_000
        tokens = count()
        self.registry = Registry(client, clock=lambda: self.now, new_token=lambda: f"tok-{next(tokens)}")
        self.sessions: dict[str, ModelSession] = {}
        self.seen_tokens: set[str] = set()

    # -- helpers -----------------------------------------------------------------------------------

    def tick(self) -> None:
        self.now += 1

    def ref(self, sid: str, kind: str) -> tuple[SessionRef, bool]:
        """A reference to ``sid`` and whether it is stale."""
        if kind == "id":
            return sid, False
        if kind == "handle":
            known = self.sessions.get(sid)
            return LiveHandle(sid, known.token if known else "unknown-token"), False
        return LiveHandle(sid, STALE_TOKEN), True

    def source_error(self, sid: str, stale: bool) -> ForkError | None:
        session = self.sessions.get(sid)
        if session is None or not session.live:
            return errors.not_found(sid)
        if stale:
            return errors.not_live(sid)
        return None

    def boundary_error(self, sid: str, boundary: int | None = None) -> ForkError | None:
        events = self.sessions[sid].events
        if boundary is None:
            if events and events[-1][0] != "turn/end":
                return errors.open_turn(sid, events[-1][0])
            return None
        if boundary < 0:
            return errors.boundary_negative(sid, boundary)
        if boundary >= len(events):
            return errors.boundary_past_end(sid, boundary, len(events))
        for kind, seq, _, _ in reversed(events[: boundary + 1]):
            if kind == "turn/start":
                return errors.boundary_inside_turn(sid, boundary, seq)
            if kind == "turn/end":
                return None
        return None

    def boundaries(self, data: st.DataObject, sid: str) -> int | None:
        # Any seq, a few past either end, often a turn/end or a seq inside the inherited seed (the
        # cases that need the ancestors' turn indexes). None: the plain fork at the end of the log.
        session = self.sessions.get(sid)
        events = session.events if session else []
        seed = session.header.seed_length if session and session.header.seed_length is not UNSET else 0
        choices = st.none() | st.integers(min_value=-1, max_value=len(events))
        ends = [seq for kind, seq, _, _ in events if kind == "turn/end"]
        if ends:
            choices |= st.sampled_from(ends)
        if seed:
            choices |= st.integers(min_value=0, max_value=seed - 1)
        return data.draw(choices, label="boundary")

    def new_token(self, token: str | None) -> str:
        assert token is not None
        assert token not in self.seen_tokens
        assert token != STALE_TOKEN
        self.seen_tokens.add(token)
        return token

    def existing(self, data: st.DataObject) -> str:
        # Newest first: Hypothesis favours early elements, and the newest session is often the
        # deepest fork, so lineages of forks of forks (with own events at each level) are common.
        return data.draw(st.sampled_from(list(reversed(self.sessions))), label="existing id")

    def fresh(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from([i for i in IDS if i not in self.sessions]), label="fresh id")

    def has_sessions(self) -> bool:
        return bool(self.sessions)

    def has_fresh_ids(self) -> bool:
        return len(self.sessions) < len(IDS)

    # -- operations: each compares the registry's outcome with the model's, then updates the model --

    def do_create(self, sid: str, cwd: str | None) -> None:
        self.tick()
        actual = outcome_of(lambda: self.registry.create(sid, cwd=cwd), "create")
        if sid in self.sessions:
            assert actual == error(errors.already_exists(sid))
            return
        status, handle = actual
        assert status == "ok", actual
        assert handle.id == sid
        header = Header(version=0, id=sid, created_at=self.now, cwd=UNSET if cwd is None else cwd)
        self.sessions[sid] = ModelSession(header, self.new_token(handle.instance))

    def do_append(self, sid: str, kind: str, chunk: str) -> None:
        self.tick()
        ref, stale = self.ref(sid, kind)
        new = [NewEvent(t, {"at": self.now, "i": i}) for i, t in enumerate(CHUNKS[chunk])]
        actual = outcome_of(lambda: self.registry.append(ref, new), "append")
        expected_error = self.source_error(sid, stale)
        if expected_error is not None:
            assert actual == error(expected_error)
            return
        log = self.sessions[sid].events
        stored = [(e.type, len(log) + i, self.now, e.data) for i, e in enumerate(new)]
        assert actual[0] == "ok", actual
        assert [(e.type, e.seq, e.time, e.data) for e in actual[1]] == stored
        log.extend(stored)

    def do_dispose(self, sid: str, kind: str) -> None:
        self.tick()
        ref, stale = self.ref(sid, kind)
        actual = outcome_of(lambda: self.registry.dispose(ref), "dispose")
        expected_error = self.source_error(sid, stale)
        if expected_error is not None:
            assert actual == error(expected_error)
            return
        assert actual == ("ok", None)
        self.sessions[sid].live = False

    def do_fork(self, source: str, kind: str, child: str, request: str | None, boundary: int | None = None) -> None:
        self.tick()
        ref, stale = self.ref(source, kind)
        actual = outcome_of(
            lambda: forks.fork(self.registry, ref, child, request_id=request or "", boundary=boundary),
            "fork" if boundary is None else "boundary fork",
        )
        existing = self.sessions.get(child)
        if existing is not None and request is not None and existing.request == request:
            assert actual == ("ok", existing.header)  # a replay, whatever the source's state
            return
        # Error order: the source, the child id, then the boundary rules.
        expected_error = self.source_error(source, stale)
        if expected_error is None and existing is not None:
            expected_error = errors.already_exists(child)
        expected_error = expected_error or self.boundary_error(source, boundary)
        if expected_error is not None:
            assert actual == error(expected_error)
            return
        parent = self.sessions[source]
        seed = parent.events if boundary is None else parent.events[: boundary + 1]
        header = Header(version=0, id=child, created_at=self.now, cwd=parent.header.cwd,
                        parent_session=source, seed_length=len(seed))
        assert actual == ("ok", header)
        token = self.new_token(self.registry.instance(child))
        self.sessions[child] = ModelSession(header, token, list(seed), request=request)
        parent.children.add(child)

    def do_snapshot(self, source: str, kind: str, boundary: int | None = None) -> None:
        self.tick()
        ref, stale = self.ref(source, kind)
        actual = outcome_of(lambda: forks.snapshot(self.registry, ref, boundary=boundary), "snapshot")
        expected_error = self.source_error(source, stale) or self.boundary_error(source, boundary)
        if expected_error is not None:
            assert actual == error(expected_error)
            return
        parent = self.sessions[source]
        seed = parent.events if boundary is None else parent.events[: boundary + 1]
        assert actual[0] == "ok", actual
        events, meta = actual[1]
        assert [(e.type, e.seq, e.time, e.data) for e in events] == seed
        assert meta == SeedMeta(parent_session=source, seed_length=len(seed), cwd=parent.header.cwd)

    # -- rules: any id (mostly error paths), and ids drawn from the model (mostly success paths) ---

    @rule(sid=ids, cwd=cwds)
    def create_any(self, sid: str, cwd: str | None) -> None:
        self.do_create(sid, cwd)

    @rule(sid=ids, kind=ref_kinds, chunk=chunks)
    def append_any(self, sid: str, kind: str, chunk: str) -> None:
        self.do_append(sid, kind, chunk)

    @precondition(has_sessions)
    @rule(data=st.data(), chunk=chunks)
    def append_existing(self, data: st.DataObject, chunk: str) -> None:
        self.do_append(self.existing(data), data.draw(live_kinds), chunk)

    @precondition(has_sessions)
    @rule(data=st.data())
    def complete_turn_existing(self, data: st.DataObject) -> None:
        # Closes any open turn, so that forks of deeper lineages with own events are common.
        sid = self.existing(data)
        events = self.sessions[sid].events
        self.do_append(sid, "id", "close" if events and events[-1][0] != "turn/end" else "whole turn")

    @rule(sid=ids, kind=ref_kinds)
    def dispose_any(self, sid: str, kind: str) -> None:
        self.do_dispose(sid, kind)

    @rule(source=ids, kind=ref_kinds, child=ids, request=requests, data=st.data())
    def fork_any(self, source: str, kind: str, child: str, request: str | None, data: st.DataObject) -> None:
        self.do_fork(source, kind, child, request, self.boundaries(data, source))

    @precondition(lambda self: self.has_sessions() and self.has_fresh_ids())
    @rule(data=st.data(), request=requests)
    def fork_existing_into_fresh(self, data: st.DataObject, request: str | None) -> None:
        self.do_fork(self.existing(data), data.draw(live_kinds), self.fresh(data), request)

    @precondition(lambda self: self.has_sessions() and self.has_fresh_ids())
    @rule(data=st.data(), request=requests)
    def fork_existing_at_a_boundary(self, data: st.DataObject, request: str | None) -> None:
        # Forks at earlier turns, of running sessions too, then own events on top: the next
        # boundary falls inside an inherited seed, inside own events, or on a segment border.
        source = self.existing(data)
        child = self.fresh(data)
        self.do_fork(source, data.draw(live_kinds), child, request, self.boundaries(data, source))
        if child in self.sessions and data.draw(st.booleans(), label="continue"):
            self.do_append(child, "id", data.draw(chunks, label="chunk"))

    @precondition(lambda self: self.has_sessions() and self.has_fresh_ids())
    @rule(data=st.data())
    def fork_and_continue(self, data: st.DataObject) -> None:
        # Grows lineages whose every level has events of its own: forks of forks read their
        # seeds across several ancestor slices.
        child = self.fresh(data)
        self.do_fork(self.existing(data), "id", child, None)
        if child in self.sessions:
            self.do_append(child, "handle", "whole turn")

    @precondition(has_sessions)
    @rule(data=st.data(), request=requests)
    def fork_existing_into_existing(self, data: st.DataObject, request: str | None) -> None:
        # Replays (same request id) and SESSION_ALREADY_EXISTS.
        self.do_fork(self.existing(data), data.draw(ref_kinds), self.existing(data), request)

    @precondition(lambda self: any(s.request for s in self.sessions.values()))
    @rule(data=st.data(), source=ids, kind=ref_kinds)
    def fork_replay(self, data: st.DataObject, source: str, kind: str) -> None:
        # The same request again, from a source that may since have moved on, closed or gone.
        child = data.draw(st.sampled_from(sorted(c for c, s in self.sessions.items() if s.request)))
        self.do_fork(source, kind, child, self.sessions[child].request)

    @rule(source=ids, kind=ref_kinds)
    def snapshot_any(self, source: str, kind: str) -> None:
        self.do_snapshot(source, kind)

    @precondition(has_sessions)
    @rule(data=st.data())
    def snapshot_existing(self, data: st.DataObject) -> None:
        source = self.existing(data)
        self.do_snapshot(source, data.draw(live_kinds), self.boundaries(data, source))

    # -- invariant ---------------------------------------------------------------------------------

    @invariant()
    def registry_agrees_with_model(self) -> None:
        for sid in IDS:
            session = self.sessions.get(sid)
            if session is None:
                assert not self.registry.exists(sid)
                assert outcome_of(lambda s=sid: self.registry.header(s)) == error(errors.not_found(sid))
                continue
            assert self.registry.header(sid) == session.header
            stored = [(e.type, e.seq, e.time, e.data) for e in self.registry.events(sid)]
            assert stored == session.events
            assert self.registry.length(sid) == len(session.events)
            assert self.registry.instance(sid) == (session.token if session.live else None)
            assert self.registry.children(sid) == sorted(session.children)
            ends = [seq for kind, seq, _, _ in session.events if kind == "turn/end"]
            assert self.registry.last_turn_end(sid) == (ends[-1] if ends else None)


def test_registry_agrees_with_in_memory_model(redis: Redis) -> None:
    run_state_machine_as_test(
        lambda: ForkMachine(redis),
        settings=settings(max_examples=40, stateful_step_count=25, deadline=None),
    )
