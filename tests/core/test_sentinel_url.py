"""Sentinel URLs: one pure parser, accepted wherever a Redis URL is, with errors that name the
setting and never the password."""

import pytest

from sessionfork.core import config
from sessionfork.core.config import ConfigError, SentinelURL, parse_sentinel_url


def test_one_sentinel_and_a_service() -> None:
    assert parse_sentinel_url("redis+sentinel://s1:26380/mymaster") == SentinelURL(
        sentinels=(("s1", 26380),), service="mymaster")


def test_several_sentinels_default_port_and_db() -> None:
    parsed = parse_sentinel_url("redis+sentinel://10.0.0.1:26379,s2,s3:5000/queue/3")
    assert parsed.sentinels == (("10.0.0.1", 26379), ("s2", 26379), ("s3", 5000))
    assert (parsed.service, parsed.db, parsed.tls) == ("queue", 3, False)


def test_password_only_user_and_password_and_quoting() -> None:
    assert parse_sentinel_url("redis+sentinel://:s%40cret@h:1/m").password == "s@cret"
    assert parse_sentinel_url("redis+sentinel://:s%40cret@h:1/m").username is None
    parsed = parse_sentinel_url("redis+sentinel://sf-worker:p:w@h:1/m")
    assert (parsed.username, parsed.password) == ("sf-worker", "p:w")
    assert parse_sentinel_url("redis+sentinel://secret@h:1/m").password == "secret"


def test_ipv6_hosts_are_bracketed() -> None:
    parsed = parse_sentinel_url("redis+sentinel://[::1]:26380,[fe80::2],h/m")
    assert parsed.sentinels == (("::1", 26380), ("fe80::2", 26379), ("h", 26379))


def test_tls_scheme_means_tls_to_the_data_nodes() -> None:
    assert parse_sentinel_url("rediss+sentinel://h:1/m").tls is True


@pytest.mark.parametrize(("url", "message"), [
    ("redis+sentinel://h:1", "service"),
    ("redis+sentinel://h:1/", "service"),
    ("redis+sentinel://h:1//0", "service"),
    ("redis+sentinel://h:1/m/zero", "db number"),
    ("redis+sentinel://h:1/m/0/extra", "db number"),
    ("redis+sentinel://h:0/m", "1-65535"),
    ("redis+sentinel://h:65536/m", "1-65535"),
    ("redis+sentinel://h:port/m", "1-65535"),
    ("redis+sentinel://h:/m", "1-65535"),
    ("redis+sentinel://h:1,/m", "host:port"),
    ("redis+sentinel:///m", "host:port"),
    ("redis+sentinel://::1:26379/m", "host:port"),
    ("redis+sentinel://[::1/m", "IPv6"),
    ("redis+sentinel://[::1]x/m", "IPv6"),
    ("sentinel://h:1/m", "redis\\+sentinel://"),
])
def test_bad_urls_are_named(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sentinel_url(url)


def test_settings_accept_sentinel_urls_for_both_servers() -> None:
    settings = config.from_environ({"REDIS_URL": "redis+sentinel://a:1,b:2/reg",
                                    "SESSIONFORK_QUEUE_URL": "rediss+sentinel://:pw@q:3/queue/1"})
    assert settings.queue_url == "rediss+sentinel://:pw@q:3/queue/1"


def test_a_bad_sentinel_url_names_the_variable_and_hides_the_password() -> None:
    with pytest.raises(ConfigError, match="SESSIONFORK_QUEUE_URL") as caught:
        config.from_environ({"SESSIONFORK_QUEUE_URL": "redis+sentinel://:hunter2@q:99999/queue"})
    assert "hunter2" not in str(caught.value)


def test_a_cluster_is_not_reached_through_sentinel() -> None:
    with pytest.raises(ConfigError, match="SESSIONFORK_CLUSTER"):
        config.from_environ({"REDIS_URL": "redis+sentinel://a:1/reg", "SESSIONFORK_CLUSTER": "1"})


def test_sentinel_clients_keep_every_time_out() -> None:
    """The data nodes' and the sentinels' connections are bounded by the settings' time-outs."""
    from redis.sentinel import SentinelConnectionPool

    from sessionfork.core import connections

    settings = config.Settings(socket_timeout=2.5, connect_timeout=1.5)
    client = connections.queue_client(settings, "rediss+sentinel://u:pw@a:1,[::1]:2/svc/4")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "svc"
    kwargs = pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], kwargs["db"]) == (2.5, 1.5, 4)
    assert (kwargs["username"], kwargs["password"]) == ("u", "pw")
    assert pool.connection_class.__name__ == "SentinelManagedSSLConnection"
    sentinels = pool.sentinel_manager.sentinels
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in sentinels] == [("a", 1), ("::1", 2)]
    for s in sentinels:
        assert s.connection_pool.connection_kwargs["socket_timeout"] == 2.5
        assert s.connection_pool.connection_kwargs["socket_connect_timeout"] == 1.5
        assert s.connection_pool.connection_kwargs["password"] is None  # the URL's are the data nodes'
    assert connections.registry_client(settings, "redis+sentinel://a:1/svc").connection_pool.service_name == "svc"


def test_the_asyncio_sentinel_pool_blocks_at_its_bound() -> None:
    from redis.asyncio import BlockingConnectionPool

    from sessionfork.core import connections

    pool = connections.async_pool("redis+sentinel://a:1/svc", max_connections=3, socket_timeout=2.0,
                                  socket_connect_timeout=1.0)
    assert isinstance(pool, BlockingConnectionPool) and pool.max_connections == 3
    assert pool.connection_kwargs["socket_timeout"] == 2.0
    for s in pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
        assert s.connection_pool.connection_kwargs["socket_timeout"] == 2.0


def test_a_cluster_registry_client_refuses_a_sentinel_url() -> None:
    from sessionfork.core import connections

    with pytest.raises(ConfigError, match="Cluster"):
        connections.registry_client(config.Settings(cluster=True), "redis+sentinel://a:1/svc")


def test_closing_a_sentinel_client_closes_the_sentinels_connections_too() -> None:
    """Sync ``close`` and asyncio ``aclose`` close the sentinels' clients (redis-py's leave them
    open); the idle-only disconnect of a primary change does not."""
    import asyncio

    from sessionfork.core import connections

    client = connections.queue_client(config.Settings(), "redis+sentinel://a:1,b:2/svc")
    closed: list[object] = []
    sentinels = client.connection_pool.sentinel_manager.sentinels  # type: ignore[attr-defined]
    for s in sentinels:
        s.close = lambda s=s: closed.append(s)
    client.close()
    assert closed == sentinels

    async def aclose() -> list[object]:
        pool = connections.async_pool("redis+sentinel://a:1,b:2/svc", max_connections=2)
        done: list[object] = []
        for s in pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            async def record(s: object = s) -> None:
                done.append(s)
            s.aclose = record
        await pool.disconnect(inuse_connections=False)  # a primary change: the sentinels stay
        assert done == []
        await pool.disconnect()
        return done

    assert len(asyncio.run(aclose())) == 2
