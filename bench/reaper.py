"""The soak's reaper: deletion and retention running while the soak forks (``bench.soak``).

``reap`` follows the outcome stream; of every other child created, it forks a grandchild, then
deletes the child by hand or disposes it (the workers run with ``SESSIONFORK_RETENTION=1``, so
their maintenance pass deletes it a second or two later). ``check`` then proves that nothing was
broken: every grandchild still reads exactly its seed (its parent's seed, whose log is gone or
going), every hand-deleted child answers ``SESSION_NOT_FOUND``, and counts the disposed children
retention has deleted so far.
"""

from __future__ import annotations

from typing import Any

from redis import Redis

from sessionfork.core import forks, keys, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Event, ForkResult, Header

RETENTION_ENV = {"SESSIONFORK_RETENTION": "1", "SESSIONFORK_MAINTENANCE_INTERVAL": "1"}


def _created(raw: bytes) -> list[Header]:
    reply = wire.decode_reply(raw)
    if not isinstance(reply, ForkResult):
        return []
    return ([reply.session] if isinstance(reply.session, Header) else []) + \
        (reply.sessions if isinstance(reply.sessions, list) else [])


def reap(url: str, stop: Any) -> dict[str, list[Any]]:
    """Until ``stop``: delete or dispose every other new child, each after forking a grandchild."""
    redis: Any = Redis.from_url(url)  # redis-py types stream replies loosely
    registry = Registry(redis)
    last = "0-0"
    seen = 0
    out: dict[str, list[Any]] = {"deleted": [], "disposed": [], "grandchildren": []}
    while not stop.is_set():
        reply = redis.xread({keys.OUTCOME_STREAM: last}, count=100, block=200) or []
        for _, entries in reply:
            for entry_id, fields in entries:
                last = wire.text(entry_id)
                for child in _created(fields[b"reply"]):
                    seen += 1
                    if seen % 2:
                        continue  # the other half stays, for the soak's own seed check
                    grandchild = f"{child.id}.g"
                    forks.fork(registry, child.id, grandchild)
                    out["grandchildren"].append((grandchild, child.parent_session, child.seed_length))
                    if seen % 4:
                        registry.delete(child.id)
                        out["deleted"].append(child.id)
                    else:
                        registry.dispose(child.id)
                        out["disposed"].append(child.id)
    return out


def reaped_ids(reaped: dict[str, list[Any]]) -> set[str]:
    """The children the reaper deleted or disposed (the soak's own seed check skips them)."""
    return set(reaped["deleted"]) | set(reaped["disposed"])


def check(registry: Registry, parents: dict[str, list[Event]], reaped: dict[str, list[Any]]) -> tuple[int, int]:
    """``(bad, swept)``: grandchildren or deleted children found wrong, disposed children deleted."""
    bad = 0
    for grandchild, parent, seed in reaped["grandchildren"]:
        if registry.events(grandchild) != parents[parent][:seed]:
            bad += 1
    for child in reaped["deleted"]:
        try:
            registry.header(child)
            bad += 1
        except ForkError as exc:
            bad += exc.code is not ErrorCode.SESSION_NOT_FOUND
    swept = sum(1 for child in reaped["disposed"] if not registry.exists(child))
    return bad, swept
