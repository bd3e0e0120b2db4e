"""What a worker counts as an outage (``core.outages.is_outage``): a busy server's reply counts
also when redis-py raised it from a pipeline, where it prefixes the command that got it."""

from __future__ import annotations

import pytest
from redis import Redis
from redis.exceptions import ResponseError

from sessionfork.core.outages import is_outage
from sessionfork.embedded import EmbeddedServer


@pytest.mark.parametrize("reply", ["BUSY Redis is busy running a script.", "LOADING Redis is loading the dataset",
                                   "MASTERDOWN Link with MASTER is down", "TRYAGAIN Multiple keys request"])
def test_a_busy_reply_is_an_outage_alone_and_from_a_pipeline(reply: str) -> None:
    assert is_outage(ResponseError(reply))
    assert is_outage(ResponseError(f"Command # 2 (HMGET sf:s:{{a}} req header) of pipeline caused error: {reply}"))


def test_another_error_reply_is_not_an_outage_from_a_pipeline_either() -> None:
    assert not is_outage(ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    assert not is_outage(ResponseError("Command # 1 (GET k) of pipeline caused error: WRONGTYPE Operation against "
                                       "a key holding the wrong kind of value"))


def test_redis_py_raises_a_pipelines_busy_reply_as_the_outage_it_is(server: EmbeddedServer, redis: Redis) -> None:
    """The prefix as redis-py writes it, from a real server: a pipeline's command on a key of the
    wrong type raises with it (the reply BUSY gets the same)."""
    redis.set("outage:k", "v")
    pipe = redis.pipeline(transaction=False)
    pipe.get("outage:other")
    pipe.hget("outage:k", "f")
    with pytest.raises(ResponseError) as info:
        pipe.execute()
    text = str(info.value)
    assert text.startswith("Command # 2 (") and "of pipeline caused error: WRONGTYPE" in text, text
    busy = ResponseError(text.replace("WRONGTYPE", "BUSY", 1))
    assert is_outage(busy) and not is_outage(info.value)
