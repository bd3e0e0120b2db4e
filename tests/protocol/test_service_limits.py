"""Request limits are settings: parse refuses what exceeds them, naming the field (no Redis needed)."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from sessionfork.core import config
from sessionfork.core.config import Settings
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.protocol import requests
from sessionfork.protocol.requests import Limits
from sessionfork.worker.service import RequestService


def limits(**given: Any) -> Limits:
    return Limits(**{"max_request_bytes": 65536, "max_fanout": 8, "max_id_length": 16, **given})


def refused(payload: str, job_id: str = "r1", **given: Any) -> str:
    with pytest.raises(ForkError) as err:
        requests.parse(payload, job_id, limits(**given))
    assert err.value.code is ErrorCode.INVALID_REQUEST
    return err.value.message


def test_long_child_id_is_refused_by_the_id_length_setting() -> None:
    assert "sessionId" in refused('{"source":"a","sessionId":"' + "c" * 17 + '"}')


def test_long_source_id_is_refused_by_the_id_length_setting() -> None:
    assert "source" in refused('{"source":"' + "s" * 17 + '"}')


def test_long_request_id_is_refused_by_the_id_length_setting() -> None:
    assert "requestId" in refused('{"source":"a"}', job_id="r" * 17)


def test_fan_out_over_the_setting_is_refused() -> None:
    assert "count" in refused('{"source":"a","count":9}')
    assert "sessionIds" in refused('{"source":"a","sessionIds":["a","b","c","d","e","f","g","h","i"]}')


def test_payload_over_the_size_setting_is_refused_before_decoding() -> None:
    assert "over the limit of 32" in refused('{"source":"a","sessionId":"bbbbbbbbbbbbbbbb"}', max_request_bytes=32)


def test_requests_within_the_limits_parse() -> None:
    request = requests.parse('{"source":"a","sessionIds":["x","y"],"replyTo":"sf:replies:t"}', "r1", limits())
    assert request.session_ids == ["x", "y"]


def test_what_a_request_writes_is_bounded_by_the_write_setting() -> None:
    """Children x (edits + summary data) bytes over ``max_write_bytes``: refused naming the fields
    and the limit, whatever multiplies them; the limit itself is accepted."""
    edit = '{"type":"t","data":"' + "x" * 78 + '"}'  # 100 bytes of JSON
    count = '{"source":"a","count":8,"edits":[' + edit + "]}"
    assert requests.parse(count, "r1", limits(max_write_bytes=800)).count == 8
    assert refused(count, max_write_bytes=799) == ("invalid request: count 8 \u00d7 100 bytes of edits is 800 bytes to "
                                                   "write, over the limit of 799 (SESSIONFORK_MAX_REQUEST_WRITE_BYTES)")
    ids = '{"source":"a","sessionIds":["x","y","z"],"edits":[' + edit + '],"summary":{"keepFrom":1,"data":"ab"}}'
    assert refused(ids, max_write_bytes=311) == ("invalid request: sessionIds: 3 \u00d7 104 bytes of edits and "
                                                 "summary.data is 312 bytes to write, over the limit of 311 "
                                                 "(SESSIONFORK_MAX_REQUEST_WRITE_BYTES)")
    summary_only = '{"source":"a","count":2,"summary":{"keepFrom":1,"data":"' + "s" * 98 + '"}}'
    assert "count 2 \u00d7 100 bytes of summary.data is 200 bytes" in refused(summary_only, max_write_bytes=199)
    variants = '{"source":"a","variants":[{"edits":[' + edit + "," + edit + ']},{}],"summary":{"keepFrom":1,"data":1}}'
    assert requests.parse(variants, "r1", limits(max_write_bytes=202)).variants
    assert refused(variants, max_write_bytes=201) == ("invalid request: variants: 2 children's edits and summary.data "
                                                      "is 202 bytes to write, over the limit of 201 "
                                                      "(SESSIONFORK_MAX_REQUEST_WRITE_BYTES)")
    assert requests.parse('{"source":"a","count":8}', "r1", limits(max_write_bytes=1)).count == 8  # seeds: O(1)



def test_the_write_limit_is_the_setting() -> None:
    """``SESSIONFORK_MAX_REQUEST_WRITE_BYTES`` reaches the worker's limits; ``Limits``' default is
    the setting's."""
    assert Limits().max_write_bytes == Settings().max_request_write_bytes == 16 * 1024 * 1024
    settings = config.from_environ({"SESSIONFORK_MAX_REQUEST_WRITE_BYTES": "1000"})
    unused = Redis(port=1)  # never connected: the service is only built
    assert RequestService.from_settings(Registry(unused), unused, settings).limits.max_write_bytes == 1000
