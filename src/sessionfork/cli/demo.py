"""``sessionfork demo``: every outcome of the service, end to end, on a real server and worker.

Starts an embedded Redis-compatible server (unless a URL is given) and a ``sessionfork worker``
process, creates sessions in every state, sends forks that show each outcome, prints each reply
event and the resulting lineage, and stops everything it started.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import msgspec

from ..clients.client import Client
from ..core import wire
from ..core.config import Settings
from ..core.connections import queue_client, registry_client
from ..core.registry import Registry
from ..core.wire import LiveHandle, NewEvent, Summary
from ..embedded import EmbeddedServer, wait_until
from ..ops import lineage
from ..protocol import outcomes
from ..protocol.requests import Variant

Echo = Callable[[str], None]


def _turn(n: int, reason: str = "completed") -> list[NewEvent]:
    return [
        NewEvent("turn/start", {"turn": n, "trigger": "user"}),
        NewEvent("user/message", {"text": f"question {n}"}),
        NewEvent("assistant/message", {"text": f"answer {n}"}),
        NewEvent("turn/end", {"turn": n, "reason": {"kind": reason}}),
    ]


@contextlib.contextmanager
def _server(settings: Settings) -> Iterator[Settings]:
    if settings.redis_url:
        yield settings
        return
    with EmbeddedServer() as server:
        yield msgspec.structs.replace(settings, redis_url=server.url)


@contextlib.contextmanager
def _worker(settings: Settings, echo: Echo) -> Iterator[subprocess.Popen[bytes]]:
    args = [sys.executable, "-m", "sessionfork", "--redis-url", str(settings.redis_url),
            "--queue", settings.queue, "worker", "--name", f"demo-{uuid.uuid4().hex[:8]}",
            "--log-level", "WARNING"]
    if settings.queue_url:
        args[3:3] = ["--queue-url", settings.queue_url]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
    echo(f"started worker pid {proc.pid}")
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        echo(f"worker stopped on SIGTERM, exit status {code}")


class DemoFailed(RuntimeError):
    """An outcome other than the one the walkthrough shows: the demo checks itself."""


def run_demo(settings: Settings, *, echo: Echo) -> None:
    """Run the walkthrough; ``DemoFailed`` on an unexpected outcome."""
    with _server(settings) as s:
        echo(f"registry and queue: {s.redis_url}" + ("" if settings.redis_url else " (embedded)"))
        registry = Registry(registry_client(s, str(s.redis_url)))
        client = Client(queue_client(s, s.queue_url or str(s.redis_url)), s)
        tag = uuid.uuid4().hex[:6]

        def sid(name: str) -> str:
            return f"demo-{tag}-{name}"

        parent = registry.create(sid("parent"), cwd="/workspace")
        registry.append(parent, _turn(1))
        registry.append(registry.create(sid("open")), _turn(1)[:2])
        registry.dispose(registry.create(sid("gone")))
        running = registry.create(sid("running"))
        registry.append(running, [*_turn(1), *_turn(2), *_turn(3)[:2]])
        echo(f"sessions: {sid('parent')} (1 turn done), {sid('open')} (turn open), {sid('gone')} (disposed), "
             f"{sid('running')} (2 turns done, turn 3 running)")

        with _worker(s, echo):
            wait_until(lambda: _worker_up(client, s), 30, "the worker to register")

            def show(title: str, expect: str, reply: wire.Outcome) -> wire.Outcome:
                code = outcomes.code_of(reply).replace("OK", "ok")
                echo(f"\n# {title} -> {code}\n{wire.encode(reply).decode()}")
                if code != expect:
                    raise DemoFailed(f"demo expected {expect}, got {code}")
                return reply

            show("fork a finished turn", "ok", client.fork(sid("parent"), session_id=sid("child")))
            registry.append(sid("child"), _turn(2))
            show("fork of a fork", "ok", client.fork(sid("child"), session_id=sid("grandchild")))
            show("fork inside an open turn", "OPEN_TURN", client.fork(sid("open")))
            last = registry.last_turn_end(sid("running"))
            echo(f"\n(the newest turn/end of {sid('running')}, read in O(1): seq {last})")
            show("fork a running session at its last completed turn (boundary)", "ok",
                 client.fork(sid("running"), session_id=sid("at-turn-2"), boundary=last))
            show("fork inside the running turn (boundary)", "INVALID_BOUNDARY",
                 client.fork(sid("running"), boundary=9))
            show("fork of a disposed session", "SESSION_NOT_FOUND", client.fork(sid("gone")))
            show("fork with a stale live handle", "SESSION_NOT_LIVE",
                 client.fork(LiveHandle(sid("parent"), "stale-instance")))
            show("fork into an existing id", "SESSION_ALREADY_EXISTS",
                 client.fork(sid("parent"), session_id=sid("child")))
            show("invalid child id", "INVALID_REQUEST", client.fork(sid("parent"), session_id="not valid!"))
            retry_id = f"req-{tag}-retry"  # a request id, named apart from every session id
            first = client.fork(sid("parent"), request_id=retry_id)
            again = show("idempotent retry (same request id)", "ok", client.fork(sid("parent"), request_id=retry_id))
            if again != first:
                raise DemoFailed("idempotent retry returned a different outcome")
            echo("  (same child as the first attempt: nothing new was created)")
            show("fan-out: 3 children from one snapshot", "ok", client.fork(sid("child"), count=3))
            _compose(client, registry, sid, show, echo)
            _best_of_3(client, registry, sid, show, echo)

        echo("\n# lineage of " + sid("parent"))
        echo(lineage.render_text(lineage.lineage(registry, sid("parent"))))
        if settings.redis_url:
            echo(f"\n(the demo sessions stay in {settings.redis_url}: ids start with demo-{tag}-)")


def _compose(client: Client, registry: Registry, sid: Callable[[str], str],
             show: Callable[[str, str, wire.Outcome], wire.Outcome], echo: Echo) -> None:
    """Composed forks: an edit-and-retry under a guard, a stale guard, a variant fan-out, a summary fork."""
    source = sid("running")
    length = registry.length(source)
    last = registry.last_turn_end(source)
    echo(f"\n({source} has {length} events; turn 3 is going wrong: retry it with another prompt)")
    retry = [NewEvent("turn/start", {"turn": 3, "trigger": "user"}),
             NewEvent("user/message", {"text": "question 3, asked differently"})]
    show("edit and retry: fork at turn 2's end, the new prompt in the same atomic step", "ok",
         client.fork(source, session_id=sid("retry"), boundary=last, if_length=length, edits=retry))
    echo("  " + ", ".join(f"{e.seq}:{e.type}" for e in registry.events(sid("retry"))[-3:]))
    show("guarded fork of a source that moved on (ifLength)", "PRECONDITION_FAILED",
         client.fork(source, boundary=last, if_length=length - 1))
    prompts = ["plan first", "write the test first", "ask a question"]
    show("variants: one snapshot, a different next prompt each", "ok", client.fork(source, boundary=last, variants=[
        Variant(sid(f"try-{i}"), [NewEvent("turn/start", {"turn": 3}), NewEvent("user/message", {"text": text})])
        for i, text in enumerate(prompts)]))
    ends = [e.seq for e in registry.events(source, 0, (last or 0) + 1) if e.type == "turn/end"]
    keep = ends[-2] + 1 if len(ends) > 1 else 1
    show(f"summary fork: events 0-{keep - 1} replaced by one summary, the last turn kept", "ok",
         client.fork(source, session_id=sid("compact"), boundary=last,
                     summary=Summary(keep_from=keep, data={"text": f"the first {len(ends) - 1} turn(s), summarised"})))
    echo("  " + ", ".join(f"{e.seq}:{e.type}" for e in registry.events(sid("compact"))))


def _best_of_3(client: Client, registry: Registry, sid: Callable[[str], str],
               show: Callable[[str, str, wire.Outcome], wire.Outcome], echo: Echo) -> None:
    """Best of 3: three branches of the parent each do a turn, the best one is selected (merged back
    as one turn), the others abandoned; a late merge of a loser is a stale ALREADY_MERGED."""
    parent = sid("parent")
    echo(f"\n(best of 3: three branches of {parent} each try turn 2)")
    ids = [sid(f"best-{i}") for i in range(3)]
    show("fan-out: 3 branches to compare", "ok", client.fork(parent, session_ids=ids))
    for i, branch in enumerate(ids):
        start, ask, _, end = _turn(2)
        registry.append(branch, [start, ask, NewEvent("assistant/message", {"text": f"approach {i}"}), end])
    show("select: the second branch wins, merged back as one turn; the others abandoned", "ok",
         client.select(parent, ids, ids[1], mode="events"))
    echo("  " + ", ".join(f"{e.seq}:{e.type}" for e in registry.events(parent)[4:]))
    echo("  states: " + ", ".join(f"{branch}: {registry.state_of(branch).state}" for branch in ids))
    show("merge a branch the select abandoned", "ALREADY_MERGED",
         client.merge(parent, ids[0], mode="summary", summary={"text": "approach 0, late"}))


def _worker_up(client: Client, settings: Settings) -> bool:
    from ..worker.jobs import fresh_workers

    return bool(fresh_workers(client.redis, settings))
