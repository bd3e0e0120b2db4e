"""Request limits are settings: parse refuses what exceeds them, naming the field (no Redis needed)."""

from __future__ import annotations

from typing import Any

import pytest

from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.queue import requests
from sessionfork.queue.requests import Limits


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
