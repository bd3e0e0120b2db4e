"""Settings, read from an injected environment mapping (only entry points pass ``os.environ``).

The settings themselves (every limit and timing of the service, with its default and the variable
that sets it) are in ``settings``; this module reads and checks them, and re-exports them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec

from .settings import BOUNDS, ENQUEUE_MODES, ENV, NAME_MAX_LENGTH, Settings

__all__ = ["BOUNDS", "ENQUEUE_MODES", "ENV", "NAME_MAX_LENGTH", "SENTINEL_PORT", "SENTINEL_SCHEMES", "URL_SCHEMES",
           "ConfigError", "SentinelURL", "Settings", "check_address", "check_url", "from_environ", "parse_sentinel_url",
           "redacted", "split_urls", "with_shard"]

URL_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT = 26379
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # RFC 3986's scheme, then "//"


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


def from_environ(environ: Mapping[str, str], *, flags: Mapping[str, str] | None = None,
                 **overrides: Any) -> Settings:
    """Settings from ``environ`` (variables in ``ENV``), then ``overrides`` (flags; ``None`` = unset).

    ``ConfigError`` names what set the bad value: the variable, or, for a field given in
    ``overrides``, its name in ``flags`` (``{"redis_url": "--redis-url"}``) when it has one."""
    names = {**ENV, **{f: name for f, name in (flags or {}).items() if overrides.get(f) is not None}}
    raw: dict[str, Any] = {}
    for field, var in ENV.items():
        if environ.get(var):
            raw[field] = environ[var]
    raw.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(raw.get("queue_urls"), str):
        raw["queue_urls"] = split_urls(raw["queue_urls"], names["queue_urls"])
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        # Name the variable, not the field: "... - at `$.retries`" -> "SESSIONFORK_RETRIES: ..."
        text = str(exc)
        field = text.rpartition("`$.")[2].rstrip("`")
        raise ConfigError(f"invalid setting {names.get(field, field)}: {text.partition(' - at ')[0]}") from None
    for field, (low, high) in BOUNDS.items():
        value = getattr(settings, field)
        if not low <= value <= high:  # NaN fails too
            raise ConfigError(f"{names[field]} must be between {_number(low)} and {_number(high)}, got {value}")
    if settings.wait_timeout_ms >= settings.socket_timeout * 1000:
        raise ConfigError(f"{names['wait_timeout_ms']} ({settings.wait_timeout_ms}) must be shorter than "
                          f"{names['socket_timeout']} ({settings.socket_timeout} s): WAIT blocks its connection")
    for field in ("redis_url", "queue_url"):
        url = getattr(settings, field)
        if url is not None:
            check_url(url, names[field])
    if settings.enqueue not in ENQUEUE_MODES:
        raise ConfigError(f"{names['enqueue']} must be one of {', '.join(ENQUEUE_MODES)}, got {settings.enqueue!r}")
    _check_shards(settings, names)
    check_address(settings.metrics_address, names["metrics_address"])
    if settings.cluster and settings.redis_url and settings.redis_url.partition("://")[0] in SENTINEL_SCHEMES:
        raise ConfigError(f"{names['cluster']} and a Sentinel {names['redis_url']} exclude each other: a cluster "
                          "fails over by itself")
    for field in ("queue", "reply_channel"):
        name = getattr(settings, field)
        if not 0 < len(name) <= NAME_MAX_LENGTH or not name.isascii() or not name.isprintable() or " " in name:
            raise ConfigError(f"{names[field]} must be 1-{NAME_MAX_LENGTH} printable ASCII characters without "
                              f"spaces, got {name!r}")
    return settings


def split_urls(text: str, what: str) -> list[str]:
    """The URLs of a comma-separated list (``SESSIONFORK_QUEUE_URLS``, ``from_urls``), each stripped.

    A comma starts a new URL only where what follows it begins with a scheme (``redis://``,
    ``rediss://``, ``unix://``, ``redis+sentinel://`` ...): the commas between a Sentinel URL's
    hosts stay in it. An empty entry (``a,,b``, a trailing comma) is kept, empty, for the caller to
    refuse; ``ConfigError`` (naming ``what``) for a list whose first entry has no scheme.
    """
    urls: list[str] = []
    for part in text.split(","):
        if urls and urls[-1].strip() and part.strip() and not _SCHEME.match(part.lstrip()):
            urls[-1] += "," + part  # a Sentinel URL's next host (or a comma of a password)
        else:
            urls.append(part)
    if urls[0].strip() and not _SCHEME.match(urls[0].lstrip()):
        raise ConfigError(f"{what} must be a comma-separated list of URLs, each beginning with its scheme "
                          f"({', '.join(s + '://' for s in URL_SCHEMES)}), got {redacted(urls[0].strip())!r}")
    return [url.strip() for url in urls]


def with_shard(settings: Settings, shard: int | None, what: str = ENV["shard"]) -> Settings:
    """``settings`` serving ``shard`` (``None``: unchanged), checked as ``from_environ`` checks it
    (an error names ``what``: the flag that gave it)."""
    if shard is None:
        return settings
    settings = msgspec.structs.replace(settings, shard=shard)
    _check_shards(settings, {**ENV, "shard": what})
    return settings


def _check_shards(settings: Settings, names: Mapping[str, str]) -> None:
    urls, shard = settings.queue_urls, settings.shard
    if urls is not None:
        if settings.queue_url is not None:
            raise ConfigError(f"{names['queue_url']} and {names['queue_urls']} exclude each other: give one")
        if not urls or any(not url for url in urls):
            raise ConfigError(f"{names['queue_urls']} must list one or more queue server URLs, comma-separated, "
                              "without empty entries")
        for url in urls:
            check_url(url, names["queue_urls"])
        if len(set(urls)) != len(urls):
            raise ConfigError(f"{names['queue_urls']} lists a server twice: each shard needs its own server")
    count = len(urls) if urls else 1
    if shard is not None and not 0 <= shard < count:
        raise ConfigError(f"{names['shard']} must be between 0 and {count - 1} ({names['queue_urls']} lists "
                          f"{count} server(s)), got {shard}")


class SentinelURL(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed ``redis+sentinel://`` URL: where the sentinels are, which service, how to log in."""

    sentinels: tuple[tuple[str, int], ...]
    """The sentinels' (host, port), in URL order; the port defaults to 26379."""
    service: str
    """The monitored primary's name (``sentinel monitor <service> ...``)."""
    db: int = 0
    username: str | None = None
    password: str | None = None
    """Credentials of the data nodes (the primary and its replicas), not of the sentinels."""
    tls: bool = False
    """``rediss+sentinel://``: TLS to the data nodes (the sentinels are spoken to in plain TCP)."""


def parse_sentinel_url(url: str, what: str = "URL") -> SentinelURL:
    """``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/<service>[/db]``, parsed.

    Hosts are names, IPv4 addresses or bracketed IPv6 addresses (``[::1]:26379``). ``ConfigError``
    (naming ``what``, never the password) for another scheme, no host, a port outside 1-65535, no
    service, a database that is not a number, or anything after the database.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SENTINEL_SCHEMES:
        raise ConfigError(f"{what} must be a redis+sentinel:// or rediss+sentinel:// URL, got {redacted(url)!r}")
    netloc, _, path = rest.partition("/")
    netloc, _, _query = netloc.partition("?")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
        if not colon:  # "secret@host": the whole user info is the password, as Kombu reads it
            username, password = None, unquote(user)
    sentinels = tuple(_sentinel_address(part, what, url) for part in hosts.split(","))
    service, _, db = path.split("?")[0].partition("/")
    if not service:
        raise ConfigError(f"{what} must name the Sentinel service after the hosts (…/mymaster), got {redacted(url)!r}")
    if db.endswith("/"):
        db = db[:-1]
    if db and not (db.isascii() and db.isdigit()):
        raise ConfigError(f"{what} must end in /<service> or /<service>/<db number>, got {redacted(url)!r}")
    return SentinelURL(sentinels=sentinels, service=unquote(service), db=int(db or 0), username=username,
                       password=password, tls=scheme == "rediss+sentinel")


def _sentinel_address(part: str, what: str, url: str) -> tuple[str, int]:
    host, port = part, ""
    if part.startswith("["):  # [IPv6]:port
        host, bracket, tail = part[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ConfigError(f"{what} has a malformed IPv6 host {part!r}: {redacted(url)!r}")
        port = tail[1:]
    elif ":" in part:
        host, _, port = part.rpartition(":")
    if not host or (":" in host and not part.startswith("[")):
        raise ConfigError(f"{what} must list sentinels as host:port[,host:port...], got {redacted(url)!r}")
    if part.endswith(":") or (port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)):
        raise ConfigError(f"{what} has a sentinel port outside 1-65535 ({port!r}): {redacted(url)!r}")
    return host, int(port) if port else SENTINEL_PORT


def check_url(url: str, what: str) -> str:
    """Return ``url`` or raise ``ConfigError``: a ``redis://``, ``rediss://`` or ``unix://`` URL
    whose port (if any) is 1-65535 and whose database (if any) is a number, or a Sentinel URL
    that ``parse_sentinel_url`` accepts."""
    if url.partition("://")[0] in SENTINEL_SCHEMES:
        parse_sentinel_url(url, what)
        return url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{what} is not a usable Redis URL ({exc}): {redacted(url)!r}") from None
    if parts.scheme not in URL_SCHEMES:
        raise ConfigError(f"{what} must be a {', '.join(s + '://' for s in URL_SCHEMES)} URL, got {redacted(url)!r}")
    if parts.scheme != "unix":
        db = parts.path.lstrip("/")
        if not parts.hostname or port == 0 or (db and not db.isdigit()):
            raise ConfigError(f"{what} must name a host, a port 1-65535 and a database number, got {redacted(url)!r}")
    return url


_HOST_NAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def check_address(address: str, what: str) -> str:
    """Return ``address`` or raise ``ConfigError`` (naming ``what``): an address to listen on, an
    IPv4 or IPv6 address (unbracketed: ``::``) or a host name (RFC 1123 labels)."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        if not _HOST_NAME.fullmatch(address):
            raise ConfigError(f"{what} must be an IP address or a host name, got {address!r}") from None
    return address


def redacted(url: str) -> str:
    """``url`` without its password (error messages and log lines show it): ``redis://u:***@h``;
    a user without a password is kept (``redis://u@h``); ``pw@host`` (no scheme) is ``***@host``."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, sep, userinfo = head.rpartition("://")
    user, colon, _ = userinfo.partition(":")
    if sep and not colon:
        return url  # a user name only
    return f"{scheme}{sep}{user + ':***' if colon else '***'}@{tail}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
