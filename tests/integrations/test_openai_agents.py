"""``SessionforkSession``: the OpenAI Agents SDK's ``Session`` over a real server's registry.

The SDK's own session tests' expectations (its ``tests/memory/test_session.py``: item order,
``limit``, ``pop_item`` of the newest item down to ``None``, ``clear_session``), the SDK's
``Runner`` with its scripted model (``agents.testing.ScriptedModel``: canned responses, no
network) over a session that is then forked, both branches continued apart and one merged back,
and the append-only log under it (markers read, never deletions)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from agents import Agent, Runner, TResponseInputItem, set_tracing_disabled
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message

from sessionfork import ErrorCode, ForkError, Registry
from sessionfork.integrations.openai_agents import CLEAR, ITEM, POP, SessionforkSession

T = TypeVar("T")
set_tracing_disabled(True)  # the SDK's tracing exports over the network: nothing leaves this machine


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def texts(items: list[TResponseInputItem]) -> list[Any]:
    """Each item's text: a message's ``content`` (a string, or its parts' text)."""
    out = []
    for item in items:
        content = item.get("content")
        out.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content or []))
    return out


SIX: list[TResponseInputItem] = [
    {"role": "user", "content": "Message 1"}, {"role": "assistant", "content": "Response 1"},
    {"role": "user", "content": "Message 2"}, {"role": "assistant", "content": "Response 2"},
    {"role": "user", "content": "Message 3"}, {"role": "assistant", "content": "Response 3"},
]


def test_it_is_a_session_of_the_sdk(registry: Registry) -> None:
    assert isinstance(SessionforkSession("chat-proto", registry), Session)


def test_items_read_back_in_order_and_clear_empties_them(registry: Registry) -> None:
    session = SessionforkSession("chat-direct", registry)

    async def main() -> None:
        assert await session.get_items() == []
        await session.add_items([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"}])
        await session.add_items([{"role": "user", "content": "again"}])
        got = await session.get_items()
        assert [(i.get("role"), i.get("content")) for i in got] == [
            ("user", "Hello"), ("assistant", "Hi there!"), ("user", "again")]
        await session.clear_session()
        assert await session.get_items() == []
        await session.add_items([{"role": "user", "content": "after"}])
        assert texts(await session.get_items()) == ["after"]

    run(main())


def test_limit_gives_the_newest_items_oldest_first(registry: Registry) -> None:
    session = SessionforkSession("chat-limit", registry)

    async def main() -> None:
        await session.add_items(SIX)
        assert texts(await session.get_items()) == [i["content"] for i in SIX]
        assert texts(await session.get_items(limit=2)) == ["Message 3", "Response 3"]
        assert texts(await session.get_items(limit=4)) == ["Message 2", "Response 2", "Message 3", "Response 3"]
        assert len(await session.get_items(limit=10)) == 6
        assert await session.get_items(limit=0) == []
        settled = SessionforkSession("chat-limit", registry, session_settings=SessionSettings(limit=3))
        assert texts(await settled.get_items()) == ["Response 2", "Message 3", "Response 3"]
        assert len(await settled.get_items(limit=5)) == 5

    run(main())


def test_pop_item_returns_the_newest_item_until_none_is_left(registry: Registry) -> None:
    session = SessionforkSession("chat-pop", registry)

    async def main() -> None:
        assert await session.pop_item() is None
        await session.add_items([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"},
                                 {"role": "user", "content": "How are you?"}])
        popped = await session.pop_item()
        assert popped == {"role": "user", "content": "How are you?"}
        assert texts(await session.get_items()) == ["Hello", "Hi there!"]
        assert (await session.pop_item()) == {"role": "assistant", "content": "Hi there!"}
        assert (await session.pop_item()) == {"role": "user", "content": "Hello"}
        assert await session.pop_item() is None
        assert await session.get_items() == []

    run(main())


def test_pop_and_clear_append_markers_the_log_keeps_every_item(registry: Registry) -> None:
    session = SessionforkSession("chat-log", registry)

    async def main() -> None:
        await session.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        await session.pop_item()
        await session.clear_session()

    run(main())
    types = [e.type for e in registry.events("chat-log")]
    assert types == ["turn/start", ITEM, ITEM, "turn/end", "turn/start", POP, "turn/end",
                     "turn/start", CLEAR, "turn/end"]
    assert [e.data for e in registry.events("chat-log") if e.type == ITEM] == [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]


def test_concurrent_pops_never_pop_one_item_twice(registry: Registry) -> None:
    session = SessionforkSession("chat-race", registry)
    run(session.add_items([{"role": "user", "content": str(i)} for i in range(8)]))
    popped: list[Any] = []
    start = threading.Barrier(4)

    def popper() -> None:
        start.wait()
        for _ in range(2):
            popped.append(run(session.pop_item()))

    threads = [threading.Thread(target=popper) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(texts(popped), key=int) == [str(i) for i in range(8)]
    assert run(session.get_items()) == []
    assert [e.type for e in registry.events("chat-race")].count(POP) == 8


def test_a_pop_racing_another_pop_pops_the_next_item(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    session = SessionforkSession("chat-race-2", registry)
    run(session.add_items([{"role": "user", "content": str(i)} for i in range(3)]))
    real, raced, other = registry.append, threading.Event(), []

    def append(ref: Any, events: Any, **options: Any) -> Any:
        if not raced.is_set() and any(e.type == POP for e in events):  # between this pop's read and write
            raced.set()
            other.append(run(session.pop_item()))             # another writer pops the same newest item
        return real(ref, events, **options)

    monkeypatch.setattr(registry, "append", append)
    outer = run(session.pop_item())
    assert other == [{"role": "user", "content": "2"}]       # the race happened: the other pop came first
    assert outer == {"role": "user", "content": "1"}          # this pop read again and popped the next
    assert texts(run(session.get_items())) == ["0"]


def test_a_write_is_one_atomic_turn_and_bad_input_writes_nothing(registry: Registry) -> None:
    session = SessionforkSession("chat-bad", registry)
    with pytest.raises(ForkError) as err:
        run(session.add_items([{"role": "user", "content": "ok"}, {"role": "user", "content": {1, 2}}]))
    assert err.value.code is ErrorCode.INVALID_REQUEST
    assert not registry.exists("chat-bad")
    with pytest.raises(ForkError) as bad_id:
        SessionforkSession("no spaces", registry)
    assert bad_id.value.code is ErrorCode.INVALID_REQUEST


def test_a_fork_is_independent_of_its_source(registry: Registry) -> None:
    main_line = SessionforkSession("chat-fork", registry)

    async def main() -> None:
        await main_line.add_items(SIX[:2])
        branch = await main_line.fork("chat-fork.b")
        assert texts(await branch.get_items()) == ["Message 1", "Response 1"]
        await branch.add_items([{"role": "user", "content": "only in the branch"}])
        assert (await branch.pop_item()) == {"role": "user", "content": "only in the branch"}
        assert (await branch.pop_item()) == SIX[1]          # a seed item, popped in the branch only
        await main_line.add_items([{"role": "user", "content": "only in the source"}])
        assert texts(await branch.get_items()) == ["Message 1"]
        assert texts(await main_line.get_items()) == ["Message 1", "Response 1", "only in the source"]
        await branch.clear_session()
        assert len(await main_line.get_items()) == 3

    run(main())
    assert registry.header("chat-fork.b").seed_length == 4  # by reference: the source's 4 events


def test_a_merge_brings_back_the_branch_items_net_of_its_pops(registry: Registry) -> None:
    parent = SessionforkSession("chat-merge", registry)

    async def main() -> None:
        await parent.add_items(SIX[:2])
        branch = await parent.fork()
        await branch.pop_item()                                   # the parent's item: not removed there
        await branch.add_items([{"role": "user", "content": "kept"}, {"role": "user", "content": "dropped"}])
        await branch.pop_item()
        await parent.add_items([{"role": "user", "content": "meanwhile"}])
        merged = await branch.merge()
        assert merged.parent == "chat-merge" and merged.child == branch.session_id
        assert texts(await parent.get_items()) == ["Message 1", "Response 1", "meanwhile", "kept"]
        assert texts(await parent.get_items(limit=2)) == ["meanwhile", "kept"]
        await branch.add_items([{"role": "user", "content": "later"}])
        await branch.clear_session()                              # clears the branch's merged items too
        again = await branch.merge(parent, range=(merged.to_seq + 1, registry.length(branch.session_id) - 1))
        assert again.first == merged.length
        assert texts(await parent.get_items()) == ["Message 1", "Response 1", "meanwhile"]
        assert (await parent.pop_item()) == {"role": "user", "content": "meanwhile"}

    run(main())


def test_merging_a_session_never_forked_names_what_to_merge_into(registry: Registry) -> None:
    alone = SessionforkSession("chat-alone", registry)
    run(alone.add_items(SIX[:1]))
    with pytest.raises(ForkError) as err:
        run(alone.merge())
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_the_runner_forks_continues_both_branches_and_merges_one_back(registry: Registry) -> None:
    model = ScriptedModel([[assistant_message("San Francisco")], [assistant_message("California")],
                           [assistant_message("The Golden Gate")], [assistant_message("Sausalito")]])
    agent = Agent(name="guide", model=model)
    session = SessionforkSession("trip", registry)

    async def main() -> None:
        first = await Runner.run(agent, "What city is the Golden Gate Bridge in?", session=session)
        assert first.final_output == "San Francisco"
        branch = await session.fork("trip.north")
        on_main = await Runner.run(agent, "What state is it in?", session=session)
        assert on_main.final_output == "California"
        on_branch = await Runner.run(agent, "What bridge is it?", session=branch)
        assert on_branch.final_output == "The Golden Gate"
        # each branch's model call saw the shared history and its own question only
        assert texts(model.calls[1].input) == ["What city is the Golden Gate Bridge in?", "San Francisco",
                                               "What state is it in?"]
        assert texts(model.calls[2].input) == ["What city is the Golden Gate Bridge in?", "San Francisco",
                                               "What bridge is it?"]
        await branch.merge()
        assert texts(await session.get_items()) == [
            "What city is the Golden Gate Bridge in?", "San Francisco", "What state is it in?", "California",
            "What bridge is it?", "The Golden Gate"]
        after = await Runner.run(agent, "And across it?", session=session)
        assert after.final_output == "Sausalito"
        assert texts(model.calls[3].input)[-3:] == ["What bridge is it?", "The Golden Gate", "And across it?"]
        assert len(await branch.get_items()) == 4              # the branch goes on as it was

    run(main())
    assert model.remaining_steps == 0


def run_sync(agent: Agent[Any], text: str, session: SessionforkSession) -> Any:
    """``Runner.run_sync`` as the SDK's own session tests call it: on a loop of its own, closed after."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, text, session=session)
    finally:
        loop.close()
        asyncio.set_event_loop(None)


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
def test_every_runner_method_reads_and_writes_the_history(registry: Registry, runner_method: str) -> None:
    model = ScriptedModel([[assistant_message("Hello")], [assistant_message("I remember you said hi")]])
    agent = Agent(name="test", model=model)
    session = SessionforkSession(f"chat-{runner_method}", registry)

    async def turn(text: str) -> Any:
        if runner_method == "run":
            return await Runner.run(agent, text, session=session)
        if runner_method == "run_sync":  # in a thread of its own, on an event loop closed after it
            return await asyncio.to_thread(run_sync, agent, text, session)
        streamed = Runner.run_streamed(agent, text, session=session)
        async for _ in streamed.stream_events():
            pass
        return streamed

    async def main() -> None:
        assert (await turn("Hi there")).final_output == "Hello"
        assert (await turn("Do you remember what I said?")).final_output == "I remember you said hi"
        assert texts(model.calls[1].input) == ["Hi there", "Hello", "Do you remember what I said?"]
        assert len(await session.get_items()) == 4

    run(main())
