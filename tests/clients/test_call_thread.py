"""The sync client's call thread (``connections.CallThread``): a thread's calls run their Redis
work in one thread kept between them, not in a thread started per call; the thread ends once idle,
and the next call starts it again; a call cut at its deadline leaves its thread to the cut work
(``tests/clients/test_client_bounds.py`` asserts the next call takes a new one)."""

from __future__ import annotations

import threading
import time

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


def test_calls_put_while_the_thread_ends_are_all_run() -> None:
    """A call handed over as the idle thread decides to end is run (by it, or by a new thread)."""
    caller = CallThread(idle=0.001)
    ran: list[int] = []
    threads: set[threading.Thread] = set()
    lock = threading.Lock()

    def call(i: int) -> None:
        with lock:
            ran.append(i)
            threads.add(threading.current_thread())

    for i in range(2000):
        caller.run(lambda i=i: call(i))  # type: ignore[misc]
        if i % 50 == 0:
            time.sleep(0.002)  # not synchronisation: lets the thread go idle and end between calls
    ended_by = time.monotonic() + 20
    while len(ran) < 2000 and time.monotonic() < ended_by:
        time.sleep(0.01)
    assert sorted(ran) == list(range(2000))
    assert len(threads) > 1  # the race ran: the thread ended between calls and a call started a new one
