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
    with pytest.raises(config.ConfigError, match="SESSIONFORK_RETRIES"):
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


def test_every_numeric_setting_has_a_range() -> None:
    numeric = {f for f, t in zip(config.Settings.__struct_fields__, config.Settings.__annotations__.values(),
                                 strict=True) if t in ("int", "float")}
    assert numeric == set(config.BOUNDS)


@pytest.mark.parametrize("field", sorted(config.BOUNDS))
def test_each_setting_is_range_checked_at_its_bounds(field: str) -> None:
    low, high = config.BOUNDS[field]
    var = config.ENV[field]
    step = 1 if isinstance(getattr(config.Settings(), field), int) else 0.01
    roomy = {"SESSIONFORK_SOCKET_TIMEOUT": "3600", "SESSIONFORK_WAIT_TIMEOUT_MS": "1"}  # WAIT fits either way
    for good in (low, high):
        assert getattr(config.from_environ({**roomy, var: str(good)}), field) == good
    for bad in (low - step, high + step, -1):
        if low <= bad <= high:
            continue
        with pytest.raises(config.ConfigError, match=f"{var} must be between"):
            config.from_environ({var: str(bad)})


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("var", ["SESSIONFORK_SOCKET_TIMEOUT", "SESSIONFORK_CONNECT_TIMEOUT"])
def test_timeouts_must_be_finite(var: str, value: str) -> None:
    with pytest.raises(config.ConfigError, match=var):
        config.from_environ({var: value})


def test_issue_examples_are_refused() -> None:
    for env in ({"SESSIONFORK_OUTCOME_STREAM_MAXLEN": "-1"}, {"SESSIONFORK_RETRIES": "-1"},
                {"SESSIONFORK_WAIT_TIMEOUT_MS": "0"}):
        with pytest.raises(config.ConfigError, match=next(iter(env))):
            config.from_environ(env)


@pytest.mark.parametrize("url", ["notaurl", "http://h:1/0", "redis://h:99999/0", "redis://h:0/0",
                                 "redis://h:6379/x", "redis://", "redis://h:port/0"])
def test_unusable_urls_are_refused_naming_the_variable(url: str) -> None:
    for var in ("REDIS_URL", "SESSIONFORK_QUEUE_URL"):
        with pytest.raises(config.ConfigError, match=var):
            config.from_environ({var: url})


def test_a_refused_url_does_not_show_its_password() -> None:
    with pytest.raises(config.ConfigError) as info:
        config.from_environ({"REDIS_URL": "redis://user:s3cret@h:99999/0"})
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://:pw@h/3", "redis://h", "unix:///tmp/r.sock"])
def test_usable_urls_pass(url: str) -> None:
    assert config.from_environ({"REDIS_URL": url}).redis_url == url


@pytest.mark.parametrize("name", ["", "a b", "x" * 257, "caf\u00e9", "tab\there"])
def test_queue_and_channel_names_are_checked(name: str) -> None:
    for field in ("queue", "reply_channel"):
        with pytest.raises(config.ConfigError, match=config.ENV[field]):
            config.from_environ({}, **{field: name})


def test_the_replica_wait_must_fit_in_the_socket_timeout() -> None:
    with pytest.raises(config.ConfigError, match="SESSIONFORK_WAIT_TIMEOUT_MS"):
        config.from_environ({"SESSIONFORK_WAIT_TIMEOUT_MS": "5000", "SESSIONFORK_SOCKET_TIMEOUT": "5"})
    assert config.from_environ({"SESSIONFORK_WAIT_TIMEOUT_MS": "4999"}).wait_timeout_ms == 4999


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:pw@h:1/0", "redis://:***@h:1/0"), ("redis://u:pw@h/0", "redis://u:***@h/0"),
    ("redis://u@h/0", "redis://u@h/0"), ("pw@h", "***@h"), ("redis://h/0", "redis://h/0"),
    ("redis+sentinel://:p@w@h1,h2/svc", "redis+sentinel://:***@h1,h2/svc"), ("rediss://u:p:q@h", "rediss://u:***@h"),
])
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    """What error messages and the worker's start line show of a URL (a user name alone is kept)."""
    assert config.redacted(url) == shown
