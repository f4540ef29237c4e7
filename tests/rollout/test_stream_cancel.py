"""Issue 32: the canary's probe (`VLLMEngine.run_on_loop`) ran while the async episode stream
generated on the same engine loop, cancelled the stream's requests, and the stream lost those
groups without a word (the run polled forever). A stand-in for vLLM (the real `run_on_loop`,
`generate` and `EpisodeStream`, a fake request) times the stream's request inside the probe.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from toolrl.core.background import BackgroundLoop
from toolrl.rollout.engine import EngineError, SamplingConfig, VLLMEngine
from toolrl.rollout.stream import EpisodeStream, GroupJob, StreamError

pytest.importorskip("vllm", reason="SamplingConfig.to_vllm needs vllm")


class FakeRequests:
    """The engine's `_generate`: each request waits on its own gate; what happened to it is
    recorded (``finished`` / ``cancelled``)."""

    def __init__(self, loop: BackgroundLoop) -> None:
        self.loop = loop
        self.gates: dict[str, asyncio.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.outcome: dict[str, str] = {}

    def gate(self, rid: str) -> asyncio.Event:
        if rid not in self.gates:
            self.gates[rid] = asyncio.Event()
        return self.gates[rid]

    async def __call__(self, prompt, params, rid, want_logprobs):
        self.started.setdefault(rid, threading.Event()).set()
        try:
            await self.gate(rid).wait()
        except asyncio.CancelledError:
            self.outcome[rid] = "cancelled"
            raise
        self.outcome[rid] = "finished"
        return []

    def wait_started(self, rid: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not (rid in self.started and self.started[rid].is_set()):
            assert time.monotonic() < deadline, f"request {rid} never started"
            time.sleep(0.01)

    def release(self, rid: str) -> None:
        self.loop.run_sync(_set(self, rid), timeout=10)


async def _set(requests: FakeRequests, rid: str) -> None:
    requests.gate(rid).set()


@pytest.fixture
def engine():
    """A `VLLMEngine` without vLLM: its own loop, `generate` down to a fake `_generate`."""
    eng = object.__new__(VLLMEngine)
    eng._loop = BackgroundLoop("test-engine-loop", error=EngineError).start()
    eng._llm = None
    eng.max_model_len = 64
    eng.requests = FakeRequests(eng._loop)
    eng._generate = eng.requests
    eng._closed = True  # nothing for __del__ / shutdown to stop but the loop
    yield eng
    eng._loop.stop()


SAMPLING = SamplingConfig(max_tokens=1)


def test_a_probe_does_not_cancel_the_streams_requests(engine):
    """The probe returns while a stream request it did not start is in flight: the request
    goes on (before the fix `_scoped` cancelled it and the stream lost its group)."""
    requests = engine.requests
    stream = EpisodeStream(lambda job: engine.generate([1, 2, 3], SAMPLING,
                                                       request_id=job.uid),
                           version=lambda: 0, max_groups=4)
    probe_done = threading.Event()

    async def probe() -> None:
        await engine.generate([1, 2], SAMPLING, request_id="probe")

    def run_probe() -> None:
        engine.run_on_loop(probe())
        probe_done.set()

    prober = threading.Thread(target=run_probe, daemon=True)
    try:
        prober.start()
        requests.wait_started("probe")
        stream.submit([GroupJob("g1", {"id": "g1"}, 1)])  # inside the probe's window
        requests.wait_started("g1")
        requests.release("probe")
        assert probe_done.wait(10)
        time.sleep(0.2)  # the scope's clean-up has run (it awaits what it cancels)
        assert requests.outcome == {"probe": "finished"}  # g1 still generating
        assert stream.in_flight == 1
        assert stream.poll(0.0) == []
    finally:
        stream.stop(timeout=10)
        prober.join(5)


def test_run_on_loop_still_cancels_the_tasks_it_left(engine):
    """What the coroutine itself started and left running is cancelled when it returns, and
    so is what those tasks started."""
    seen: list[str] = []
    kept: list[asyncio.Future] = []  # references the loop itself does not keep

    async def leaves_tasks() -> None:
        async def child() -> None:
            kept.append(asyncio.ensure_future(grandchild()))
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen.append("child")
                raise

        async def grandchild() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen.append("grandchild")
                raise

        kept.append(asyncio.ensure_future(child()))
        await asyncio.sleep(0.05)

    engine.run_on_loop(leaves_tasks())
    assert sorted(seen) == ["child", "grandchild"]


def test_a_group_cancelled_from_below_fails_the_poll():
    """A CancelledError the stream did not ask for (its request was dropped under it) is a
    failed group that the poll reports at once, never a group that stays in flight."""

    async def dropped(job: GroupJob):
        fut = asyncio.get_running_loop().create_future()
        fut.cancel()
        await fut

    stream = EpisodeStream(dropped, version=lambda: 0, max_groups=2)
    try:
        stream.submit([GroupJob("lost", {"id": "lost"}, 1)])
        with pytest.raises(StreamError, match=r"'lost'.*CancelledError"):
            stream.poll(wait_s=30)
        assert stream.in_flight == 0
    finally:
        stream.stop(timeout=10)


def test_cancelling_a_group_is_quiet():
    """`EpisodeStream.cancel` (the driver's own cancel) is not an error."""
    started = threading.Event()

    async def forever(job: GroupJob):
        started.set()
        await asyncio.sleep(3600)

    stream = EpisodeStream(forever, version=lambda: 0, max_groups=2)
    try:
        stream.submit([GroupJob("slow", {"id": "slow"}, 1)])
        assert started.wait(10)
        assert stream.cancel(["slow"]) == 1
        assert stream.poll(wait_s=0.3) == []
        assert stream.in_flight == 0
    finally:
        stream.stop(timeout=10)
