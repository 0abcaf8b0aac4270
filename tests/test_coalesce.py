"""Coalesced calls (ondemand/coalesce.py): a burst of callers shares one call, none gets a
result computed before it asked, and a failure or a leaving caller reaches only whom it
should."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ondemand.coalesce import Coalesced


class Recorder:
    """fn(key, arg) that records its calls and blocks until released."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[int, float]] = []
        self.begun = threading.Condition()
        self.release = threading.Event()
        self.fail = fail

    def __call__(self, key: int, arg: float) -> str:
        with self.begun:
            self.calls.append((key, arg))
            number = len(self.calls)
            self.begun.notify_all()
        assert self.release.wait(10)
        if self.fail:
            raise RuntimeError("the database went away")
        return f"row {key} read #{number}"


async def begun(recorder: Recorder, calls: int) -> None:
    """Until `calls` calls have begun."""

    def wait() -> bool:
        with recorder.begun:
            return recorder.begun.wait_for(lambda: len(recorder.calls) >= calls, 10)

    assert await asyncio.to_thread(wait)


async def test_it_serves_a_burst_with_one_call_and_a_later_caller_with_a_new_one() -> None:
    recorder = Recorder()
    coalesced = Coalesced(recorder)
    burst = [asyncio.ensure_future(coalesced(7, seconds)) for seconds in (1.0, 5.0, 3.0)]
    other = asyncio.ensure_future(coalesced(8))
    await begun(recorder, 2)
    # Asked after the first call began: it gets a call of its own, not that call's result.
    late = asyncio.ensure_future(coalesced(7, 2.0))
    await asyncio.sleep(0.05)
    recorder.release.set()
    assert await asyncio.gather(*burst) == [burst[0].result()] * 3
    assert {(7, 5.0), (8, 0.0)} <= set(recorder.calls)  # the largest asked for
    await other
    assert await late != burst[0].result()
    assert sorted(recorder.calls) == [(7, 2.0), (7, 5.0), (8, 0.0)]
    assert not coalesced.waiting


async def test_it_gives_a_failure_to_every_caller_and_keeps_a_leaving_callers_call() -> None:
    recorder = Recorder(fail=True)
    coalesced = Coalesced(recorder)
    leaving = asyncio.ensure_future(coalesced(1))
    staying = asyncio.ensure_future(coalesced(1))
    await begun(recorder, 1)
    leaving.cancel()
    recorder.release.set()
    with pytest.raises(RuntimeError, match="went away"):
        await staying
    assert leaving.cancelled() and len(recorder.calls) == 1
    # The next call is a new one, and it may succeed.
    recorder.fail = False
    assert await coalesced(1) == "row 1 read #2"
