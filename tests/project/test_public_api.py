"""The public API is what the public modules' __all__ say; a change to it is a conscious one.

Every public object, and every public method, property and data field of a public class, has a
docstring: the API reference (docs/reference.md) renders these, and hides a member without one.
"""

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import griffe
import pytest

import sessionfork

PUBLIC = {
    "sessionfork": [
        "BundleManifest", "ChildError", "Diff", "ErrorCode", "Event", "FanOut", "ForkError", "ForkFailure",
        "ForkResult", "Header", "Imported", "LiveHandle", "MergeFailure", "MergeOptions", "MergeReply", "MergeResult",
        "Merged", "MergedFrom", "MergedInto", "NewEvent", "Registry", "Reply", "SeedMeta", "SelectFailure",
        "SelectReply", "SelectResult", "SessionState", "SessionUsage", "Snapshot", "Summary", "Usage", "diff",
        "export_bundle", "fork", "fork_many", "import_bundle", "merge", "select", "snapshot",
    ],
    "sessionfork.client": [
        "ChildError", "Client", "ClientMergeOptions", "ForkFailure", "ForkOptions", "ForkRequest", "ForkResult",
        "MergeFailure", "MergeReply", "MergeRequest", "MergeResult", "Reply", "SelectFailure", "SelectReply",
        "SelectRequest", "SelectResult", "Variant", "shard_of",
    ],
    "sessionfork.aio": [
        "AsyncClient", "ChildError", "ClientMergeOptions", "ForkFailure", "ForkOptions", "ForkRequest", "ForkResult",
        "MergeFailure", "MergeReply", "MergeRequest", "MergeResult", "Reply", "SelectFailure", "SelectReply",
        "SelectRequest", "SelectResult", "Variant", "shard_of",
    ],
    "sessionfork.embedded": [
        "EmbeddedCluster", "EmbeddedSentinel", "EmbeddedServer", "ServerNotAvailable", "find_server_binary",
        "free_cluster_port", "free_port", "wait_until",
    ],
    "sessionfork.integrations.langgraph": [
        "CHECKPOINT_EVENT", "MERGE_MARK", "STRATEGIES", "WRITES_EVENT", "SessionforkSaver",
    ],
}


@pytest.mark.parametrize("module", PUBLIC)
def test_all_is_pinned(module: str) -> None:
    assert importlib.import_module(module).__all__ == PUBLIC[module]


@pytest.mark.parametrize("module", PUBLIC)
def test_every_name_in_all_exists(module: str) -> None:
    loaded = importlib.import_module(module)
    for name in loaded.__all__:
        assert getattr(loaded, name) is not None


def test_the_reply_types_are_one_class_whichever_module_exports_them() -> None:
    import sessionfork.aio
    import sessionfork.client

    for name in ["ChildError", "ForkFailure", "ForkResult", "Reply"]:
        assert getattr(sessionfork.client, name) is getattr(sessionfork, name) is getattr(sessionfork.aio, name)


def undocumented() -> list[str]:
    """The public objects without a docstring, as their public paths: each name in a public
    ``__all__``; for a class, each public method and property it defines and, for a data class
    (a msgspec Struct, a dataclass, a TypedDict), each field (an Enum's members are its values)."""
    src = Path(sessionfork.__file__).resolve().parents[1]
    package = griffe.load("sessionfork", search_paths=[str(src)], resolve_aliases=True)
    missing = []
    for module, names in PUBLIC.items():
        found = package if module == "sessionfork" else package[module.split(".", 1)[1]]
        for name in names:
            obj = found[name].final_target if found[name].is_alias else found[name]
            if not obj.docstring:
                missing.append(f"{module}.{name}")
            if not obj.is_class:
                continue
            runtime = getattr(importlib.import_module(module), name)
            typed_dict = type(runtime).__name__ == "_TypedDictMeta"
            fields = {*getattr(runtime, "__struct_fields__", ()), *getattr(runtime, "__dataclass_fields__", ()),
                      *(runtime.__annotations__ if typed_dict else ())}
            data = bool(fields)
            for member_name, member in obj.members.items():
                if member_name.startswith("_") or member.is_alias:
                    continue
                wanted = member.is_function or "property" in member.labels or (data and member_name in fields)
                if wanted and not member.docstring:
                    missing.append(f"{module}.{name}.{member_name}")
    return missing


def test_every_public_object_has_a_docstring() -> None:
    assert undocumented() == []


def test_error_codes_are_the_contract() -> None:
    assert [c.value for c in sessionfork.ErrorCode] == [
        "SESSION_NOT_FOUND", "SESSION_NOT_LIVE", "SESSION_ALREADY_EXISTS", "OPEN_TURN", "INVALID_BOUNDARY",
        "PRECONDITION_FAILED",
        "INVALID_REQUEST", "IDEMPOTENCY_CONFLICT", "INTERNAL", "WRONG_SHARD", "NOT_DESCENDANT", "ALREADY_MERGED",
        "REQUEST_NOT_FOUND",
        "INVALID_BUNDLE",
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
