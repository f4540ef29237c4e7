"""The checks of the GPU check. Each takes a `Context` and returns a `Section` (rows for the
report); the same code runs on CUDA at real shapes and, in the dry mode, on the CPU at tiny
ones (what only CUDA can do is swapped for a CPU stand-in there, and the report says so).

Imports of toolrl happen inside the checks: a check whose import fails is reported as
skipped with the reason, the others still run.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import math
import pickle
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

MiB = 1 << 20
GiB = 1 << 30

# Real shapes (Qwen2.5 configs) and the dry mode's tiny one. Weights are random (no hub).
SHAPES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}


@dataclass
class Context:
    device: torch.device
    dry: bool
    log: Callable[[str], None]
    scoring_shape: str = "qwen2.5-0.5b"
    ipc_shape: str = "qwen2.5-1.5b"
    ipc_pushes: int = 20
    bucket_mb: float = 256.0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


@dataclass
class Section:
    title: str
    notes: list[str] = field(default_factory=list)
    tables: list[tuple[list[str], list[list[Any]]]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(what)
        return ok


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int = 3) -> float:
    """Median seconds of ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --- a model from a config, and rollout batches ----------------------------------------------
def build_model(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """A Qwen2 causal LM of ``shape`` with random weights, built on ``device`` (sdpa)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=True,
                      use_sliding_window=False)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.to(dtype).eval()


@dataclass
class Rows:
    prompts: list[list[int]]
    responses: list[list[int]]
    masks: list[list[int]]

    @property
    def tokens(self) -> int:
        return sum(len(p) + len(r) for p, r in zip(self.prompts, self.responses, strict=True))


def make_rows(n: int, group: int, prompt_len: tuple[int, int], response_len: tuple[int, int],
              vocab: int, seed: int = 0) -> Rows:
    """Rollout rows: ``group`` consecutive rows share a prompt (a GRPO group); responses have
    loss-mask holes where tool-observation tokens sit."""
    g = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    prompts, responses, masks = [], [], []
    for i in range(n):
        if i % group == 0:
            prompt = torch.randint(3, vocab, (randint(*prompt_len),), generator=g).tolist()
        prompts.append(prompt)
        length = randint(*response_len)
        responses.append(torch.randint(3, vocab, (length,), generator=g).tolist())
        mask = [1] * length
        if length > 8:  # a tool observation in the middle
            start = randint(1, length // 2)
            for j in range(start, min(length, start + randint(1, 6))):
                mask[j] = 0
        masks.append(mask)
    return Rows(prompts, responses, masks)


def rollout_batch(rows: Rows, device: torch.device) -> Any:
    from toolrl.batch import build_rollout_batch

    return build_rollout_batch(rows.prompts, rows.responses, rows.masks,
                               pad_token_id=0).to(device)


@torch.no_grad()
def reference_log_probs(model: Any, rows: Rows, device: torch.device) -> list[torch.Tensor]:
    """transformers' log-probs of every response token, one unpadded row at a time."""
    out = []
    for p, r in zip(rows.prompts, rows.responses, strict=True):
        ids = torch.tensor(p + r, device=device)[None]
        logits = model(input_ids=ids).logits[0, len(p) - 1:len(p) - 1 + len(r)].float()
        labels = torch.tensor(r, device=device)[:, None]
        out.append(torch.log_softmax(logits, -1).gather(-1, labels)[:, 0])
    return out


def gaps(lp: torch.Tensor, reference: list[torch.Tensor]) -> tuple[float, float]:
    """Max and mean |lp - reference| over every real response token."""
    diffs = torch.cat([(lp[i, :len(ref)].float() - ref).abs() for i, ref in enumerate(reference)])
    return float(diffs.max()), float(diffs.mean())


# --- 1. scoring layouts against transformers, fp32 and bf16; their speed ----------------------
SCORING_LAYOUTS = ("padded", "packed", "shared_prefix", "auto")
FP32_TOLERANCE = 2e-3  # max |log-prob gap| in fp32 (TF32 off)
BF16_MEAN_TOLERANCE = 0.05  # mean |gap| in bf16 against transformers in bf16


def packed_variants(route: str, dtype: torch.dtype, cuda: bool) -> list[tuple[str, str]]:
    """``(label, packed_attention)`` rows of the scoring check: every layout as the trainer
    runs it (``packed`` on the route ``auto`` takes, ``route``), then ``packed`` forced onto
    the other route where it can run (varlen: CUDA in half precision, or the dry mode's
    stand-in kernel), for the comparison."""
    rows = [(f"packed ({route})" if layout == "packed" else layout, "auto")
            for layout in SCORING_LAYOUTS]
    other = "mask" if route == "varlen" else "varlen"
    if other == "mask" or not cuda or dtype in (torch.float16, torch.bfloat16):
        rows.insert(2, (f"packed ({other}, forced)", other))
    return rows


def check_scoring(ctx: Context) -> Section:
    """Every layout of `toolrl.workers.scoring` against transformers' log-probs of the same
    weights, fp32 then bf16, with the forward and forward+backward time of each; the packed
    layout on both attention routes (torch's varlen kernel, the block-diagonal mask)."""
    from unittest import mock

    from toolrl.workers import varlen
    from toolrl.workers.scoring import enable_scoring, score_responses

    sec = Section("Scoring layouts against transformers (fp32, bf16) and their speed")
    shape = "tiny" if ctx.dry else ctx.scoring_shape
    spec = SHAPES[shape]
    if ctx.dry:
        rows = make_rows(8, 4, (4, 24), (2, 20), spec["vocab_size"], seed=1)
    else:
        rows = make_rows(16, 4, (64, 512), (16, 512), spec["vocab_size"], seed=1)
    real = sum(len(r) for r in rows.responses)
    sec.notes.append(f"model: Qwen2 {shape} from its config, random weights, sdpa attention; "
                     f"batch: {len(rows.prompts)} rows in groups of 4 sharing a prompt, "
                     f"{rows.tokens} real tokens ({real} response tokens, loss-mask holes "
                     f"included); reference: transformers' forward of each row alone, unpadded.")
    td = rollout_batch(rows, ctx.device)
    header = ["dtype", "layout", "max gap", "mean gap", "fwd ms", "fwd tok/s", "fwd+bwd ms",
              "fwd+bwd tok/s", "peak GiB", "status"]
    table: list[list[Any]] = []
    old_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        model = enable_scoring(build_model(shape, ctx.device, torch.float32))
        fp32_reference = None
        for dtype in (torch.float32, torch.bfloat16):
            name = str(dtype).removeprefix("torch.")
            model.to(dtype)
            ctx.log(f"scoring: {name} reference")
            reference = reference_log_probs(model, rows, ctx.device)
            if fp32_reference is None:
                fp32_reference = reference
                shifted = Rows([p[1:] for p in rows.prompts], rows.responses, rows.masks)
                sens = gaps(torch.nn.utils.rnn.pad_sequence(
                    reference_log_probs(model, shifted, ctx.device), batch_first=True),
                    reference)
                sec.notes.append(f"sensitivity: dropping each prompt's first token moves the "
                                 f"log-probs by max {sens[0]:.3g}, mean {sens[1]:.3g} (fp32): "
                                 f"a masking error shows up far above the tolerance.")
            else:
                bf = gaps(torch.nn.utils.rnn.pad_sequence(reference, batch_first=True),
                          fp32_reference)
                sec.notes.append(f"bf16 transformers vs fp32 transformers on the same weights: "
                                 f"max {bf[0]:.3g}, mean {bf[1]:.3g} (the precision gap itself, "
                                 f"for the canary's bf16 tolerance).")
                sec.data["bf16_vs_fp32"] = bf
            route, why = varlen.packed_route(model.config, ctx.device, dtype)
            sec.notes.append(f"{name}: packed attends by {route} ({why}).")
            sec.data[f"{name}/packed_route"] = route
            if ctx.cuda and dtype == torch.bfloat16:
                sec.check(route == "varlen", f"bf16 packed on CUDA took the mask: {why}")
            for label, packed_attention in packed_variants(route, dtype, ctx.cuda):
                layout = label.split(" ")[0]
                ctx.log(f"scoring: {name} {label}")
                # the dry mode has no CUDA: torch's varlen kernel is swapped for the stand-in
                stand_in = mock.patch.object(varlen, "torch_varlen_attn",
                                             lambda: varlen.reference_varlen_attn) \
                    if packed_attention == "varlen" and not ctx.cuda else contextlib.nullcontext()

                def score(grad: bool, layout: str = layout, attention: str = packed_attention,
                          model: Any = model, stand_in: Any = stand_in) -> Any:
                    with stand_in, torch.set_grad_enabled(grad):
                        return score_responses(model, td, layout=layout, with_entropy=grad,
                                               packed_attention=attention)

                with mock.patch.object(varlen, "packed_call", wraps=varlen.packed_call) as spy:
                    lp, _ = score(False)
                top, mean = gaps(lp, reference)
                if dtype == torch.float32:
                    ok = sec.check(top <= FP32_TOLERANCE,
                                   f"fp32 {label}: max gap {top:.3g} > {FP32_TOLERANCE}")
                else:
                    ok = sec.check(mean <= BF16_MEAN_TOLERANCE,
                                   f"bf16 {label}: mean gap {mean:.3g} > {BF16_MEAN_TOLERANCE}")
                if layout == "auto":
                    sec.data[f"{name}/auto_took_varlen"] = spy.called
                    if ctx.cuda and dtype == torch.bfloat16:  # auto packs on the varlen route
                        ok = sec.check(spy.called, "bf16 auto on CUDA did not take the packed "
                                                   "layout on varlen") and ok

                def forward(score: Callable[[bool], Any] = score) -> None:
                    score(False)

                def forward_backward(score: Callable[[bool], Any] = score,
                                     model: Any = model) -> None:
                    lp, ent = score(True)
                    (lp.sum() + 0.01 * ent.sum()).backward()
                    model.zero_grad(set_to_none=True)

                if ctx.cuda:
                    torch.cuda.reset_peak_memory_stats(ctx.device)
                fwd = timed(forward, ctx.device)
                train = timed(forward_backward, ctx.device)
                peak = torch.cuda.max_memory_allocated(ctx.device) / GiB if ctx.cuda else None
                table.append([name, label, top, mean, fwd * 1e3, rows.tokens / fwd,
                              train * 1e3, rows.tokens / train, peak, "ok" if ok else "FAIL"])
                key = layout if packed_attention == "auto" else f"{layout}:{packed_attention}"
                sec.data[f"{name}/{key}"] = {"max": top, "mean": mean, "fwd_s": fwd,
                                             "train_s": train}
        model = None
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old_tf32
        free_memory(ctx.device)
    sec.tables.append((header, table))
    sec.notes.append(f"tolerances: fp32 max gap <= {FP32_TOLERANCE} (TF32 off); bf16 mean gap "
                     f"<= {BF16_MEAN_TOLERANCE} against transformers in bf16. tok/s counts "
                     f"real prompt+response tokens; times are medians of 3 after a warm-up.")
    sec.notes.append("packed (varlen): torch.nn.attention.varlen.varlen_attn, each sample "
                     "attending within itself by cumulative lengths; packed (mask): the "
                     "model's sdpa with the block-diagonal mask transformers builds from the "
                     "position ids. On CUDA in bf16/fp16 packed takes varlen, and the "
                     "`auto` layout packs (elsewhere it shares prompts where it can).")
    if ctx.dry:
        sec.notes.append("dry mode: CPU, tiny shape; the times say nothing about a GPU. The "
                         "varlen rows run a pure-torch stand-in for torch's CUDA-only kernel "
                         "(`varlen.reference_varlen_attn`): they check the route's plumbing, "
                         "not the kernel.")
    return sec


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --- 2. the IPC wire ------------------------------------------------------------------------
def checksum(t: torch.Tensor, chunk: int = 64 * MiB) -> int:
    """An exact integer digest of a tensor's bytes (position-weighted byte sum), the same on
    the producer's and the consumer's side; ``chunk`` bytes at a time, so its temporaries
    stay small beside a 467 MB embedding."""
    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, flat.numel(), chunk):
        part = flat[start:start + chunk].to(torch.int64)
        weights = torch.arange(start, start + part.numel(), device=flat.device,
                               dtype=torch.int64) % 251 + 1
        total += (part * weights).sum()
    return int(total)


def packed_module() -> Any:
    """vLLM's packed-tensor producer/consumer: the installed vLLM's, else the verbatim copy."""
    try:
        from vllm.distributed.weight_transfer import packed_tensor
    except ImportError:
        from tools.gpu_check import vllm_packed_tensor as packed_tensor
    return packed_tensor


def cpu_packed_producer(iterator: Iterator[tuple[str, torch.Tensor]], gpu_uuid: str,
                        post_iter_func: Callable[[tuple[str, torch.Tensor]], torch.Tensor],
                        buffer_size_bytes: int) -> Iterator[Any]:
    """The dry mode's stand-in for vLLM's ``packed_ipc_producer`` (same signature, same cuts,
    same error for a tensor over the buffer): a shared-memory CPU buffer whose bytes travel
    in the pickled handle, as CUDA IPC cannot run without CUDA."""
    packed = packed_module()
    buffer = torch.empty(buffer_size_bytes, dtype=torch.uint8)
    names: list[str] = []
    shapes: list[list[int]] = []
    dtypes: list[str] = []
    sizes: list[int] = []
    used = 0

    def chunk() -> Any:
        return packed.PackedIpcChunk(names=names, shapes=shapes, dtype_names=dtypes,
                                     tensor_sizes=sizes, ipc_handle={gpu_uuid: buffer[:used]})

    for name, tensor in iterator:
        flat = post_iter_func((name, tensor)).contiguous().view(-1).view(torch.uint8)
        if flat.numel() > buffer_size_bytes:
            raise ValueError(f"Tensor '{name}' has size {flat.numel()} bytes, which exceeds "
                             f"buffer_size_bytes={buffer_size_bytes}.")
        if used and used + flat.numel() > buffer_size_bytes:
            yield chunk()
            names, shapes, dtypes, sizes, used = [], [], [], [], 0
        buffer[used:used + flat.numel()].copy_(flat)
        names.append(name)
        shapes.append(list(tensor.shape))
        dtypes.append(str(tensor.dtype).removeprefix("torch."))
        sizes.append(flat.numel())
        used += flat.numel()
    if used:
        yield chunk()


def ipc_consumer(requests: Any, replies: Any, device_index: int | None) -> None:
    """The engine's side, in its own process: rebuild each bucket from its handle as vLLM's
    IPC weight-transfer engine does (one `PackedBufferImporter` for the process's life),
    clone the tensors out, and reply with their checksums and this process's memory."""
    packed = packed_module()
    importer = packed.PackedBufferImporter() if device_index is not None else None
    if device_index is not None:
        torch.cuda.set_device(device_index)
    while True:
        message = requests.get()
        if message is None:
            break
        handle = pickle.loads(base64.b64decode(message["ipc_handles_pickled"]))
        if device_index is not None:
            tensors = packed.packed_ipc_consumer(
                handle, message["names"], message["shapes"], message["dtype_names"],
                message["tensor_sizes"], device_index, importer)
            torch.cuda.synchronize(device_index)
            memory = torch.cuda.memory_allocated(device_index)
        else:
            [buffer] = handle.values()
            dtypes = [getattr(torch, d) for d in message["dtype_names"]]
            tensors = [(n, t.clone()) for n, t in packed.unpack_tensor(
                buffer, message["names"], message["shapes"], dtypes, message["tensor_sizes"])]
            memory = 0
        replies.put({"checksums": {n: checksum(t) for n, t in tensors}, "memory": memory})
        del tensors
    if importer is not None:
        importer.close()
    replies.put("closed")


class WireEngine:
    """The producer's view of the consumer process: ``start`` / ``update`` / ``finish`` as
    `toolrl.rollout.weight_transfer.IpcPush` calls them on a vLLM engine."""

    def __init__(self, device: torch.device, timeout_s: float = 120.0) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.requests, self.replies = ctx.Queue(), ctx.Queue()
        index = device.index if device.type == "cuda" else None
        if device.type == "cuda" and index is None:
            index = torch.cuda.current_device()
        self.process = ctx.Process(target=ipc_consumer, args=(self.requests, self.replies, index),
                                   daemon=True)
        self.process.start()
        self.timeout_s = timeout_s
        self.received: dict[str, int] = {}
        self.consumer_memory = 0
        self.active = False
        self.starts = self.finishes = 0

    def start(self) -> None:
        if self.active:
            raise RuntimeError("weight update already active")
        self.active, self.received = True, {}
        self.starts += 1

    def update(self, info: dict[str, Any]) -> None:
        self.requests.put(info)
        reply = self.replies.get(timeout=self.timeout_s)
        self.received.update(reply["checksums"])
        self.consumer_memory = reply["memory"]

    def finish(self) -> None:
        self.active = False
        self.finishes += 1

    def close(self) -> None:
        try:
            self.requests.put(None)
            self.replies.get(timeout=30)
        except Exception:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


def weight_layout(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """Checkpoint names and shapes of a Qwen2 ``shape`` (tied embeddings: no lm_head), from
    a model built on the meta device."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**SHAPES[shape], tie_word_embeddings=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return [(n, tuple(t.shape)) for n, t in model.state_dict().items() if n != "lm_head.weight"]


def device_used(device: torch.device) -> int:
    """Bytes in use on the whole device (every process), or 0 on CPU."""
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def check_ipc(ctx: Context) -> Section:
    """`IpcPush` with vLLM's packed IPC producer into a consumer process that rebuilds every
    bucket as vLLM's IPC engine does: checksums of every tensor, bucket counts, device memory
    over repeated pushes, and the hub-id case (a tensor larger than the bucket)."""
    from toolrl.weights.ipc import IpcPush, ipc_bucket_sizes, ipc_buffer_bytes

    sec = Section("IPC weight wire (packed CUDA IPC buffer, consumer in a second process)")
    shape = "tiny" if ctx.dry else ctx.ipc_shape
    dtype = torch.bfloat16
    layout = weight_layout(shape)
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    weights = [(n, torch.randn(s, generator=gen, device=ctx.device, dtype=torch.float32).to(dtype))
               for n, s in layout]
    sizes = [t.numel() * t.element_size() for _, t in weights]
    total, largest = sum(sizes), max(sizes)
    bucket = int(ctx.bucket_mb * MiB) if not ctx.dry else 48 * 1024  # under the embedding
    pushes = ctx.ipc_pushes if not ctx.dry else 3
    producer = packed_module().packed_ipc_producer if ctx.cuda else cpu_packed_producer
    sec.notes.append(f"weights: Qwen2 {shape} in bf16, {len(weights)} tensors, "
                     f"{total / MiB:.1f} MiB, largest {largest / MiB:.1f} MiB "
                     f"({layout[sizes.index(largest)][0]}); weight_bucket_mb "
                     f"{bucket / MiB:g}; producer: "
                     f"{'vLLM packed_ipc_producer' if ctx.cuda else 'CPU stand-in (dry mode)'}, "
                     f"from {packed_module().__name__}.")
    engine = WireEngine(ctx.device)
    header = ["case", "buffer MiB", "pushes", "buckets/push", "expected", "grown", "checksums",
              "s/push", "device used MiB (first -> last)", "status"]
    table: list[list[Any]] = []
    uuid = "cpu-stand-in" if not ctx.cuda else None
    try:
        cases = [("sized from the largest tensor (local checkpoint)",
                  ipc_buffer_bytes(bucket, largest), pushes),
                 ("hub id: buffer = weight_bucket_mb only", ipc_buffer_bytes(bucket, 0), 2)]
        for label, buffer, n in cases:
            used: list[int] = []
            seconds: list[float] = []
            counts: set[int] = set()
            grown = 0
            bad = 0
            for i in range(n):
                ctx.log(f"ipc: {label}: push {i + 1}/{n}")
                # a new policy version: perturb a few tensors so every push differs
                for _, t in weights[i % len(weights)::max(1, len(weights) // 4)]:
                    t.add_(0.5)
                expected = {name: checksum(t) for name, t in weights}
                push = IpcPush(engine.start, engine.update, engine.finish, buffer,
                               producer=producer, device_uuid=uuid)
                sync(ctx.device)
                t0 = time.perf_counter()
                push.push(iter(weights))
                seconds.append(time.perf_counter() - t0)
                bad += sum(engine.received.get(k) != v for k, v in expected.items())
                counts.add(push.buckets)
                grown = max(grown, push.grown)
                sync(ctx.device)
                used.append(device_used(ctx.device))
            plan = len(ipc_bucket_sizes(sizes, buffer))
            ok = sec.check(bad == 0, f"{label}: {bad} tensors arrived with a wrong checksum")
            ok &= sec.check(counts == {plan}, f"{label}: buckets {sorted(counts)} != {plan}")
            ok &= sec.check(engine.finishes == engine.starts, f"{label}: an update not finished")
            if n > 2 and ctx.cuda:  # after the first push everything is allocated once
                growth = used[-1] - used[1]
                ok &= sec.check(growth < buffer // 2,
                                f"{label}: device memory grew {growth / MiB:.0f} MiB over "
                                f"{n - 2} pushes (leak)")
            table.append([label, buffer / MiB, n, sorted(counts), plan, grown,
                          "all match" if bad == 0 else f"{bad} wrong",
                          statistics.median(seconds[1:] or seconds),
                          f"{used[0] / MiB:.0f} -> {used[-1] / MiB:.0f}" if ctx.cuda else "n/a",
                          "ok" if ok else "FAIL"])
        # what the hub-id case did before IpcPush grew its buffer: vLLM's producer refuses
        if largest > bucket:
            try:
                for _ in producer(iter(weights), uuid or "x", post_iter_func=lambda it: it[1],
                                  buffer_size_bytes=bucket):
                    pass
                refused = "no error"
            except ValueError as e:
                refused = f"ValueError: {str(e)[:90]}"
            sec.notes.append(f"vLLM's producer alone with a {bucket / MiB:g} MiB buffer: "
                             f"{refused} (what a hub-id model met before `IpcPush` grew its "
                             f"buffer: the update session stayed open, every later push was "
                             f"refused).")
        # a push that fails midway still finishes the session; the next push is served
        first = weights[0]

        def failing() -> Iterator[tuple[str, torch.Tensor]]:
            yield first
            raise RuntimeError("gather failed")

        with contextlib.suppress(RuntimeError):
            IpcPush(engine.start, engine.update, engine.finish, ipc_buffer_bytes(bucket, largest),
                    producer=producer, device_uuid=uuid).push(failing())
        retry = IpcPush(engine.start, engine.update, engine.finish,
                        ipc_buffer_bytes(bucket, largest), producer=producer, device_uuid=uuid)
        retry.push(iter(weights))
        ok = sec.check(not engine.active and retry.buckets > 0,
                       "a push after a failed one was refused")
        table.append(["a failed push, then a full one", ipc_buffer_bytes(bucket, largest) / MiB,
                      2, [retry.buckets], "-", retry.grown, "-", "-", "-",
                      "ok" if ok else "FAIL"])
        sec.data["consumer_memory"] = engine.consumer_memory
    finally:
        engine.close()
        weights = first = None
        free_memory(ctx.device)
    sec.tables.append((header, table))
    sec.notes.append("s/push: median wall time of a push (producer copy, handle, consumer "
                     "rebuild + clone + checksum of every tensor). "
                     "expected: `ipc_bucket_sizes` of the tensor sizes (each bucket fills to "
                     "the buffer's capacity; a tensor over it grows the buffer). Leak check: "
                     "device memory in use (both processes) after push 2 vs the last push, "
                     "under half a buffer.")
    return sec


# --- 3. memory hand-off after an update -------------------------------------------------------
def check_memory(ctx: Context) -> Section:
    """What a colocated engine could map at wake-up after an actor update: device memory in
    use after the update, after ``torch.cuda.empty_cache()``, and with the actor's parameters
    and optimizer state offloaded."""
    from toolrl.workers.scoring import enable_scoring, score_responses

    sec = Section("Memory hand-off after an update (what the engine's wake-up can map)")
    shape = "tiny" if ctx.dry else ctx.scoring_shape
    rows = (make_rows(8, 4, (4, 24), (2, 20), SHAPES[shape]["vocab_size"], seed=2) if ctx.dry
            else make_rows(16, 4, (64, 512), (64, 512), SHAPES[shape]["vocab_size"], seed=2))
    td = rollout_batch(rows, ctx.device)
    model = enable_scoring(build_model(shape, ctx.device, torch.float32)).train()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    mask = td["response_mask"].float()
    header = ["moment", "allocated GiB", "reserved GiB", "device used GiB", "device free GiB"]
    table: list[list[Any]] = []

    def row(moment: str) -> None:
        sync(ctx.device)
        if ctx.cuda:
            free, total = torch.cuda.mem_get_info(ctx.device)
            table.append([moment, torch.cuda.memory_allocated(ctx.device) / GiB,
                          torch.cuda.memory_reserved(ctx.device) / GiB,
                          (total - free) / GiB, free / GiB])
        else:
            table.append([moment, "n/a", "n/a", "n/a", "n/a"])

    try:
        for step in range(2):
            ctx.log(f"memory: update {step + 1}/2")
            lp, _ = score_responses(model, td, layout="padded")
            (-(lp * mask).sum() / mask.sum()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del lp
        row("after the update (grads freed)")
        free_memory(ctx.device)
        row("after torch.cuda.empty_cache()")
        model.to("cpu")
        for state in optimizer.state.values():
            for k, v in state.items():
                if torch.is_tensor(v) and v.device.type != "cpu":
                    state[k] = v.to("cpu")
        row("parameters + optimizer state offloaded, before empty_cache")
        free_memory(ctx.device)
        row("offloaded, after torch.cuda.empty_cache()")
    finally:
        model = optimizer = None
        free_memory(ctx.device)
    sec.tables.append((header, table))
    analytic = params * (4 + 8) / GiB  # fp32 parameters + AdamW's two fp32 moments
    sec.notes.append(f"actor: Qwen2 {shape} fp32 ({params / 1e6:.2f}M parameters), AdamW, two "
                     f"updates on {rows.tokens} tokens (padded layout); parameters + Adam "
                     f"moments = {analytic:.2f} GiB by arithmetic.")
    if ctx.cuda:
        cache = table[0][2] - table[0][1]
        returned = table[1][4] - table[0][4]
        sec.notes.append(f"the caching allocator held {cache:.2f} GiB it did not use after the "
                         f"update; empty_cache returned {returned:.2f} GiB to the device, which "
                         f"vLLM's own allocator (wake-up, KV cache) cannot take otherwise.")
        sec.data.update(cache_gib=cache, returned_gib=returned)
    else:
        sec.notes.append("dry mode: CPU, no device memory to measure; the code path ran.")
    return sec


# --- 4. LoRA under FSDP2 + PEFT in bf16 -------------------------------------------------------
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def check_lora(ctx: Context) -> Section:
    """A LoRA actor (`toolrl.workers.lora`: PEFT under FSDP2, bf16 compute, fp32 master
    weights) in a world of one: the adapter off is the base model, a fresh adapter changes
    nothing, updates move the policy and not the reference, the merged export scores as the
    actor does, and a DCP checkpoint resumes the same step."""
    import tempfile

    from toolrl.batch import ADVANTAGES, OLD_LOG_PROBS, REF_LOG_PROBS
    from toolrl.workers.actor import ActorConfig, FSDPActor
    from toolrl.workers.lora import LoraConfig

    sec = Section("LoRA under FSDP2 + PEFT (bf16 compute, fp32 master weights)")
    shape = "tiny" if ctx.dry else ctx.scoring_shape
    vocab = SHAPES[shape]["vocab_size"]
    tmp = tempfile.TemporaryDirectory(prefix="toolrl-gpu-check-lora-")
    root = Path(tmp.name)
    ctx.log(f"lora: writing a {shape} checkpoint")
    base = build_model(shape, ctx.device, torch.float32)
    base.save_pretrained(root / "base")
    base = None
    free_memory(ctx.device)
    spans = ((4, 24), (2, 20)) if ctx.dry else ((64, 384), (16, 256))

    def batch(seed: int) -> tuple[Rows, Any]:
        rows = make_rows(8, 2, *spans, vocab, seed=seed)
        td = rollout_batch(rows, torch.device("cpu"))
        g = torch.Generator().manual_seed(seed)
        mask = td["response_mask"].float()
        td[ADVANTAGES] = torch.randn(len(rows.prompts), 1, generator=g).expand_as(mask) * mask
        return rows, td

    def scored_by(path: Path, rows: Rows) -> list[torch.Tensor]:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
        hf = hf.to(device=ctx.device, dtype=torch.bfloat16).eval()
        try:
            return reference_log_probs(hf, rows, ctx.device)
        finally:
            hf = None
            free_memory(ctx.device)

    cfg = ActorConfig(model_path=str(root / "base"), param_dtype="bfloat16",
                      reduce_dtype="float32", lr=1e-3, micro_batch_size=4,
                      lora=LoraConfig(rank=16, alpha=32.0, target_modules=LORA_TARGETS))
    header = ["property", "measured", "bound", "status"]
    table: list[list[Any]] = []

    def row(what: str, value: float, bound: float, ok: bool) -> None:
        sec.check(ok, f"{what}: {value:.3g} (bound {bound:g})")
        table.append([what, value, bound, "ok" if ok else "FAIL"])

    def on(t: torch.Tensor) -> torch.Tensor:
        return t.to(ctx.device)

    try:
        rows, td = batch(3)
        base_lp = scored_by(root / "base", rows)
        ctx.log("lora: actor")
        actor = FSDPActor(cfg)
        ref0 = actor.compute_ref_log_prob(td)[REF_LOG_PROBS]
        lp0 = actor.compute_log_prob(td)[OLD_LOG_PROBS]
        top, mean = gaps(on(ref0), base_lp)
        row("adapter off vs transformers bf16 on the base: mean gap", mean,
            BF16_MEAN_TOLERANCE, mean <= BF16_MEAN_TOLERANCE)
        row("fresh adapter (B = 0) vs adapter off: max gap", float((lp0 - ref0).abs().max()),
            1e-6, float((lp0 - ref0).abs().max()) <= 1e-6)
        td[OLD_LOG_PROBS] = lp0
        ctx.log("lora: two updates")
        for _ in range(2):
            actor.update(td)
        lp1 = actor.compute_log_prob(td)[OLD_LOG_PROBS]
        ref1 = actor.compute_ref_log_prob(td)[REF_LOG_PROBS]
        moved = float((lp1 - lp0).abs().max())
        row("updates move the policy: max change", moved, 1e-3, moved > 1e-3)
        still = float((ref1 - ref0).abs().max())
        row("updates leave the reference: max change", still, 1e-6, still <= 1e-6)
        ctx.log("lora: merged export")
        actor.export_hf(root / "merged", merged=True)
        top, mean = gaps(on(lp1), scored_by(root / "merged", rows))
        row("merged export in transformers bf16 vs the actor: mean gap", mean,
            BF16_MEAN_TOLERANCE, mean <= BF16_MEAN_TOLERANCE)
        sec.data["merged_max_gap"] = top
        ctx.log("lora: DCP checkpoint and resume")
        actor.save_checkpoint(str(root / "ckpt"))
        _, td2 = batch(4)
        td2[OLD_LOG_PROBS] = actor.compute_log_prob(td2)[OLD_LOG_PROBS]
        straight = actor.update(td2)
        actor = None
        free_memory(ctx.device)
        resumed_actor = FSDPActor(cfg)
        resumed_actor.load_checkpoint(str(root / "ckpt"))
        resumed = resumed_actor.update(td2)
        resumed_actor = None
        worst = max(abs(straight[k] - resumed[k]) / max(abs(straight[k]), 1e-8)
                    for k in ("actor/pg_loss", "actor/grad_norm"))
        row("resumed step vs uninterrupted step: relative gap (pg_loss, grad_norm)", worst,
            1e-3, worst <= 1e-3)
    finally:
        actor = resumed_actor = None
        free_memory(ctx.device)
        tmp.cleanup()
    sec.tables.append((header, table))
    sec.notes.append(f"model: Qwen2 {shape} (random weights, saved and reloaded), LoRA rank 16 "
                     f"on {', '.join(LORA_TARGETS)}; one process, FSDP2 world of one; batch of "
                     f"8 rows in pairs sharing a prompt.")
    return sec


# --- 5. the tests that need only torch + transformers -----------------------------------------
GPU_BOX_TESTS = ("tests/workers/test_workers_gpu.py",  # FSDP2 actor on NCCL, bf16, spawned
                 "tests/workers/test_fsdp_device.py",  # CPU ranks stay on gloo beside a GPU
                 "tests/workers/test_scoring.py",  # device placement; 2 forked CPU ranks
                 "tests/workers/test_varlen.py")  # the packed layout on torch's varlen kernel


def check_pytest(ctx: Context, timeout_s: float = 300.0) -> Section:
    """``pytest --collect-only`` over the tree: no file may fail for want of vLLM or Ray (other
    missing packages are listed: this box has only torch and transformers); then the tests
    that need neither vLLM nor Ray, the GPU ones included."""
    import os
    import re
    import subprocess
    import sys
    from collections import Counter
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sec = Section("pytest on this machine")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    runs = [("collect the whole tree", ["--collect-only", "-q"]),
            ("tests that need neither vLLM nor Ray", ["-q", *GPU_BOX_TESTS])]
    if ctx.dry:
        runs = runs[:1]
    header = ["run", "exit", "summary"]
    table: list[list[Any]] = []
    for label, args in runs:
        ctx.log(f"pytest: {label}")
        try:
            out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
                                  *args], cwd=root, env=env, capture_output=True, text=True,
                                 timeout=timeout_s)
            text = out.stdout + out.stderr
            code: Any = out.returncode
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
                else (e.stdout or "")
            code = "timeout"
        summary = [line for line in text.splitlines() if re.search(
            r"\d+ (passed|failed|errors?|tests? collected|skipped|deselected)", line)]
        table.append([label, code, (summary[-1] if summary else text[-200:]).strip()])
        if label.startswith("collect"):
            blocks = re.split(r"_+ ERROR collecting (\S+) _+", text)
            missing: Counter[str] = Counter()
            other = []
            for path, body in zip(blocks[1::2], blocks[2::2], strict=True):
                found = re.search(r"No module named '([\w.]+)'", body)
                if found and "ModuleNotFoundError" in body:
                    missing[found.group(1)] += 1
                else:
                    other.append(path)
            stack = [m for m in missing if m.split(".")[0] in ("ray", "vllm")]
            sec.check(not stack, f"collection failed for want of {stack}: a file imports them "
                                 f"at module level without a skip")
            sec.check(not other, f"collection errors that are not a missing package: {other}")
            if missing:
                sec.notes.append("collection errors for packages this machine lacks (not vLLM "
                                 "or Ray; expected on a torch + transformers box): " + ", ".join(
                                     f"{m} ({n} files)" for m, n in missing.most_common()))
            sec.notes += [f"skipped: {s}" for s in re.findall(r"SKIPPED \[\d+\] (.*)", text)
                          if "ray" in s.lower() or "vllm" in s.lower()][:8]
        else:
            sec.check(code == 0, f"pytest {label}: exit {code}")
            failed = re.findall(r"^(?:FAILED|ERROR) (\S+.*)$", text, flags=re.M)
            sec.notes += [f"{label}: {f}" for f in failed[:10]]
            if code != 0:
                sec.notes += ["```", *text.splitlines()[-40:], "```"]
    sec.tables.append((header, table))
    return sec


CHECKS: dict[str, Callable[[Context], Section]] = {
    "scoring": check_scoring,
    "ipc": check_ipc,
    "memory": check_memory,
    "lora": check_lora,
    "pytest": check_pytest,
}


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e5):
            return f"{value:.3g}"
        return f"{value:.2f}"
    if value is None:
        return "-"
    return str(value)
