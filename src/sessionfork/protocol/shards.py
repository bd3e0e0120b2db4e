"""Which queue server (shard) a request id lives on: one pure, language-independent rule.

``shard_of(request_id, n)`` is the jump consistent hash (Lamping & Veach, 2014,
arXiv:1406.2294) of the CRC-32 (IEEE 802.3, the checksum of zlib, gzip and PNG) of the request
id's UTF-8 bytes. Every part that touches a request — the clients, a raw producer in any
language, a waiter, a retry — computes it the same way, so all of them name the same server.
``tests/data/shard_vectors.json`` holds (id, n, shard) vectors that docs/any-language.md quotes
for other implementations.

Jump hash keeps as many ids as possible in place when ``n`` changes: going from ``n`` to
``n + 1`` shards moves about ``1/(n + 1)`` of the ids, each to the new shard ``n``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

_MASK64 = (1 << 64) - 1
_MULTIPLIER = 2862933555777941757
"""The 64-bit linear congruential step of the paper's reference code."""


def jump_hash(key: int, buckets: int) -> int:
    """The jump consistent hash of the unsigned 64-bit ``key`` over ``buckets`` (>= 1) buckets.

    The paper's reference code, line for line (the division is in IEEE double precision, as its
    C++: ``double(1LL << 31) / double((key >> 33) + 1)``)."""
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    key &= _MASK64
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * _MULTIPLIER + 1) & _MASK64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def shard_of(request_id: str, shards: int) -> int:
    """The shard (0 to ``shards - 1``) of ``request_id``: ``jump_hash(crc32(utf8(id)), shards)``."""
    return jump_hash(zlib.crc32(request_id.encode("utf-8")), shards)


def pick(items: Sequence[T], request_id: str) -> T:
    """The item of ``items`` (one per shard, in shard order) that serves ``request_id``."""
    return items[shard_of(request_id, len(items))] if len(items) > 1 else items[0]
