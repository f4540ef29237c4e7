"""Weight sync: buckets, checksums, and the split-pool broadcast group (actor rank 0 ->
rollout workers) next to a 2-rank FSDP2 actor."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
import torch
from fsdp_harness import make_batch, run_ranks, with_policy_inputs
from safetensors.torch import load_file

from toolrl.batch import split
from toolrl.controller.network import free_port
from toolrl.weights.buckets import iter_buckets, weights_checksum
from toolrl.weights.group import WeightSyncGroup, master_store
from toolrl.workers.actor import ActorConfig, FSDPActor
from toolrl.workers.lora import LoraConfig
from toolrl.workers.weight_push import WeightSync


def test_buckets_keep_order_and_respect_the_size():
    named = [(f"w{i}", torch.zeros(256 * (i % 3 + 1))) for i in range(10)]  # 1-3 KiB each
    buckets = list(iter_buckets(named, bucket_mb=4 / 1024))  # 4 KiB
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]
    for b in buckets:
        assert sum(t.numel() * 4 for _, t in b) <= 4096 or len(b) == 1
    big = [("big", torch.zeros(4096)), ("small", torch.zeros(1))]
    assert [len(b) for b in iter_buckets(big, bucket_mb=1 / 1024)] == [1, 1]
    with pytest.raises(ValueError, match="bucket_mb"):
        list(iter_buckets(named, 0))


def test_checksum_is_order_free_and_sees_every_bit():
    a = {"x": torch.arange(6.0).reshape(2, 3), "y": torch.ones(2, dtype=torch.bfloat16)}
    assert weights_checksum(a) == weights_checksum(list(reversed(list(a.items()))))
    flipped = dict(a, x=a["x"].clone())
    flipped["x"].view(torch.int32)[0, 0] ^= 1  # one mantissa bit
    assert weights_checksum(flipped) != weights_checksum(a)
    assert weights_checksum({"x": a["x"].reshape(3, 2), "y": a["y"]}) != weights_checksum(a)
    assert weights_checksum({"z": a["x"], "y": a["y"]}) != weights_checksum(a)


def _split_pools(rank, model_dir, shards, actor_port, port_file, receivers, lora=None):
    """Ranks 0-1: a 2-rank FSDP2 actor (LoRA with ``lora``); ranks 2..: rollout workers with a
    dict 'engine'. Actor rank 0 holds the sync group's port (`WeightSync.reserve_port`) and
    hands it out through ``port_file``, as the trainer hands out its `weight_sync_endpoint`."""
    sync_world = 1 + receivers
    port_file = Path(port_file)
    if rank < 2:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(actor_port),
                          RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        actor = FSDPActor(ActorConfig(model_path=model_dir, lr=1e-3, weight_bucket_mb=0.25,
                                      lora=lora))
        if rank == 0:
            sync_port = actor.weights.reserve_port("127.0.0.1", timeout_s=60)
            port_file.with_suffix(".tmp").write_text(str(sync_port))
            port_file.with_suffix(".tmp").rename(port_file)
        actor.weights.connect("127.0.0.1", int(sync_port) if rank == 0 else 0, sync_world,
                              timeout_s=60)
        sums = []
        for _ in range(2):
            version = actor.weights.push_group()
            sums.append((version, actor.weights.checksum()))
            actor.update(shards[rank])
        return sums
    for _ in range(600):
        if port_file.exists():
            break
        time.sleep(0.1)
    group = WeightSyncGroup("127.0.0.1", int(port_file.read_text()), sync_world, rank - 1,
                            timeout_s=60)
    received = []
    for _ in range(2):
        engine: dict[str, torch.Tensor] = {}
        calls = []

        def load(weights, engine=engine, calls=calls):
            calls.append(1)
            for name, tensor in weights:
                engine[name] = tensor.clone()

        version = group.receive(load)
        received.append((version, weights_checksum(engine), len(calls), sorted(engine)))
    return received


@pytest.mark.parametrize("lora", [None, LoraConfig(rank=8, target_modules=("q_proj", "up_proj"))],
                         ids=["full", "lora-merge"])
def test_split_pool_broadcast_delivers_exactly_the_actor_weights(tiny_model_dir, lora,
                                                                 tmp_path):
    """With LoRA (sync=merge, the pipeline route) the receivers get the checkpoint's names with
    the adapter merged in: the base model at first (B = 0), the trained policy after."""
    td = with_policy_inputs(tiny_model_dir, make_batch(4, seed=9))
    shards = split(td, 2)
    out = run_ranks(_split_pools, 4, str(tiny_model_dir), shards, free_port(),
                    str(tmp_path / "sync_port"), 2, lora, init=False)
    actor0, actor1, rollout_a, rollout_b = out
    assert actor1 == [(1, None), (2, None)]  # only actor rank 0 sends / checksums
    checkpoint_names = sorted(load_file(str(tiny_model_dir / "model.safetensors")))
    for rollout in (rollout_a, rollout_b):
        for (version, checksum), (r_version, r_checksum, calls, names) in zip(
                actor0, rollout, strict=True):
            assert r_version == version and calls == 1
            assert r_checksum == checksum  # bit-identical weights, same names
            assert names == checkpoint_names  # tied lm_head.weight skipped
    assert actor0[0][1] != actor0[1][1]  # the update changed the weights that were pushed
    assert actor0[0][1] == weights_checksum(load_file(str(tiny_model_dir / "model.safetensors")))


def test_the_sync_groups_port_is_held_from_when_it_is_handed_out():
    """The gloo route's rendezvous store listens before its port is handed out: nothing else
    can bind the port in between (a port found free and bound later was taken by the actor's
    own gloo connections once: EADDRINUSE), and the group forms through the held store."""
    store = master_store("127.0.0.1", timeout_s=30)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s, pytest.raises(OSError):
        s.bind(("127.0.0.1", store.port))
    got = {}

    def receiver():
        group = WeightSyncGroup("127.0.0.1", store.port, 2, 1, timeout_s=30)
        got["tensor"] = group.broadcast(torch.zeros(3))

    thread = threading.Thread(target=receiver)
    thread.start()
    sender = WeightSyncGroup("127.0.0.1", store.port, 2, 0, timeout_s=30, store=store)
    sender.broadcast(torch.arange(3.0))
    thread.join(timeout=30)
    assert torch.equal(got["tensor"], torch.arange(3.0))


def _local_push(rank, model_dir):
    actor = FSDPActor(ActorConfig(model_path=model_dir))
    sync = WeightSync(actor.model, bucket_mb=0.1)
    engine: dict[str, torch.Tensor] = {}

    class Engine:
        def load_weights_sync(self, weights):
            for name, tensor in weights:
                engine[name] = tensor.clone()

    # every rank hosts an engine (colocated rollout); then only rank 0 does
    version = sync.push_local([Engine()])
    got = weights_checksum(engine)
    engine.clear()
    version = sync.push_local([Engine()] if rank == 0 else [])
    only0 = weights_checksum(engine)
    # two engines in rank 0's process, none in rank 1's: each gets a full pass of its own
    second: dict[str, torch.Tensor] = {}

    class Second:
        def load_weights_sync(self, weights):
            for name, tensor in weights:
                second[name] = tensor.clone()

    engine.clear()
    version = sync.push_local([Engine(), Second()] if rank == 0 else [])
    both = (weights_checksum(engine), weights_checksum(second))
    try:  # no engine anywhere: a silent no-op would hide a wiring bug
        sync.push_local([])
        raised = False
    except RuntimeError as e:
        raised = "register_local_engine" in str(e)
    return version, got, only0, both, sync.checksum(), raised


def _failing_local_push(rank, model_dir):
    actor = FSDPActor(ActorConfig(model_path=model_dir))
    sync = WeightSync(actor.model, bucket_mb=0.1)

    class Broken:
        def load_weights_sync(self, weights):
            next(iter(weights))
            raise RuntimeError("the engine died mid-push")

    start = time.monotonic()
    try:
        sync.push_local([Broken()] if rank == 0 else [])
        outcome = "pushed"
    except RuntimeError as e:
        outcome = str(e)
    return outcome, time.monotonic() - start, sync.version


def test_a_local_push_that_raises_still_runs_the_gathers_of_the_other_ranks(tiny_model_dir):
    """Rank 0's engine raises after one tensor: rank 0 still runs the remaining gathers, so
    rank 1 does not wait out the collective's timeout, and both fail the push (issue 35)."""
    (out0, _, v0), (out1, s1, v1) = run_ranks(_failing_local_push, 2, str(tiny_model_dir),
                                              timeout_s=60)
    assert out0 == "the engine died mid-push"
    assert "another actor rank failed" in out1 and s1 < 30
    assert v0 == v1 == 0


def test_local_push_streams_the_full_weights_into_every_local_engine(tiny_model_dir):
    (v0, got0, only0, both0, want, r0), (v1, got1, none1, both1, none, r1) = run_ranks(
        _local_push, 2, str(tiny_model_dir))
    assert v0 == v1 == 3 and none is None and r0 and r1
    assert got0 == got1 == only0 == both0[0] == both0[1] == want
    assert want == weights_checksum(load_file(str(tiny_model_dir / "model.safetensors")))
    assert none1 == weights_checksum({}) == both1[0] == both1[1]  # rank 1 had no engine


def test_the_nccl_route_sends_floats_in_the_engines_dtype(tiny_model_dir, monkeypatch):
    """GPU split pools: an fp32 actor broadcasts its weights in the engines' dtype (bf16),
    and the push's metadata (what vLLM's receivers allocate by) says so, tensor by tensor.
    vLLM's NCCL producer and communicator are stand-ins: what goes on the wire is recorded."""
    from types import SimpleNamespace

    pytest.importorskip("vllm", reason="the NCCL route calls vLLM's packed producer")
    from transformers import AutoModelForCausalLM
    from vllm.distributed.weight_transfer import nccl_common, packed_tensor

    wire: list[tuple[str, str, tuple[int, ...]]] = []

    def producer(iterator, group, src, post_iter_func, **kwargs):
        for item in iterator:
            tensor = post_iter_func(item)
            wire.append((item[0], str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)))

    monkeypatch.setattr(nccl_common, "trainer_init", lambda info: object())
    monkeypatch.setattr(packed_tensor, "packed_nccl_broadcast_producer", producer)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda: SimpleNamespace(synchronize=lambda: None))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert {d for _, d, _ in WeightSync(model).metadata()} == {"float32"}  # the actor's own

    sync = WeightSync(model)
    sync.connect("127.0.0.1", free_port(), 2, backend="nccl", wire_dtype="bfloat16")
    assert sync.push_group() == 1
    assert wire and wire == sync.metadata()  # the receivers cut the buckets from it
    assert {d for _, d, _ in wire} == {"bfloat16"}
