"""A communicator's queue of nonblocking calls carried out by its progress thread and by
the callers that wait: every call once, in call order, never two at a time."""

from __future__ import annotations

import threading
import time

import pytest

from ringmpi import _progress


class Calls:
    """Jobs whose runs record who ran them and in what order, and whether two ran at
    once."""

    def __init__(self) -> None:
        self.ran: list[tuple[int, int]] = []  # (call number, the thread that ran it)
        self.running = 0
        self.overlapped = False

    def job(self, number: int, seconds: float = 0.0) -> _progress.Job:
        def run() -> None:
            self.running += 1
            self.overlapped |= self.running > 1
            if seconds:
                time.sleep(seconds)
            self.ran.append((number, threading.get_ident()))
            self.running -= 1

        return _progress.Job(run)


@pytest.fixture
def queue():
    made: list[_progress.Progress] = []

    def make(poll: bool) -> _progress.Progress:
        made.append(_progress.Progress(True, poll=poll))
        return made[-1]

    yield make
    for progress in made:
        progress.free()
    assert not _progress.pending


@pytest.mark.parametrize("poll", [False, True])
def test_each_call_runs_once_in_order_whoever_waits(queue, poll):
    progress, calls = queue(poll), Calls()
    jobs = []
    for i in range(300):
        jobs.append(calls.job(i, seconds=0.0005 if i % 50 == 0 else 0.0))
        progress.submit(jobs[-1])
        if i % 3 == 2:
            progress.wait(jobs[i - 1])
            assert jobs[i - 1].done and jobs[i - 2].done
        if i % 7 == 6:
            progress.drain()
            assert all(job.done for job in jobs)
    progress.drain()
    assert [number for number, _ in calls.ran] == list(range(300))
    assert not calls.overlapped
    assert all(job.done and job.error is None for job in jobs)


def test_a_wait_before_the_thread_takes_a_call_carries_it_out_itself(queue, monkeypatch):
    monkeypatch.setattr(_progress, "_GRACE_NS", 50_000_000)  # the thread waits 50 ms
    monkeypatch.setattr(_progress, "_POLL_NS", 2_000_000_000)
    progress, calls = queue(True), Calls()
    for i in range(20):
        job = calls.job(i)
        progress.submit(job)
        progress.wait(job)
        assert job.done
    assert calls.ran == [(i, threading.get_ident()) for i in range(20)]
    left = calls.job(20)  # not waited for: the thread's, once its grace is over
    progress.submit(left)
    deadline = time.monotonic() + 10
    while not left.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert left.done
    assert progress._thread is not None
    assert calls.ran[-1] == (20, progress._thread.ident)


def test_a_wait_behind_the_threads_call_carries_its_own_out_once_that_ends(queue, monkeypatch):
    monkeypatch.setattr(_progress, "_GRACE_NS", 50_000_000)  # the thread waits 50 ms
    monkeypatch.setattr(_progress, "_POLL_NS", 2_000_000_000)
    progress, calls = queue(True), Calls()
    first = calls.job(0, seconds=0.1)
    progress.submit(first)  # not waited for: the thread's, once its grace is over
    deadline = time.monotonic() + 10
    while progress._running is not first and time.monotonic() < deadline:
        time.sleep(0.001)
    assert progress._running is first
    second = calls.job(1)
    progress.submit(second)
    progress.wait(second)  # the thread's call ends first; the second is not its
    assert first.done and second.done
    assert progress._thread is not None
    assert calls.ran == [(0, progress._thread.ident), (1, threading.get_ident())]
