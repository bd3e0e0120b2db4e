"""The public API is what __all__ says; a change to it is a conscious one."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import sessionfork


def test_all_is_pinned() -> None:
    assert sessionfork.__all__ == [
        "ErrorCode", "Event", "ForkError", "Header", "LiveHandle", "NewEvent", "Registry", "SeedMeta",
        "Snapshot", "Summary", "fork", "snapshot",
    ]


def test_every_name_in_all_exists() -> None:
    for name in sessionfork.__all__:
        assert getattr(sessionfork, name) is not None


def test_error_codes_are_the_contract() -> None:
    assert [c.value for c in sessionfork.ErrorCode] == [
        "SESSION_NOT_FOUND", "SESSION_NOT_LIVE", "SESSION_ALREADY_EXISTS", "OPEN_TURN", "INVALID_BOUNDARY",
        "PRECONDITION_FAILED",
        "INVALID_REQUEST", "IDEMPOTENCY_CONFLICT", "INTERNAL", "WRONG_SHARD",
    ]


def test_a_forks_options_are_typed_once_and_an_unknown_one_is_a_mypy_error(tmp_path: Path) -> None:
    """Both clients' ``request`` and ``fork`` take ``ForkOptions``: mypy names a misspelt option and
    a wrongly typed one, and accepts the documented calls."""
    caller = tmp_path / "caller.py"
    caller.write_text(textwrap.dedent("""
        from sessionfork.aio import AsyncClient
        from sessionfork.client import Client, ForkOptions, Variant

        async def main(client: Client, aio: AsyncClient, options: ForkOptions) -> None:
            client.fork("s", session_id="c", if_length=2, timeout=5)
            client.request("s", variants=[Variant("v")])
            client.request("s", **options)
            await aio.fork("s", count=2, timeout=1)
            client.fork("s", sesion_id="c", timeout=1)
            await aio.request("s", sesion_id="c")
            await aio.fork("s", count="2")
    """))
    src = Path(sessionfork.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-version", "3.11",
                           str(caller)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "MYPYPATH": str(src)})
    errors = [line.split(": error: ")[1] for line in done.stdout.splitlines() if ": error: " in line]
    assert errors == [
        'Unexpected keyword argument "sesion_id" for "fork" of "Client"; did you mean "session_id"?  [call-arg]',
        'Unexpected keyword argument "sesion_id" for "request" of "AsyncClient"; did you mean "session_id"?  '
        "[call-arg]",
        'Argument "count" to "fork" of "AsyncClient" has incompatible type "str"; expected "int | None"  [arg-type]',
    ], done.stdout + done.stderr
