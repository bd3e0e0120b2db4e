"""The shard routing rule (``protocol.shards``): jump consistent hash of CRC-32, pinned by the test
vectors other languages check against (``tests/data/shard_vectors.json``, quoted in
docs/any-language.md), and the settings that name the shards."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import Counter
from pathlib import Path

import pytest

from sessionfork.clients.aio import AsyncClient
from sessionfork.clients.client import Client
from sessionfork.core import config
from sessionfork.protocol import shards

ROOT = Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "tests/data/shard_vectors.json").read_text())


@pytest.mark.parametrize(("request_id", "n", "shard"), VECTORS["vectors"])
def test_the_committed_vectors(request_id: str, n: int, shard: int) -> None:
    assert shards.shard_of(request_id, n) == shard


def test_the_crc32_of_the_vectors_is_ieee_crc32() -> None:
    for request_id, crc in VECTORS["crc32"]:
        assert zlib.crc32(request_id.encode("utf-8")) == crc


def test_the_vectors_page_quotes_the_vectors_file() -> None:
    page = (ROOT / "docs/any-language.md").read_text()
    table = {(rid, n): shard for rid, n, shard in VECTORS["vectors"]}
    columns = sorted({n for _, n in table})
    quoted = [rid for rid, _ in VECTORS["crc32"] if len(rid) <= 40]
    assert len(quoted) >= 9
    for rid, crc in VECTORS["crc32"]:
        if rid in quoted:
            row = f"| `{rid}` | {crc} | " + " | ".join(str(table[rid, n]) for n in columns) + " |"
            assert row in page, row


REFERENCE = [  # (key, buckets, bucket) from the paper's C++ code, compiled with g++
    (0, 10, 0), (0, 65536, 0), (1, 10, 6), (1, 100, 55), (1, 1000, 549), (1, 65536, 21134),
    (3735928559, 10, 5), (3735928559, 100, 87), (3735928559, 1000, 285), (3735928559, 65536, 64244),
    (4294967295, 10, 5), (4294967295, 100, 74), (4294967295, 1000, 875), (4294967295, 65536, 23215),
    (2**64 - 1, 10, 9), (2**64 - 1, 100, 92), (2**64 - 1, 1000, 313), (2**64 - 1, 65536, 18311),
]


@pytest.mark.parametrize(("key", "buckets", "bucket"), REFERENCE)
def test_jump_hash_of_the_paper(key: int, buckets: int, bucket: int) -> None:
    assert shards.jump_hash(key, buckets) == bucket
    assert shards.jump_hash(key, 1) == 0


def test_an_id_moves_only_to_the_new_shard_when_one_is_added() -> None:
    ids = [f"req-{i}" for i in range(5000)]
    for n in (1, 2, 3, 7):
        moved = [i for i in ids if shards.shard_of(i, n) != shards.shard_of(i, n + 1)]
        assert all(shards.shard_of(i, n + 1) == n for i in moved)
        assert abs(len(moved) / len(ids) - 1 / (n + 1)) < 0.03  # about 1/(n+1) move


def test_the_shards_are_even() -> None:
    counts = Counter(shards.shard_of(f"req-{i:08x}", 3) for i in range(30000))
    assert all(abs(c - 10000) < 500 for c in counts.values()), counts


def test_the_id_is_hashed_as_utf8() -> None:
    rid = "réq-ü"
    assert shards.shard_of(rid, 1000) == shards.jump_hash(zlib.crc32(rid.encode("utf-8")), 1000)
    assert shards.shard_of(rid, 1000) != shards.jump_hash(zlib.crc32(rid.encode("latin-1")), 1000)


def test_zero_buckets_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        shards.jump_hash(1, 0)


def test_pick_one_item_per_shard() -> None:
    assert shards.pick(["only"], "anything") == "only"
    assert shards.pick(["a", "b", "c"], "a") == "abc"[shards.shard_of("a", 3)]


# -- settings ------------------------------------------------------------------------------------

def test_queue_urls_are_comma_separated() -> None:
    s = config.from_environ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0, redis://b:1/0", "SESSIONFORK_SHARD": "1"})
    assert s.queue_urls == ("redis://a:1/0", "redis://b:1/0") and s.shard == 1


# Every URL form the docs show (docs/configuration.md, docs/sharding.md, README.md), each a shard.
DOCUMENTED_URLS = [
    "redis://queue-0:6379/0",
    "rediss://:pw@h/3",
    "redis://h",
    "unix:///tmp/r.sock",
    "redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/sessionfork/0",
    "redis+sentinel://sentinel-1,sentinel-2,sentinel-3/queue-1/0",
    "rediss+sentinel://:s3cret@10.0.0.5,10.0.0.6,[fd00::7]:26380/queue",
    "redis+sentinel://sf-worker:p,w@[::1]:26380,s2/m",  # a comma in the password too
    "redis+sentinel://s1:26380/one",
]


@pytest.mark.parametrize("start", range(len(DOCUMENTED_URLS)))
def test_every_documented_url_form_is_one_shard_of_a_list(start: int) -> None:
    urls = DOCUMENTED_URLS[start:] + DOCUMENTED_URLS[:start]  # each form first, in the middle and last
    assert config.split_urls(",".join(urls), "urls") == urls
    assert config.split_urls(" , ".join(urls), "urls") == urls
    settings = config.from_environ({"SESSIONFORK_QUEUE_URLS": ",".join(urls), "SESSIONFORK_SHARD": "4"})
    assert settings.queue_urls == tuple(urls)
    assert config.from_environ({}, queue_urls=",".join(urls)).queue_urls == tuple(urls)  # --queue-urls


def test_both_clients_split_a_list_with_a_multi_sentinel_url_into_its_shards() -> None:
    urls = ["redis+sentinel://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/sf/0", "redis://127.0.0.1:4/0"]
    try:
        client = Client.from_urls(",".join(urls))  # no connection is opened yet
    except config.ConfigError as exc:  # the promise: two shards, not a refusal of a piece of the first URL
        raise AssertionError(f"the list was split inside a URL: {exc}") from None
    assert len(client.shards) == 2
    pool = client.shards[0].connection_pool
    assert pool.sentinel_manager.sentinels[2].connection_pool.connection_kwargs["port"] == 3  # type: ignore[attr-defined]
    assert client.shards[1].connection_pool.connection_kwargs["port"] == 4

    async def build() -> list[int] | str:
        try:
            async with AsyncClient.from_urls(",".join(urls)) as aio:
                return [len(aio.shards), len(aio.shards[0].connection_pool.sentinel_manager.sentinels)]  # type: ignore[attr-defined]
        except config.ConfigError as exc:
            return f"the list was split inside a URL: {exc}"

    assert asyncio.run(build()) == [2, 3]


@pytest.mark.parametrize("text", ["q0:6379,q1:6379", "localhost:6379/0", "pw@q0,redis://a:1/0"])
def test_a_list_that_does_not_begin_with_a_url_is_refused_by_name(text: str) -> None:
    for call in (lambda: config.from_environ({"SESSIONFORK_QUEUE_URLS": text}),
                 lambda: Client.from_urls(text)):
        with pytest.raises(config.ConfigError, match=r"must be a comma-separated list of URLs") as refused:
            call()
        assert "pw" not in str(refused.value)


@pytest.mark.parametrize(("env", "match"), [
    ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0,redis://b:1/0", "SESSIONFORK_SHARD": "2"},
     r"SESSIONFORK_SHARD must be between 0 and 1 \(SESSIONFORK_QUEUE_URLS lists 2"),
    ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0,redis://b:1/0", "SESSIONFORK_SHARD": "-1"}, "SESSIONFORK_SHARD"),
    ({"SESSIONFORK_SHARD": "1"}, "SESSIONFORK_SHARD must be between 0 and 0"),
    ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0,,redis://b:1/0"}, "without empty entries"),
    ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0,redis://a:1/0"}, "lists a server twice"),
    ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0,http://b"}, "SESSIONFORK_QUEUE_URLS must be a"),
    ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0,"}, "without empty entries"),
    ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0,b:1/0"}, "SESSIONFORK_QUEUE_URLS must name a host"),  # no scheme
    ({"SESSIONFORK_QUEUE_URLS": "redis+sentinel://s1,,s2/m"}, "without empty entries"),
    ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0", "SESSIONFORK_QUEUE_URL": "redis://b:1/0"}, "exclude each other"),
])
def test_bad_shard_settings_are_refused(env: dict[str, str], match: str) -> None:
    with pytest.raises(config.ConfigError, match=match):
        config.from_environ(env)


def test_a_flag_shard_is_checked_like_the_variable() -> None:
    s = config.from_environ({"SESSIONFORK_QUEUE_URLS": "redis://a:1/0,redis://b:1/0"})
    assert config.with_shard(s, 1).shard == 1
    assert config.with_shard(s, None) is s
    with pytest.raises(config.ConfigError, match="between 0 and 1"):
        config.with_shard(s, 5)
