"""Bucketed weight staging for the CPU engine (pure logic and real shared-memory files; the
engine-side tests are in tests/rollout/test_engine_buckets.py)."""

from __future__ import annotations

import base64
import os
import pickle
from types import SimpleNamespace

import pytest
import torch

from toolrl.weights.ipc import IpcPush, ipc_bucket_sizes, ipc_buffer_bytes
from toolrl.weights.nccl import nccl_update_info
from toolrl.weights.staging import (
    STAGING_PREFIX,
    BucketStager,
    StagedBucket,
    bucket_plan,
    remove_stale_staging,
    staged_views,
)

GiB = 1 << 30


def _stream(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [("a", torch.randn(256, 64, generator=g)),  # 64 KiB
            ("b", torch.randn(8, generator=g).to(torch.bfloat16)),
            ("c", torch.randint(0, 9, (1000,), generator=g)),  # int64, 8000 bytes
            ("big", torch.randn(300, 100, generator=g)),  # 120,000 bytes: over the bucket
            ("d", torch.randn(10, 10, generator=g)),
            ("empty", torch.empty(0, 4))]


def _staged_files(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(STAGING_PREFIX))


def test_stager_cuts_buckets_by_size_and_round_trips_every_byte(tmp_path):
    stream = _stream()
    limit = 80_000
    stager = BucketStager(limit, tmp_path)
    buckets = []
    for name, t in stream:
        full = stager.add(name, t)
        if full is not None:
            buckets.append(full)
    buckets.append(stager.flush())
    assert [[e[0] for e in b.tensors] for b in buckets] == \
        bucket_plan([(n, t.dtype, tuple(t.shape)) for n, t in stream], limit)
    assert len(buckets) == 3  # [a, b, c], [big] (larger than a bucket), [d, empty]
    for b in buckets:
        assert b.used <= max(limit, max(e[4] for e in b.tensors))
    # what a worker maps: the file's bytes rebuild every tensor exactly (dtype, shape, bits)
    got = {}
    for b in buckets:
        msg = b.message()
        buf = torch.from_file(msg["path"], shared=False, size=msg["size"], dtype=torch.uint8)
        got.update(staged_views(buf, msg["tensors"]))
    for name, t in stream:
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        assert torch.equal(got[name], t), name
    assert len(_staged_files(tmp_path)) == 3
    for b in buckets:
        b.release()
    assert _staged_files(tmp_path) == []
    # the views the "worker" holds stay valid after the sender unlinked the files
    assert torch.equal(got["big"], stream[3][1])


def test_a_bucket_over_4_gib_travels_as_a_small_message(tmp_path):
    """msgspec refuses single payloads over 4 GiB: a bucket's bytes never enter the message.
    A sparse 4.9 GiB staging file (no memory used) is described, encoded with vLLM's own
    msgpack encoder as collective_rpc does, decoded, and mapped on the 'worker' side."""
    n = 4096 * 12288 * 2
    bucket = StagedBucket.create(tmp_path, 151936 * 4096 * 2 + 40 * n)
    try:
        # a real shape's layout: embedding (151,936 x 4,096) and 40 MLP weights, bfloat16
        bucket.record("model.embed_tokens.weight", torch.bfloat16, (151936, 4096), 0,
                      151936 * 4096 * 2)
        offset = bucket.used
        for i in range(40):
            bucket.record(f"model.layers.{i}.mlp.up_proj.weight", torch.bfloat16,
                          (12288, 4096), offset, n)
            offset += n
        assert bucket.used > 4 * GiB
        serial = pytest.importorskip("vllm.v1.serial_utils", reason="needs vLLM's msgpack codec")
        MsgpackEncoder, MsgpackDecoder = serial.MsgpackEncoder, serial.MsgpackDecoder
        frames = MsgpackEncoder().encode(bucket.message())
        assert sum(len(f) for f in frames) < 8192
        msg = MsgpackDecoder().decode(frames)
        assert msg == bucket.message()
        buf = torch.from_file(msg["path"], shared=False, size=msg["size"], dtype=torch.uint8)
        views = dict(staged_views(buf, msg["tensors"]))
        assert views["model.layers.39.mlp.up_proj.weight"].shape == (12288, 4096)
        assert float(views["model.layers.39.mlp.up_proj.weight"][-1, -1]) == 0.0  # a hole
    finally:
        bucket.release()
    assert _staged_files(tmp_path) == []


def test_bucket_plan_of_a_real_shape_stays_bounded():
    from transformers import AutoModelForCausalLM

    from toolrl.models.tiny import shape_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape_config("qwen2.5-0.5b"))
    named = [(n, p.dtype, tuple(p.shape)) for n, p in model.state_dict().items()
             if n != "lm_head.weight"]
    sizes = {n: torch.Size(s).numel() * 4 for n, _, s in named}
    plan = bucket_plan(named, 256 << 20)
    assert [n for b in plan for n in b] == [n for n, _, _ in named]  # order kept
    embed = sizes["model.embed_tokens.weight"]  # 545 MB: over the bucket, alone
    assert plan[0] == ["model.embed_tokens.weight"] and embed > 256 << 20
    assert all(sum(sizes[n] for n in b) <= 256 << 20 for b in plan[1:])
    # greedy packing: no fewer buckets than the bytes need, and two neighbours never fit in one
    rest = -(-(sum(sizes.values()) - embed) // (256 << 20))
    assert rest <= len(plan) - 1 <= 2 * rest


def test_stale_staging_files_of_dead_processes_are_removed(tmp_path):
    dead = tmp_path / f"{STAGING_PREFIX}99999999-abc"
    mine = tmp_path / f"{STAGING_PREFIX}{os.getpid()}-def"
    other = tmp_path / "unrelated"
    for p in (dead, mine, other):
        p.write_bytes(b"x")
    assert remove_stale_staging(tmp_path) == 1
    assert not dead.exists() and mine.exists() and other.exists()


def test_bucket_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="bucket size"):
        BucketStager(0, tmp_path)
    bucket = StagedBucket.create(tmp_path, 16)
    try:
        with pytest.raises(ValueError, match="cannot take"):
            bucket.add("x", torch.zeros(5))  # 20 bytes
    finally:
        bucket.release()


def test_gpu_transfer_payloads():
    assert ipc_buffer_bytes(256 << 20, 545 << 20) == 545 << 20  # the embedding must fit
    assert ipc_buffer_bytes(256 << 20, 1 << 20) == 256 << 20
    info = nccl_update_info([("w", "bfloat16", (2, 3)), ("b", "float32", (3,))])
    assert info == {"names": ["w", "b"], "dtype_names": ["bfloat16", "float32"],
                    "shapes": [[2, 3], [3]]}


def _vllm_like_producer(iterator, gpu_uuid, post_iter_func, buffer_size_bytes):
    """vLLM 0.32's ``packed_ipc_producer`` cuts and errors on the CPU, without IPC: each chunk's
    handle carries a copy of the filled part of the buffer."""
    buffer = torch.empty(buffer_size_bytes, dtype=torch.uint8)
    names, sizes, used = [], [], 0
    for name, tensor in iterator:
        flat = post_iter_func((name, tensor)).contiguous().view(-1).view(torch.uint8)
        if flat.numel() > buffer_size_bytes:
            raise ValueError(f"Tensor '{name}' has size {flat.numel()} bytes, which exceeds "
                             f"buffer_size_bytes={buffer_size_bytes}.")
        if used and used + flat.numel() > buffer_size_bytes:
            yield SimpleNamespace(names=names, dtype_names=[], shapes=[], tensor_sizes=sizes,
                                  ipc_handle={gpu_uuid: buffer[:used].clone()})
            names, sizes, used = [], [], 0
        buffer[used:used + flat.numel()].copy_(flat)
        names.append(name)
        sizes.append(flat.numel())
        used += flat.numel()
    if used:
        yield SimpleNamespace(names=names, dtype_names=[], shapes=[], tensor_sizes=sizes,
                              ipc_handle={gpu_uuid: buffer[:used].clone()})


class _Engine:
    """start / update / finish as vLLM's engine serves them: a second start while an update is
    active is refused."""

    def __init__(self, fail_at: int | None = None):
        self.active, self.fail_at, self.calls, self.buckets = False, fail_at, [], []

    def start(self):
        if self.active:
            raise RuntimeError("weight update already active")
        self.active = True
        self.calls.append("start")

    def update(self, info):
        if self.fail_at is not None and len(self.buckets) == self.fail_at:
            raise RuntimeError("the worker could not load the bucket")
        handle = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
        self.buckets.append((info["names"], handle["gpu-0"].numel()))

    def finish(self):
        self.active = False
        self.calls.append("finish")


def _push(engine, weights, buffer_bytes):
    push = IpcPush(engine.start, engine.update, engine.finish, buffer_bytes,
                   producer=_vllm_like_producer, device_uuid="gpu-0")
    push.push(iter(weights))
    return push


def test_an_ipc_push_grows_its_buffer_for_a_tensor_over_it():
    """A hub-id model: the buffer is weight_bucket_mb although the embedding is larger
    (Qwen2.5-0.5B's is 272 MB in bf16, the default bucket 256 MiB). vLLM's producer refuses;
    the push grows the buffer and carries every byte (issue 35)."""
    weights = [("embed", torch.zeros(300, dtype=torch.uint8)),
               ("a", torch.ones(40, dtype=torch.uint8)), ("b", torch.ones(40, dtype=torch.uint8)),
               ("big", torch.full((500,), 7, dtype=torch.uint8)),
               ("c", torch.ones(10, dtype=torch.uint8))]
    engine = _Engine()
    push = _push(engine, weights, 100)
    sizes = [300, 40, 40, 500, 10]
    assert [n for _, n in engine.buckets] == ipc_bucket_sizes(sizes, 100) == [300, 80, 500, 10]
    assert [names for names, _ in engine.buckets] == [["embed"], ["a", "b"], ["big"], ["c"]]
    assert push.buckets == 4 and push.grown == 2 and push.buffer_bytes == 500
    assert engine.calls == ["start", "finish"]
    assert ipc_bucket_sizes([10, 10, 10], 25) == [20, 10]
    assert ipc_bucket_sizes([], 25) == []


def test_a_failed_ipc_push_finishes_the_update_so_the_next_push_is_served():
    """Before: an error inside the push left vLLM's update session open, and every later
    push was refused ("already active"): the engine was dead."""
    weights = [(f"w{i}", torch.full((40,), i, dtype=torch.uint8)) for i in range(6)]
    engine = _Engine(fail_at=1)
    with pytest.raises(RuntimeError, match="could not load"):
        _push(engine, weights, 100)
    assert engine.calls == ["start", "finish"] and not engine.active
    engine.fail_at = None
    engine.buckets.clear()
    assert _push(engine, weights, 100).buckets == 3
