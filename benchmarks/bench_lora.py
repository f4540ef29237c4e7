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

    .venv/bin/python benchmarks/bench_lora.py [--quick] [--size large] [--rank 16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table, median

RESULTS = benchlib.RESULTS_DIR / "lora.md"
SIZES = ("small", "medium", "large")


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
    from toolrl.rollout.engine import EngineConfig, VLLMEngine
    from toolrl.workers.actor import ActorConfig, FSDPActor
    from toolrl.workers.fsdp import init_distributed
    from toolrl.workers.lora import LoraConfig

    init_distributed()
    model = benchlib.tiny_model(size)
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
            merge.weights.push_local([plain])

        def push_adapter() -> None:
            adapter.weights.push_local([with_lora])

        sync = benchlib.timed_alternating(
            [lambda: full.weights.push_local([plain]), push_merge, push_adapter], reps)
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
            "raw": {"update": update, "sync": sync}}


def report(r: dict[str, Any], machine: str, argv: list[str], reps: int) -> str:
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
    head = (f"LoRA rank {r['rank']} on the {r['size']} tiny model "
            f"({r['params'] / 1e6:.1f}M parameters): the optimizer holds "
            f"{ln / fn:.1%} of the parameters, {(lp + ls) / mib:.2f} MiB of parameters + AdamW "
            f"state vs {(fp + fs) / mib:.1f} MiB ({saved:.0f}x less); update "
            f"{u['lora'] / u['full']:.2f}x the full one; sync: merged push "
            f"{s['merge'] / s['full']:.2f}x, adapter push {s['adapter'] / s['full']:.2f}x the "
            f"full-weights push")
    return "\n".join([
        "# LoRA vs full fine-tuning: optimizer memory, update and sync time",
        "",
        f"Machine: {machine}.",
        "",
        f"Command: `{benchlib.command_line('bench_lora.py', argv)}`",
        "",
        f"One process (FSDP2 world of one, fp32, AdamW), the {r['size']} tiny model; LoRA on "
        "every attention and MLP projection (alpha = 2 x rank). Times are medians of "
        f"{reps} repetitions, the compared sides in turn; update: one `FSDPActor.update` on "
        "16 rows (24-token responses); sync: into a colocated vLLM CPU engine (the adapter "
        "push into one built with LoRA support). The canary column is max |engine - actor| "
        "log-prob over a 16-token greedy probe after the last push.",
        "",
        md_table(["actor", "trainable params", "optimizer params (MiB)", "AdamW state (MiB)",
                  "total (MiB)", "update (ms)", "sync", "sync (ms)", "canary |diff|"], rows),
        "",
        f"**{head}.**",
        "",
        "The base weights stay in memory either way (frozen under LoRA); what LoRA saves is "
        "the gradients and the optimizer's moments of every base weight, which on a GPU are "
        "what limits the model size per device. The update runs the same forward and "
        "backward through the frozen base (only the weight gradients are skipped). The merged "
        "push sends as many bytes as the full one; the adapter push sends only the adapter "
        "but pays vLLM's adapter load (files in PEFT format) per version.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the small model, 2 repetitions")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--size", choices=SIZES, default="large")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.size = min(args.reps, 2), "small"
    if args.dry_run:
        print(f"lora plan: {args.size} model, rank {args.rank}, {args.reps} reps "
              f"-> {args.output}")
        return 0
    benchlib.set_bench_env()
    import torch
    import vllm

    machine = benchlib.machine_label(torch=torch.__version__, vllm=vllm.__version__)
    result = measure(args.size, args.rank, args.reps)
    benchlib.save_raw("lora", {"machine": machine, "argv": argv, "result": result})
    benchlib.write_result(args.output, report(result, machine, argv, args.reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
