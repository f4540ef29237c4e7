"""The engine's GPU routes around vLLM, on the CPU: a stand-in for vLLM's ``AsyncLLM`` takes
the calls, so what toolrl does around them (finish a failed update, bound a receive, empty the
cache before a wake-up, size the IPC buffer of a hub-id model) is shown without a GPU
(issue 35)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import Qwen2Config

from toolrl.core.background import BackgroundLoop
from toolrl.rollout.engine import EngineConfig, EngineError, VLLMEngine
from toolrl.weights.engine_routes import BROADCAST_TIMEOUT_S, EngineWeightRoutes
from toolrl.weights.ipc import ipc_buffer_bytes, largest_weight_numel

pytest.importorskip("vllm", reason="the routes build vLLM's weight-transfer requests")

MiB = 1 << 20


class FakeLLM:
    """vLLM's engine as far as the weight routes see it: a second start while an update is
    active is refused, as vLLM does."""

    def __init__(self, calls: list[str]):
        self.calls, self.active, self.fail_update, self.hang_update = calls, False, False, False

    def get_num_unfinished_requests(self) -> int:
        return 0

    async def init_weight_transfer_engine(self, request):
        self.calls.append("init")

    async def start_weight_update(self):
        if self.active:
            raise RuntimeError("weight update already active")
        self.active = True
        self.calls.append("start")

    async def update_weights(self, request):
        self.calls.append("update")
        if self.hang_update:
            await asyncio.sleep(3600)
        if self.fail_update:
            raise RuntimeError("NCCL receive failed")

    async def finish_weight_update(self):
        self.active = False
        self.calls.append("finish")

    async def reset_prefix_cache(self, reset_running_requests=False):
        return True

    async def update_weight_version(self, version: str):
        self.calls.append(f"label:{version}")

    async def wake_up(self, tags):
        self.calls.append(f"wake_up:{tags}")


@pytest.fixture
def engine():
    calls: list[str] = []
    eng = object.__new__(VLLMEngine)
    eng.config = EngineConfig(model="hub-org/model", backend="gpu", weight_transfer="nccl",
                              sleep_level=1)
    eng._loop = BackgroundLoop("test-engine-loop", error=EngineError).start()
    eng._llm = FakeLLM(calls)
    eng._closed = False
    eng.weight_version = 0
    eng.sleeping = 0
    eng.weights = EngineWeightRoutes(eng)
    eng.weights.init_broadcast_receiver("127.0.0.1", 29500, 1, 2)  # joins no group: a stand-in
    calls.clear()
    eng.calls = calls
    yield eng
    eng._closed = True
    eng._loop.stop()


META = [("model.embed_tokens.weight", "bfloat16", (8, 4))]


def test_a_failed_broadcast_receive_finishes_the_update_and_the_next_one_is_served(engine):
    engine._llm.fail_update = True
    with pytest.raises(RuntimeError, match="NCCL receive failed"):
        engine.weights.receive_broadcast(META)
    assert engine.calls == ["start", "update", "finish"]  # before: no finish, engine stuck
    engine._llm.fail_update = False
    assert engine.weights.receive_broadcast(META) == 1
    assert engine.calls[-1] == "label:1"  # vLLM labels the next tokens with the new version
    assert engine.weights.receive_broadcast(META, version=7) == 7 and engine.calls[-1] == "label:7"


def test_a_broadcast_receive_is_bounded(engine):
    assert BROADCAST_TIMEOUT_S == 600.0  # was None: a dead trainer hung the engine forever
    engine._llm.hang_update = True
    with pytest.raises(EngineError, match=r"did not finish within 0\.2 s"):
        engine.weights.receive_broadcast(META, timeout=0.2)


def test_the_cache_is_emptied_before_the_engine_wakes(engine, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: engine.calls.append("empty_cache"))
    engine.sleeping = 1
    engine.wake_up(["weights"])
    assert engine.calls == ["empty_cache", "wake_up:['weights']"]


def test_tensor_parallel_engines_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="tensor_parallel_size=2: toolrl runs one engine per GPU"):
        EngineConfig(model="m", backend="gpu", tensor_parallel_size=2)


def test_the_ipc_buffer_of_a_hub_id_model_holds_its_embedding():
    """Qwen2.5-0.5B named by hub id: no local safetensors to read; before, the buffer was the
    bucket (256 MiB) and vLLM's producer refused the 272 MB embedding."""
    qwen05 = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)
    largest = largest_weight_numel(qwen05)
    assert largest == 151936 * 896
    assert ipc_buffer_bytes(256 * MiB, largest * 2) == 151936 * 896 * 2 > 256 * MiB
    mlp_heavy = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=4096,
                            num_attention_heads=4)
    assert largest_weight_numel(mlp_heavy) == 4096 * 64
