"""Settings come from an injected environment, flags override, bad values are named."""

import pytest

from sessionfork.core import config


def test_defaults_without_environment() -> None:
    settings = config.from_environ({})
    assert settings.queue == "sessionfork"
    assert settings.max_request_bytes == 64 * 1024
    assert settings.max_fanout == 1024
    assert settings.redis_url is None


def test_environment_variables_are_read() -> None:
    settings = config.from_environ({"REDIS_URL": "rediss://h:1/0", "SESSIONFORK_MAX_FANOUT": "8",
                                    "SESSIONFORK_CLUSTER": "1"})
    assert (settings.redis_url, settings.max_fanout, settings.cluster) == ("rediss://h:1/0", 8, True)


def test_flags_override_environment() -> None:
    settings = config.from_environ({"SESSIONFORK_QUEUE": "a"}, queue="b", reply_channel=None)
    assert settings.queue == "b"


def test_bad_number_names_the_setting() -> None:
    with pytest.raises(config.ConfigError, match="retries"):
        config.from_environ({"SESSIONFORK_RETRIES": "many"})


def test_non_positive_limit_names_the_variable() -> None:
    with pytest.raises(config.ConfigError, match="SESSIONFORK_MAX_FANOUT"):
        config.from_environ({"SESSIONFORK_MAX_FANOUT": "0"})


def test_every_setting_has_a_variable() -> None:
    assert set(config.ENV) == set(config.Settings.__struct_fields__)


def test_id_length_limit_can_only_lower_the_rule() -> None:
    assert config.from_environ({"SESSIONFORK_MAX_ID_LENGTH": "64"}).max_id_length == 64
    with pytest.raises(config.ConfigError, match="SESSIONFORK_MAX_ID_LENGTH"):
        config.from_environ({"SESSIONFORK_MAX_ID_LENGTH": "129"})
