"""The sync client's call thread (``connections.CallThread``): a thread's calls run their Redis
work in one thread kept between them, not in a thread started per call; the thread ends once idle,
and the next call starts it again; a call cut at its deadline leaves its thread to the cut work
(``tests/clients/test_client_bounds.py`` asserts the next call takes a new one)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from redis import Redis

from sessionfork.client import Client
from sessionfork.core.connections import CallThread


def test_one_threads_calls_run_their_redis_work_in_one_kept_thread(redis: Redis) -> None:
    client = Client(redis)
    ran_in: list[threading.Thread] = []
    submit = client._submit

    def spy(request: object) -> tuple[str, int]:
        ran_in.append(threading.current_thread())
        return submit(request)  # type: ignore[arg-type]

    client._submit = spy  # type: ignore[method-assign]
    ids = [client.submit(client.request("src", request_id=f"ct-{i}")) for i in range(20)]
    assert ids == [f"ct-{i}" for i in range(20)]
    assert len(ran_in) == 20 and len(set(ran_in)) == 1  # one thread for all twenty calls
    assert ran_in[0] is not threading.current_thread() and ran_in[0].name == "sessionfork-call"
    assert redis.llen("rq:queue:sessionfork") == 20
    # Another calling thread has a thread of its own (a thread's calls never queue behind another's).
    other: list[threading.Thread] = []
    helper = threading.Thread(target=lambda: (client.submit(client.request("src", request_id="ct-other")),
                                              other.extend(ran_in[-1:])))
    helper.start()
    helper.join(30)
    assert other and other[0] is not ran_in[0]


def test_a_call_thread_ends_once_idle_and_the_next_call_starts_it_again() -> None:
    caller = CallThread(idle=0.2)
    ran: list[threading.Thread] = []
    done = threading.Event()
    caller.run(lambda: (ran.append(threading.current_thread()), done.set()))
    assert done.wait(10)
    first = ran[0]
    ended_by = time.monotonic() + 10
    while first.is_alive() and time.monotonic() < ended_by:
        first.join(0.05)
    assert not first.is_alive()  # ended after 0.2 s without a call
    done.clear()
    caller.run(lambda: (ran.append(threading.current_thread()), done.set()))
    assert done.wait(10)
    assert len(ran) == 2 and ran[1] is not first


def test_a_call_handed_over_as_the_idle_thread_ends_is_run() -> None:
    """The race, made to happen: the thread's wait times out, and a call is handed over before the
    thread takes its lock to end. The thread sees it and runs it (no later call rescues it)."""
    caller = CallThread(idle=0.05)
    late = threading.Event()
    raced: list[bool] = []
    calls = caller._calls

    class Racing:
        def put(self, call: Callable[[], None]) -> None:
            calls.put(call)

        def empty(self) -> bool:
            return calls.empty()

        def get(self, timeout: float) -> Callable[[], None]:
            if not raced:  # the first wait: it times out as the last call arrives
                raced.append(True)
                caller.run(late.set)
                raise queue.Empty
            return calls.get(timeout=timeout)

    caller._calls = Racing()  # type: ignore[assignment]
    first = threading.Event()
    caller.run(first.set)
    assert late.wait(10)  # the late call ran
    assert first.wait(10)
    assert raced == [True]  # the race happened
