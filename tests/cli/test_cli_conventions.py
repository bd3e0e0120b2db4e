"""The command line's conventions: ``-h`` everywhere, ``--version`` and
``sessionfork.__version__``, every variable the CLI reads shown in ``--help``, ``--json`` on every
read command, ``wait REQUEST_ID``, a timed-out ``fork --wait`` that says the request stays queued
and how to wait for it, errors that name what the user passed. (Bounds: test_cli_bounds.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from helpers import clean_environ, cli_args, make_client, queue_of
from redis import Redis

import sessionfork
from sessionfork.cli import cli, merge_commands
from sessionfork.clients.client import Client
from sessionfork.core import config, wire
from sessionfork.core.wire import ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.outcomes import Outcomes

COMMANDS = sorted(cli.commands)
IDLE = "idle-queue"
"""A queue no worker serves (the module's worker, once started, serves the default one)."""
READ_COMMANDS = ["diff", "events", "gc", "health", "outcomes", "stats", "tree", "usage"]
"""The commands that show what is stored, each with ``--json``; the others change it (``fork`` and
``wait`` print JSON always)."""


def invoke(*args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner().invoke(cli, list(args), obj=dict(env or {}), prog_name="sessionfork")


def run_cli(url: str | None, *args: str, timeout: float = 60.0, **env: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_args(url, *args), env=clean_environ(**env), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize("args", [[], *([c] for c in COMMANDS)], ids=lambda a: " ".join(a) or "group")
def test_dash_h_is_help_everywhere(args: list[str]) -> None:
    short, long = invoke(*args, "-h"), invoke(*args, "--help")
    assert (short.exit_code, long.exit_code) == (0, 0), short.output
    assert short.output == long.output
    assert short.output.startswith(f"Usage: sessionfork {' '.join(args)}".rstrip())


def test_version_is_the_installed_distributions() -> None:
    assert sessionfork.__version__ == version("sessionfork")
    done = run_cli(None, "--version")
    assert (done.returncode, done.stdout) == (0, f"sessionfork {sessionfork.__version__}\n")


def test_every_variable_the_cli_reads_is_in_its_help() -> None:
    shown = "".join(invoke(*([c] if c else []), "--help").output for c in ["", *COMMANDS])
    shown = " ".join(shown.split())  # click wraps long lines
    assert [var for var in config.ENV.values() if var not in shown] == []


@pytest.mark.parametrize("command", READ_COMMANDS)
def test_every_read_command_has_json(command: str) -> None:
    options = {opt for param in cli.commands[command].params for opt in param.opts}
    assert "--json" in options


def test_health_json(server: EmbeddedServer, redis: Redis) -> None:
    done = run_cli(server.url, "--queue", IDLE, "health", "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == {"ok": False, "queue": IDLE,
                                       "shards": [{"shard": 0, "ok": False, "workers": [], "paused": False}]}


def test_tree_json_is_format_json(server: EmbeddedServer, redis: Redis) -> None:
    sessionfork.Registry(redis).create("t-a")
    assert invoke("--redis-url", server.url, "tree", "t-a", "--json").stdout == \
        invoke("--redis-url", server.url, "tree", "t-a", "--format", "json").stdout


def test_select_takes_its_arguments_in_the_python_clients_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sessionfork select PARENT CANDIDATES... WINNER`` is ``Client.select(parent, candidates,
    winner)``; the deprecated PARENT WINNER CANDIDATES... still selects the same, with a warning."""
    sent: list[bytes] = []
    monkeypatch.setattr(merge_commands, "send", lambda client, request, wait_s: sent.append(wire.encode(request)))
    expected = wire.encode(Client(Redis()).select_request("p", ["k0", "k1", "k2"], "k1", mode="events",
                                                          request_id="r-order"))
    done = invoke("select", "p", "k0", "k1", "k2", "k1", "--mode", "events", "--request-id", "r-order")
    assert (done.exit_code, done.stderr, sent) == (0, "", [expected]), done.output
    old = invoke("select", "p", "k1", "k0", "k1", "k2", "--mode", "events", "--request-id", "r-order")
    assert old.exit_code == 0 and sent[1:] == [expected], old.output
    assert old.stderr == ("warning: `sessionfork select PARENT WINNER CANDIDATES...` is deprecated: give "
                          "`sessionfork select PARENT CANDIDATES... WINNER` (k0 k1 k2 k1)\n")
    both = invoke("select", "p", "k1", "k2", "k1", "--mode", "events", "--request-id", "r-both")
    assert both.exit_code == 0 and both.stderr == "" and json.loads(sent[2])["candidates"] == ["k1", "k2"]
    wrong = invoke("select", "p", "k0", "k1", "k9", "--mode", "events")
    assert wrong.exit_code == 1 and "not one of the candidates" in wrong.stderr and len(sent) == 3


def test_gc_exits_as_its_row_of_the_exit_status_table_says(server: EmbeddedServer, redis: Redis) -> None:
    """Retention off and the branch TTL on (the defaults) is a run (0), not "retention off" (2):
    status 2 only when both are off and no ``--older-than`` is given."""
    table = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| `gc` |"))
    assert row == ("| `gc` | 0 (the branch TTL's disposals, then retention's deletions, each when on); 2 both off "
                   "(`SESSIONFORK_BRANCH_TTL=0`, and `SESSIONFORK_RETENTION=0` without `--older-than`) |")
    defaults = run_cli(server.url, "gc", "--dry-run")
    assert defaults.returncode == 0 and "ended branch(es) would be disposed" in defaults.stderr + defaults.stdout
    both_off = run_cli(server.url, "gc", SESSIONFORK_BRANCH_TTL=0)
    assert both_off.returncode == 2 and "retention is off" in both_off.stderr
    older_than = run_cli(server.url, "gc", "--dry-run", "--older-than", "60", SESSIONFORK_BRANCH_TTL=0)
    assert older_than.returncode == 0 and "session(s) would be deleted" in older_than.stdout, older_than.stderr


def test_the_consoles_missing_extra_says_how_to_install_it_from_a_checkout_not_pypi(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the [console] extra were not installed
    done = invoke("console")
    assert done.exit_code == 2, done.output
    assert "pip install 'sessionfork[console]'" not in done.stderr and "not on PyPI" in done.stderr
    assert "pip install '/path/to/sessionfork[console]'" in " ".join(done.stderr.split())


def test_wait_prints_the_reply_of_a_request_enqueued_before(server: EmbeddedServer, client: Client,
                                                            source: str) -> None:
    queued = run_cli(server.url, "fork", source, "--session-id", "w-child", "--wait", "0")
    assert queued.returncode == 0, queued.stderr
    enqueued = json.loads(queued.stdout)
    assert enqueued["queued"] is True
    done = run_cli(server.url, "wait", enqueued["requestId"], "--timeout", "20")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert (reply["type"], reply["requestId"], reply["session"]["id"]) == \
        ("fork/result", enqueued["requestId"], "w-child")


def test_wait_exits_1_on_an_error_outcome(server: EmbeddedServer, redis: Redis) -> None:
    queued = json.loads(run_cli(server.url, "--queue", IDLE, "fork", "nobody", "--wait", "0").stdout)
    failure = wire.ForkFailure(request_id=queued["requestId"], code="SESSION_NOT_FOUND", message="no")
    Outcomes(redis, ttl=60, stream_maxlen=10).record(failure, "sf:replies")
    done = run_cli(server.url, "wait", queued["requestId"], "--timeout", "5")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["code"] == "SESSION_NOT_FOUND"


def test_a_timed_out_fork_stays_queued_and_says_how_to_wait_for_it(server: EmbeddedServer, redis: Redis) -> None:
    done = run_cli(server.url, "--queue", IDLE, "fork", "src", "--request-id", "r-stays", "--wait", "0.5")
    assert done.returncode == 4, done.stderr
    assert done.stderr == ("error: no reply to request r-stays within 0.5s: the request stays queued; wait for "
                           "its reply with: sessionfork wait r-stays\n")
    assert queue_of(make_client(redis, queue=IDLE)).job_ids == ["r-stays"]
    reply = ForkResult(request_id="r-stays", session=Header(version=0, id="late", created_at=1))
    Outcomes(redis, ttl=60, stream_maxlen=10).record(reply, "sf:replies")
    waited = run_cli(server.url, "wait", "r-stays", "--timeout", "5")
    assert (waited.returncode, json.loads(waited.stdout)["session"]["id"]) == (0, "late")


def test_a_timed_out_wait_says_how_to_wait_again(server: EmbeddedServer, redis: Redis) -> None:
    queued = run_cli(server.url, "--queue", IDLE, "fork", "src", "--request-id", "r-queued", "--wait", "0")
    assert queued.returncode == 0, queued.stderr
    done = run_cli(server.url, "wait", "r-queued", "--timeout", "0.3")
    assert done.returncode == 4, done.stderr
    assert done.stderr == ("error: no reply to request r-queued within 0.3s: it is queued or running; wait again "
                           "with: sessionfork wait r-queued\n")


def test_wait_for_an_unknown_request_id_says_so_at_once(server: EmbeddedServer, redis: Redis) -> None:
    """Not a time-out at the deadline, as for a queued request: status 1, ``REQUEST_NOT_FOUND``, at once."""
    done = run_cli(server.url, "wait", "r-never", "--timeout", "600", timeout=30)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr == ('error: REQUEST_NOT_FOUND: request "r-never" is not known: not queued, running nor '
                           "answered (never enqueued on this queue server, or its outcome expired)\n")


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--redis-url", "notaurl", "health"], {}, "--redis-url"),
    (["health"], {"REDIS_URL": "notaurl"}, "REDIS_URL"),
    (["--queue-url", "redis://h:99999/0", "health"], {}, "--queue-url"),
    (["--queue-urls", "notaurl", "health"], {}, "--queue-urls"),
    (["--queue", "a b", "health"], {}, "--queue"),
    (["health"], {"SESSIONFORK_QUEUE": "a b"}, "SESSIONFORK_QUEUE"),
    (["--reply-channel", "a b", "health"], {}, "--reply-channel"),
    (["--queue-urls", "redis://a:1/0,redis://b:1/0", "worker", "--shard", "5"], {}, "--shard"),
    (["--queue-urls", "redis://a:1/0,redis://b:1/0", "health"], {"SESSIONFORK_SHARD": "5"}, "SESSIONFORK_SHARD"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_an_error_names_what_the_user_passed(args: list[str], env: dict[str, str], named: str) -> None:
    done = run_cli(None, *args, **env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {named} "), done.stderr
    other = {"--redis-url": "REDIS_URL", "REDIS_URL": "--redis-url", "--queue": "SESSIONFORK_QUEUE",
             "--shard": "SESSIONFORK_SHARD "}.get(named)
    assert other is None or other not in done.stderr, done.stderr
