"""LoRA vs full fine-tuning: optimizer memory, update time and weight-sync time.

On the largest tiny model (``--size``, default ``large``) one process (an FSDP2 world of one,
the colocated layout the trainer uses) holds three actors, each with the quickstart's AdamW:
full fine-tuning, LoRA with ``sync=merge`` and LoRA with ``sync=adapter`` (rank ``--rank``, the
default target modules: every attention and MLP projection), and two vLLM CPU engines (one
plain, one built with LoRA support). Measured:

- optimizer memory: the bytes of the parameters the optimizer holds and of AdamW's two moments
  (after a step, when they exist), and the trainable parameter count;
- update time: one `FSDPActor.update` on the same batch (a quickstart-sized micro-batch);
- sync time: full-weights push (full fine-tuning), merged push (LoRA ``merge``: the same route
  with ``W + s·B·A`` computed while streaming) and adapter push (LoRA ``adapter``: the adapter
  written in PEFT's format and loaded by vLLM as a new LoRA version);
- after every LoRA push, the canary's check: the engine's log-probs of a probe equal the
  actor's (max |diff| reported).

Update and sync times are medians of ``--reps`` repetitions, the compared sides timed in turn.

At the real-size shape (``--size qwen2.5-0.5b``: Qwen2.5-0.5B's shape, 494M parameters, random
weights built locally like `bench_scale.py`'s) the sides cannot all be in memory at once
(full fine-tuning alone holds ~7.4 GiB of weights, gradients and AdamW state; an fp32 engine
another ~4 GiB), so they are built one after the other, each freed before the next:
full actor (update, then its optimizer state and gradients dropped) -> plain engine (full push)
-> LoRA actor (update, merged push) -> engine with LoRA support (adapter push). Times there
are medians of ``--big-reps`` repetitions (default 2) timed in sequence, not in turn; the
update runs on 8 rows of 24-token responses with gradient checkpointing and a chunked LM head.
The process's peak resident memory (``VmHWM``) of every phase is reported.

    .venv/bin/python benchmarks/bench_lora.py [--quick] [--size large qwen2.5-0.5b] [--rank 16]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from bench_scale import reset_peak, status
from benchlib import md_table, median

RESULTS = benchlib.RESULTS_DIR / "lora.md"
TINY = ("small", "medium", "large")
SHAPES = ("qwen2.5-0.5b",)  # real-size shapes (random weights), measured side after side
SIZES = (*TINY, *SHAPES)
GiB = float(1 << 30)


def model_for(size: str) -> Path:
    """The tiny model of ``size``, or the real shape built locally (cached under models/)."""
    if size in TINY:
        return benchlib.tiny_model(size)
    from toolrl.models.tiny import build_tiny_model

    return build_tiny_model(benchlib.MODELS_DIR / size, size=size)


def optimizer_bytes(actor: Any) -> tuple[int, int, int]:
    """(trainable parameters, bytes of those parameters, bytes of AdamW's state)."""
    import torch

    params = [p for g in actor.optimizer.param_groups for p in g["params"]]
    numel = sum(p.numel() for p in params)
    pbytes = sum(p.numel() * p.element_size() for p in params)
    sbytes = sum(v.numel() * v.element_size() for s in actor.optimizer.state.values()
                 for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return numel, pbytes, sbytes


def probe_diff(actor: Any, engine: Any, prompt: list[int]) -> float:
    """Max |engine - actor| log-prob over a greedy probe of 16 tokens (the canary's check)."""
    import torch

    from toolrl.batch import OLD_LOG_PROBS, build_rollout_batch
    from toolrl.rollout.engine import SamplingConfig

    out = engine.generate_sync(prompt, SamplingConfig(temperature=0.0, max_tokens=16,
                                                      ignore_eos=True), timeout=120)[0]
    batch = build_rollout_batch([prompt], [out.token_ids], [[1] * len(out.token_ids)],
                                pad_token_id=0)
    mine = actor.compute_log_prob(batch)[OLD_LOG_PROBS][0]
    return float((mine - torch.tensor(out.log_probs)).abs().max())


def workload(model: Path, n: int = 16) -> Any:
    """A rollout-layout batch of ``n`` rows: 8-token prompts shared by groups of 4, 24-token
    responses, random advantages (what the update costs, not what it learns)."""
    import torch

    from toolrl.batch import ADVANTAGES, RESPONSE_MASK, build_rollout_batch

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 4000, (8,), generator=g).tolist() for _ in range(n // 4)]
    responses = [torch.randint(3, 4000, (24,), generator=g).tolist() for _ in range(n)]
    td = build_rollout_batch([prompts[i // 4] for i in range(n)], responses,
                             [[1] * 24 for _ in range(n)], pad_token_id=0)
    td[ADVANTAGES] = torch.randn(n, 1, generator=g).expand(n, 24) * td[RESPONSE_MASK]
    return td


def measure(size: str, rank: int, reps: int) -> dict[str, Any]:
    """All sides in memory at once (the tiny models); update and pushes timed in turn."""
    from toolrl.rollout.engine import EngineConfig, VLLMEngine
    from toolrl.workers.actor import ActorConfig, FSDPActor
    from toolrl.workers.fsdp import init_distributed
    from toolrl.workers.lora import LoraConfig

    init_distributed()
    model = model_for(size)
    base = dict(model_path=str(model), lr=1e-4)
    full = FSDPActor(ActorConfig(**base))
    merge = FSDPActor(ActorConfig(**base, lora=LoraConfig(rank=rank, alpha=2.0 * rank)))
    adapter = FSDPActor(ActorConfig(**base, lora=LoraConfig(rank=rank, alpha=2.0 * rank,
                                                            sync="adapter")))
    td = workload(model)
    for actor in (full, merge, adapter):
        actor.update(td)  # AdamW's moments exist from the first step on
    update = benchlib.timed_alternating([lambda a=a: a.update(td) for a in (full, merge)], reps)
    memory = {name: optimizer_bytes(a) for name, a in (("full", full), ("lora", merge))}
    params = sum(p.numel() for p in full.model.parameters())
    engine_cfg = dict(model=str(model), max_model_len=256, kv_cache_gib=0.25,
                      multiprocessing=False, seed=0)
    plain = VLLMEngine(EngineConfig(**engine_cfg))
    with_lora = VLLMEngine(EngineConfig(**engine_cfg,
                                        max_lora_rank=adapter.config.lora.engine_rank))
    try:
        prompt = [5, 6, 7, 8, 9, 10]
        diffs: dict[str, list[float]] = {"merge": [], "adapter": []}

        def push_merge() -> None:
            merge.weights.push_local([plain.weights])

        def push_adapter() -> None:
            adapter.weights.push_local([with_lora.weights])

        sync = benchlib.timed_alternating(
            [lambda: full.weights.push_local([plain.weights]), push_merge, push_adapter], reps)
        # the canary after the last pushes of each way (the full push came before the merge)
        diffs["merge"].append(probe_diff(merge, plain, prompt))
        diffs["adapter"].append(probe_diff(adapter, with_lora, prompt))
    finally:
        plain.shutdown()
        with_lora.shutdown()
    return {"size": size, "rank": rank, "params": params, "memory": memory,
            "update_s": {"full": median(update[0]), "lora": median(update[1])},
            "sync_s": {"full": median(sync[0]), "merge": median(sync[1]),
                       "adapter": median(sync[2])},
            "probe_max_abs_diff": {k: max(v) for k, v in diffs.items()},
            "raw": {"update": update, "sync": sync}, "reps": reps, "rows": 16}


def measure_sequential(size: str, rank: int, reps: int, rows: int = 8) -> dict[str, Any]:
    """The real-size shape: each side built, measured and freed before the next (module
    docstring); the process's peak RSS per phase beside the times."""
    from toolrl.rollout.engine import EngineConfig, VLLMEngine
    from toolrl.workers.actor import ActorConfig, FSDPActor
    from toolrl.workers.fsdp import init_distributed
    from toolrl.workers.host_memory import release_memory
    from toolrl.workers.lora import LoraConfig

    init_distributed()
    model = model_for(size)
    me = os.getpid()
    base = dict(model_path=str(model), lr=1e-4, gradient_checkpointing=True,
                logits_chunk_size=128)
    engine_cfg = dict(model=str(model), max_model_len=256, kv_cache_gib=0.25,
                      multiprocessing=False, seed=0)
    td = workload(model, rows)
    prompt = [5, 6, 7, 8, 9, 10]
    peaks: dict[str, float] = {}

    def timed(fn: Any, arg: Any) -> list[float]:
        fn(arg)  # warm-up (AdamW's moments exist from the first step on)
        out = []
        for _ in range(reps):
            start = time.perf_counter()
            fn(arg)
            out.append(time.perf_counter() - start)
        return out

    def phase(name: str, *engines: Any) -> None:
        pids = [me, *(p for e in engines for p in e.engine_pids)]
        peaks[name] = sum(status(p, "VmHWM") for p in pids) / GiB
        gc.collect()
        for p in pids:
            reset_peak(p)

    reset_peak(me)
    full = FSDPActor(ActorConfig(**base))
    params = sum(p.numel() for p in full.model.parameters())
    update_full = timed(full.update, td)
    memory = {"full": optimizer_bytes(full)}
    full.optimizer.state.clear()  # only the weights are needed from here on
    full.optimizer.zero_grad(set_to_none=True)
    phase("full actor: update")
    plain = VLLMEngine(EngineConfig(**engine_cfg))
    for pid in plain.engine_pids:
        reset_peak(pid)
    try:
        sync_full = timed(full.weights.push_local, [plain])
        del full
        release_memory()  # without it the freed actor stayed resident (~2.3 GiB at 0.5B)
        phase("full actor + plain engine: full push", plain)
        lora = FSDPActor(ActorConfig(**base, lora=LoraConfig(rank=rank, alpha=2.0 * rank)))
        update_lora = timed(lora.update, td)
        memory["lora"] = optimizer_bytes(lora)
        phase("LoRA actor: update (plain engine idle)", plain)
        sync_merge = timed(lora.weights.push_local, [plain])
        diff_merge = probe_diff(lora, plain, prompt)
        phase("LoRA actor + plain engine: merged push", plain)
    finally:
        plain.shutdown()
    del plain
    release_memory()
    with_lora = VLLMEngine(EngineConfig(**engine_cfg,
                                        max_lora_rank=lora.config.lora.engine_rank))
    for pid in with_lora.engine_pids:
        reset_peak(pid)
    try:
        lora.weights.adapter_only = True  # the same adapter, now pushed as sync=adapter does
        sync_adapter = timed(lora.weights.push_local, [with_lora])
        diff_adapter = probe_diff(lora, with_lora, prompt)
        phase("LoRA actor + LoRA engine: adapter push", with_lora)
    finally:
        with_lora.shutdown()
    return {"size": size, "rank": rank, "params": params, "memory": memory,
            "update_s": {"full": median(update_full), "lora": median(update_lora)},
            "sync_s": {"full": median(sync_full), "merge": median(sync_merge),
                       "adapter": median(sync_adapter)},
            "probe_max_abs_diff": {"merge": diff_merge, "adapter": diff_adapter},
            "raw": {"update": [update_full, update_lora],
                    "sync": [sync_full, sync_merge, sync_adapter]},
            "reps": reps, "rows": rows, "peaks_gib": peaks}


def section(r: dict[str, Any]) -> tuple[str, list[str]]:
    """One size's headline and table."""
    mib = 2 ** 20
    (fn, fp, fs), (ln, lp, ls) = r["memory"]["full"], r["memory"]["lora"]
    u, s = r["update_s"], r["sync_s"]
    rows = [
        ("full fine-tuning", f"{fn / 1e6:.2f}M", fp / mib, fs / mib, (fp + fs) / mib,
         u["full"] * 1e3, "full push", s["full"] * 1e3, ""),
        (f"LoRA rank {r['rank']}, sync=merge", f"{ln / 1e6:.3f}M", lp / mib, ls / mib,
         (lp + ls) / mib, u["lora"] * 1e3, "merged push", s["merge"] * 1e3,
         f"{r['probe_max_abs_diff']['merge']:.1e}"),
        (f"LoRA rank {r['rank']}, sync=adapter", "(same)", "", "", "", "", "adapter push",
         s["adapter"] * 1e3, f"{r['probe_max_abs_diff']['adapter']:.1e}"),
    ]
    saved = (fp + fs) / max(lp + ls, 1)
    real = r["size"] in SHAPES
    name = f"the {r['size']} shape" if real else f"the {r['size']} tiny model"
    head = (f"LoRA rank {r['rank']} on {name} "
            f"({r['params'] / 1e6:.1f}M parameters): the optimizer holds "
            f"{ln / fn:.1%} of the parameters, {(lp + ls) / mib:.2f} MiB of parameters + AdamW "
            f"state vs {(fp + fs) / mib:.1f} MiB ({saved:.0f}x less); update "
            f"{u['lora'] / u['full']:.2f}x the full one; sync: merged push "
            f"{s['merge'] / s['full']:.2f}x, adapter push {s['adapter'] / s['full']:.2f}x the "
            f"full-weights push")
    if real:
        how = (f"Random weights in Qwen2.5-0.5B's exact shape (built locally, tied embeddings, "
               f"151,936-token vocabulary); the sides built one after the other and each freed "
               f"before the next, so times are medians of {r['reps']} repetitions timed in "
               f"sequence (after one warm-up each), not in turn; update: one "
               f"`FSDPActor.update` on {r['rows']} rows (24-token responses) with gradient "
               f"checkpointing and a 128-position LM-head chunk.")
    else:
        how = (f"Times are medians of {r['reps']} repetitions, the compared sides in turn; "
               f"update: one `FSDPActor.update` on {r['rows']} rows (24-token responses).")
    lines = [how, "",
             md_table(["actor", "trainable params", "optimizer params (MiB)",
                       "AdamW state (MiB)", "total (MiB)", "update (ms)", "sync", "sync (ms)",
                       "canary |diff|"], rows), ""]
    if "peaks_gib" in r:
        lines += ["Peak resident memory of the process and its engine core (sum of VmHWM, "
                  "reset between phases):", "",
                  md_table(["phase", "peak RSS (GiB)"],
                           [(k, f"{v:.2f}") for k, v in r["peaks_gib"].items()]), ""]
    return head, lines


def report(results: list[dict[str, Any]], machine: str, argv: list[str]) -> str:
    sections = [section(r) for r in results]
    out = [
        "# LoRA vs full fine-tuning: optimizer memory, update and sync time",
        "",
        f"Machine: {machine}.",
        "",
        f"Command: `{benchlib.command_line('bench_lora.py', argv)}`",
        "",
        "One process (FSDP2 world of one, fp32, AdamW); LoRA on every attention and MLP "
        "projection (alpha = 2 x rank). Sync: into a colocated vLLM CPU engine (fp32; the "
        "adapter push into one built with LoRA support). The canary column is max |engine - "
        "actor| log-prob over a 16-token greedy probe after the last push.",
        "",
    ]
    for r, (head, lines) in zip(results, sections, strict=True):
        out += [f"## {r['size']}", "", f"**{head}.**", "", *lines]
    out += [
        "The base weights stay in memory either way (frozen under LoRA); what LoRA saves is "
        "the gradients and the optimizer's moments of every base weight, which on a GPU are "
        "what limits the model size per device. The update runs the same forward and "
        "backward through the frozen base (only the weight gradients are skipped). The merged "
        "push sends as many bytes as the full one; the adapter push sends only the adapter "
        "but pays vLLM's adapter load (files in PEFT format) per version.",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the small model, 2 repetitions")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--size", nargs="+", choices=SIZES, default=["large", "qwen2.5-0.5b"],
                   help="tiny sizes and real shapes, measured one after the other")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--big-reps", type=int, default=2, help="repetitions at a real shape")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.size = min(args.reps, 2), ["small"]
    if args.dry_run:
        print(f"lora plan: {', '.join(args.size)}, rank {args.rank}, {args.reps} reps "
              f"({args.big_reps} at a real shape) -> {args.output}")
        return 0
    benchlib.set_bench_env()
    import torch
    import vllm

    machine = benchlib.machine_label(torch=torch.__version__, vllm=vllm.__version__)
    results = [measure_sequential(size, args.rank, args.big_reps) if size in SHAPES
               else measure(size, args.rank, args.reps) for size in args.size]
    benchlib.save_raw("lora", {"machine": machine, "argv": argv, "results": results})
    benchlib.write_result(args.output, report(results, machine, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
