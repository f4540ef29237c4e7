"""The actor update against its floor: toolrl's update vs a bare Hugging Face step, same tokens.

Workload (the quickstart's step by default): ``--tasks`` Calculator questions x ``--group``
samples; prompts rendered by the model's chat template with the tools, responses from oracle
transcripts (the call, the tool result, the submit call; the tool result masked out of the
loss), advantages of a GRPO group; once with uniform lengths and once with a long tail (every
20th response runs on to the 192-token budget, as a tiny policy at temperature 1 does). Every
row runs in this one process with ``--threads`` torch threads, timed alternately (a, b, c, a,
b, c, ...) so load hits them alike:

- **floor**: a bare transformers step, the least any trainer does for this work: the model on
  the padded batch (only the response positions' logits kept), log-softmax, the
  policy-gradient loss (token mean; PPO at ratio 1), backward, gradient clipping, AdamW;
- **toolrl update**: `FSDPActor.update` (FSDP2 world of one, on-policy: no separate
  old-log-prob pass, PPO-clip loss, entropy metric), with prompts shared by a group run once
  (the default) and with every row run whole (``share_prompts=False``);
- the old-log-prob forward that an on-policy step skips, for reference;
- the warm start's SFT step (batch 16): the padded step it replaced and the shared-prefix step.

    .venv/bin/python benchmarks/bench_update.py [--quick] [--reps N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table, median

RESULTS = benchlib.RESULTS_DIR / "update.md"
TARGET = 1.2  # toolrl update / floor


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small batch, few repetitions")
    p.add_argument("--tasks", type=int, default=16, help="tasks per step")
    p.add_argument("--group", type=int, default=8, help="samples per task")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="torch threads (the quickstart's 2)")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.group, args.reps = 4, 4, 2
    return args


def workload(model: Path, tasks: int, group: int, long_every: int = 0,
             budget: int = 192) -> tuple[Any, list[Any]]:
    """(the rollout-layout batch, the SFT transcripts) of ``tasks`` x ``group`` episodes;
    with ``long_every`` = k, every k-th response runs on to ``budget`` tokens (a tiny policy
    at temperature 1 that does not stop: 1-10% of the quickstart's episodes end on the
    context limit)."""
    import torch
    from toolrl.envs.calculator import CalculatorEnv
    from transformers import AutoTokenizer

    from toolrl.batch import ADVANTAGES, RESPONSE_MASK, build_rollout_batch
    from toolrl.trainer.warm_start import oracle_transcripts

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = CalculatorEnv.make_tasks(tasks, seed=0, split="bench", style="plain")
    variants = [{**row, "id": f"{row['id']}-{k}"} for row in rows for k in range(group)]
    transcripts = oracle_transcripts("toolrl/Calculator-v0", variants, tokenizer,
                                     {"oracle": "random_op"})
    cut = [t.loss_mask.index(1) for t in transcripts]
    g = torch.Generator().manual_seed(0)
    responses = [t.input_ids[c:] for t, c in zip(transcripts, cut, strict=True)]
    masks = [t.loss_mask[c:] for t, c in zip(transcripts, cut, strict=True)]
    for i in range(long_every - 1, len(responses), long_every) if long_every else ():
        extra = budget - len(responses[i])
        responses[i] = responses[i] + torch.randint(10, 200, (extra,), generator=g).tolist()
        masks[i] = masks[i] + [1] * extra
    td = build_rollout_batch([t.input_ids[:c] for t, c in zip(transcripts, cut, strict=True)],
                             responses, masks, tokenizer.pad_token_id)
    adv = torch.randn(tasks, generator=g).repeat_interleave(group) * torch.randn(
        tasks * group, generator=g).sign()
    td[ADVANTAGES] = adv[:, None] * td[RESPONSE_MASK].float()
    return td, transcripts


def bare_step(model_path: Path, td: Any, lr: float) -> Any:
    """The floor: one plain transformers policy-gradient step on ``td`` (padded batch)."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolrl.batch import ADVANTAGES, ATTENTION_MASK, INPUT_IDS, POSITION_IDS, RESPONSE_MASK

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    r = td[RESPONSE_MASK].shape[1]
    labels = td["responses"]
    mask = td[RESPONSE_MASK].float()
    keep = torch.arange(td[INPUT_IDS].shape[1] - r - 1, td[INPUT_IDS].shape[1] - 1)

    def step() -> None:
        logits = model(input_ids=td[INPUT_IDS], attention_mask=td[ATTENTION_MASK],
                       position_ids=td[POSITION_IDS], logits_to_keep=keep).logits
        logp = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None])[..., 0]
        loss = -(td[ADVANTAGES] * logp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def sft_steps(model_path: Path, transcripts: list[Any], lr: float) -> tuple[Any, Any]:
    """(padded SFT step as the warm start ran it before, shared-prefix SFT step now)."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolrl.batch import RESPONSE_MASK
    from toolrl.trainer.warm_start import shared_prefix_batch
    from toolrl.workers.scoring import enable_scoring, score_responses

    batch = transcripts[:: max(1, len(transcripts) // 16)][:16]
    width = max(len(t.input_ids) for t in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    attn = torch.zeros_like(ids)
    for i, t in enumerate(batch):
        n = len(t.input_ids)
        ids[i, :n] = torch.tensor(t.input_ids)
        attn[i, :n] = 1
        labels[i, :n] = torch.where(torch.tensor(t.loss_mask) == 1, ids[i, :n], -100)
    shared = shared_prefix_batch(batch, pad_token_id=0)
    mask = shared[RESPONSE_MASK].float()

    def make(padded: bool) -> Any:
        model = enable_scoring(AutoModelForCausalLM.from_pretrained(model_path).train())
        opt = torch.optim.AdamW(model.parameters(), lr=lr)

        def step() -> None:
            if padded:
                loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
            else:
                lp, _ = score_responses(model, shared)
                loss = -(lp * mask).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        return step

    return make(True), make(False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print(f"{args.tasks} tasks x {args.group} samples, {args.reps} repetitions, "
              f"{args.threads} threads -> {args.output}")
        return 0
    benchlib.set_bench_env()
    import torch

    torch.set_num_threads(args.threads)
    import transformers

    from toolrl.batch import ATTENTION_MASK, RESPONSE_MASK, batch_len
    from toolrl.workers.actor import ActorConfig, FSDPActor

    model = benchlib.tiny_model("small")
    lr = 3e-4
    shared = FSDPActor(ActorConfig(model_path=str(model), lr=lr))
    whole = FSDPActor(ActorConfig(model_path=str(model), lr=lr, share_prompts=False))
    loads = {"uniform": workload(model, args.tasks, args.group),
             "long tail": workload(model, args.tasks, args.group, long_every=20)}
    phases: list[dict[str, Any]] = []  # rows alternate within a phase (one memory footprint)
    for name, (td, _) in loads.items():
        phases.append({
            f"{name}: floor, bare transformers step": bare_step(model, td, lr),
            f"{name}: toolrl update (default: shared prompts)": lambda td=td: shared.update(td),
            f"{name}: toolrl update, every row whole": lambda td=td: whole.update(td)})
    td, transcripts = loads["uniform"]
    phases[0]["uniform: old-log-prob forward (skipped on-policy)"] = \
        lambda: shared.compute_log_prob(td)
    sft_padded, sft_shared = sft_steps(model, transcripts, 3e-3)
    phases.append({"SFT step, padded (the warm start before)": sft_padded,
                   "SFT step, common prefix once (the warm start now)": sft_shared})
    times: dict[str, list[float]] = {}
    for rows in phases:
        times.update(zip(rows, benchlib.timed_alternating(list(rows.values()), reps=args.reps),
                         strict=True))
    med = {name: median(t) for name, t in times.items()}

    def ratio(name: str) -> float:
        ref = "SFT step, padded (the warm start before)" if name.startswith("SFT") else \
            f"{name.split(':')[0]}: floor, bare transformers step"
        return med[name] / med[ref]

    table = [[name, f"{t * 1000:.0f}", f"{ratio(name):.2f}"] for name, t in med.items()]
    main = {w: ratio(f"{w}: toolrl update (default: shared prompts)") for w in loads}
    whole_r = {w: ratio(f"{w}: toolrl update, every row whole") for w in loads}
    ok = "met" if max(main.values()) <= TARGET else "NOT met"
    n = batch_len(td)
    width = td[RESPONSE_MASK].shape[1]
    tokens = int(td[ATTENTION_MASK].sum())
    prompt_tokens = int(td[ATTENTION_MASK][:, :-width].sum())
    headline = (f"**toolrl actor update / bare transformers step on the same tokens = "
                f"{main['uniform']:.2f}x (uniform lengths), {main['long tail']:.2f}x (5% of "
                f"responses run to the budget)** (target <= {TARGET}x: {ok}); with every row "
                f"run whole {whole_r['uniform']:.2f}x / {whole_r['long tail']:.2f}x; the warm "
                f"start's SFT step "
                f"{ratio('SFT step, common prefix once (the warm start now)'):.2f}x of the "
                f"padded one.")
    text = "\n".join([
        "# Actor update vs a bare transformers step", "",
        f"Machine: {benchlib.machine_label(torch=torch.__version__, transformers=transformers.__version__)}; "  # noqa: E501
        f"torch threads: {args.threads}.", "",
        headline, "",
        md_table(["row", "ms (median)", "ratio"], table), "",
        f"Work: {n} samples ({args.tasks} Calculator tasks x {args.group}); uniform: {tokens} "
        f"real tokens, of which {prompt_tokens} are prompt tokens (~{prompt_tokens // n} per "
        f"prompt, each prompt shared by {args.group} samples), responses of at most {width}; "
        f"long tail: the same with every 20th response run on to 192 tokens. Tiny model "
        f"(small). Medians of {args.reps} repetitions after one warm-up, the rows of one "
        f"workload alternating (then the next workload, then the SFT rows). Update "
        f"ratios are against the floor on the same workload (which pads every row to the "
        f"batch's longest); SFT ratios against the padded SFT step.",
        "",
        "Reproduce: `" + benchlib.command_line(
            "bench_update.py", sys.argv[1:] if argv is None else argv) + "`",
    ])
    benchlib.write_result(args.output, text)
    benchlib.save_raw("update", {"medians": med, "times": times})
    return 0


if __name__ == "__main__":
    sys.exit(main())
