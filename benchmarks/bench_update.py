"""The actor update against its floor: toolrl's update vs a bare Hugging Face step, same tokens.

Two workloads (``--workload``):

- ``calculator`` (the default; the quickstart's step): ``--tasks`` Calculator questions x
  ``--group`` samples on the tiny model (small), responses from the oracle's transcripts (the
  call, the tool result, the submit call; the tool result masked out of the loss);
- ``real_fc``: SmolLM2-135M-Instruct (``--model``, models/smollm2-135m-instruct) on real
  function-calling rows (``--rows``, data/real_fc/nestful_train.jsonl, env
  toolrl/FunctionCalling-v0): the first ``--tasks`` rows whose prompt fits configs/real_fc.yaml's
  prompt budget and whose gold call fits its turn, x ``--group`` samples (default 4 x 4, the
  size this was first measured at; the recipe now trains 8 x 8), responses the env oracle's
  gold calls; the actor as configs/real_fc.yaml sets it up (dtype, micro-batches of 4, lr,
  clipping, loss), and the floor in the same micro-batches.

Prompts are rendered by the model's own chat template with the tools, advantages are those of a
GRPO group; each workload runs once with uniform lengths and once with a long tail (every 20th
response, at least one, runs on to the response budget: 192 tokens for calculator,
``rollout.max_tokens_per_turn`` for real_fc, as a policy at temperature 1 that does not stop).
Every row runs in this one process with ``--threads`` torch threads, timed alternately (a, b,
c, a, b, c, ...) so load hits them alike:

- **floor**: a bare transformers step, the least any trainer does for this work: the model on
  the padded batch (each micro-batch cropped to its own longest prompt and response; only the
  response positions' logits kept), log-softmax, the policy-gradient loss (token mean over the
  batch; PPO at ratio 1), backward, gradient clipping, AdamW;
- **toolrl update**: `FSDPActor.update` (FSDP2 world of one, on-policy: no separate
  old-log-prob pass, PPO-clip loss, entropy metric), with prompts shared by a group run once
  (the default) and with every row run whole (``share_prompts=False``);
- the old-log-prob forward that an on-policy step skips, for reference;
- the warm start's SFT step (calculator: batch 16; real_fc: the config's warm-start batch of
  distinct rows): the padded step it replaced and the shared-prefix step.

    .venv/bin/python benchmarks/bench_update.py [--quick] [--reps N]
    .venv/bin/python benchmarks/bench_update.py --workload real_fc [--dry-run]
        [--model models/smollm2-135m-instruct] [--rows data/real_fc/nestful_train.jsonl]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import ROOT, md_table, median

RESULTS = benchlib.RESULTS_DIR / "update.md"
REAL_FC_RESULTS = benchlib.RESULTS_DIR / "update_real_fc.md"
REAL_FC_CONFIG = ROOT / "configs" / "real_fc.yaml"
REAL_FC_MODEL = benchlib.MODELS_DIR / "smollm2-135m-instruct"
# real_fc work per step when --tasks / --group are not given (the size first measured)
REAL_FC = {"tasks": 4, "group": 4}
REAL_FC_ROWS = ROOT / "data" / "real_fc" / "nestful_train.jsonl"
CALCULATOR = {"tasks": 16, "group": 8, "budget": 192, "lr": 3e-4, "sft_batch": 16,
              "sft_lr": 3e-3}
LONG_EVERY = 20  # every k-th response of the long-tail batch runs on to the budget
TARGET = 1.2  # toolrl update / floor


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=["calculator", "real_fc"], default="calculator",
                   help="calculator: the tiny model on Calculator transcripts; real_fc: SmolLM2 "
                        "on function-calling rows with configs/real_fc.yaml's actor")
    p.add_argument("--model", type=Path,
                   help="the checkpoint (default: calculator the tiny model (small), built when "
                        "missing; real_fc models/smollm2-135m-instruct, from make real-fc-data)")
    p.add_argument("--rows", type=Path, default=REAL_FC_ROWS,
                   help="real_fc: FunctionCalling rows (JSONL); the first ones that fit the "
                        "config's budgets are used, in file order")
    p.add_argument("--quick", action="store_true", help="a small batch, few repetitions")
    p.add_argument("--tasks", type=int,
                   help="tasks (rows) per step (calculator 16, real_fc 4)")
    p.add_argument("--group", type=int,
                   help="samples per task (calculator 8, real_fc 4)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="torch threads (the quickstart's 2)")
    p.add_argument("--output", type=Path,
                   help=f"the report (default {RESULTS.relative_to(ROOT)}, real_fc "
                        f"{REAL_FC_RESULTS.relative_to(ROOT)})")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.group, args.reps = 4, 4, 2
    if args.output is None:
        args.output = REAL_FC_RESULTS if args.workload == "real_fc" else RESULTS
    return args


# --- the workloads -----------------------------------------------------------------------------
@dataclasses.dataclass
class Work:
    """What one run measures: the model, the episodes' transcripts, the actor's settings."""

    workload: str
    model: Path
    tasks: int
    group: int
    budget: int  # the long tail's response length
    actor: Any  # toolrl.workers.actor.ActorConfig (share_prompts on)
    sft_batch: int
    sft_lr: float
    transcripts: list[Any] = dataclasses.field(default_factory=list)  # tasks x group, in order
    rows: dict[str, Any] = dataclasses.field(default_factory=dict)  # real_fc: the rows chosen


def real_fc_config() -> Any:
    from toolrl.trainer.config import load_config

    return load_config(REAL_FC_CONFIG)


def real_fc_actor(cfg: Any, model: Path) -> Any:
    """The actor config a real_fc run's trainer builds (`Trainer.start_workers`)."""
    from toolrl.trainer.config import optimizer_steps

    return dataclasses.replace(cfg.actor, model_path=str(model),
                               total_steps=optimizer_steps(cfg, cfg.actor), seed=cfg.seed,
                               temperature=cfg.rollout.temperature,
                               max_response_length=cfg.rollout.max_total_tokens)


def model_path(args: argparse.Namespace) -> Path:
    if args.model is not None:
        return args.model
    return REAL_FC_MODEL if args.workload == "real_fc" else benchlib.MODELS_DIR / "tiny"


def missing(args: argparse.Namespace) -> str | None:
    """One line naming what a run lacks (model, rows), or None."""
    problems = []
    model = model_path(args)
    default = args.model is None or model.resolve() == REAL_FC_MODEL.resolve()
    if (args.workload == "real_fc" or args.model is not None) and \
            not (model / "config.json").exists():
        problems.append(f"--model {model}: no checkpoint there (no config.json); make "
                        "real-fc-data fetches " + ("it" if default else
                                                   f"the default, {_rel(REAL_FC_MODEL)}"))
    if args.workload == "real_fc" and not args.rows.exists():
        problems.append(f"--rows {args.rows}: missing (make real-fc-data writes data/real_fc/)")
    return "bench_update: " + "; ".join(problems) if problems else None


def calculator_work(args: argparse.Namespace) -> Work:
    from toolrl.envs.calculator import CalculatorEnv
    from transformers import AutoTokenizer

    from toolrl.trainer.warm_start import oracle_transcripts
    from toolrl.workers.actor import ActorConfig

    model = args.model if args.model is not None else benchlib.tiny_model("small")
    tasks, group = args.tasks or CALCULATOR["tasks"], args.group or CALCULATOR["group"]
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = CalculatorEnv.make_tasks(tasks, seed=0, split="bench", style="plain")
    variants = [{**row, "id": f"{row['id']}-{k}"} for row in rows for k in range(group)]
    transcripts = oracle_transcripts("toolrl/Calculator-v0", variants, tokenizer,
                                     {"oracle": "random_op"})
    return Work("calculator", model, tasks, group, CALCULATOR["budget"],
                ActorConfig(model_path=str(model), lr=CALCULATOR["lr"]),
                CALCULATOR["sft_batch"], CALCULATOR["sft_lr"], transcripts)


def real_fc_work(args: argparse.Namespace, cfg: Any | None = None) -> Work:
    """The first ``--tasks`` rows of ``--rows`` whose first prompt (the env's messages and
    tools through the model's chat template, as the rollout renders it) fits the config's
    prompt budget and whose oracle action (the gold calls + eos) fits one turn
    (``rollout.max_tokens_per_turn``), in file order; each played ``--group`` times by the env's
    oracle (`oracle_transcripts`)."""
    from transformers import AutoTokenizer

    from toolrl.core.registration import row_env
    from toolrl.data import load_rows
    from toolrl.trainer.warm_start import oracle_transcripts

    cfg = cfg or real_fc_config()
    model = model_path(args)
    tasks = args.tasks or REAL_FC["tasks"]
    group = args.group or REAL_FC["group"]
    if cfg.rollout.chat_template_kwargs:
        raise SystemExit(f"{REAL_FC_CONFIG.relative_to(ROOT)} sets rollout.chat_template_kwargs; "
                         "the oracle transcripts render without them")
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt_limit, turn = cfg.rollout.max_prompt_len, cfg.rollout.max_tokens_per_turn
    kept: list[dict[str, Any]] = []
    skipped = {"prompt": 0, "call": 0}
    env: tuple[str, dict[str, Any]] | None = None
    all_rows = load_rows(args.rows)
    for start in range(0, len(all_rows), 4 * tasks):
        chunk = all_rows[start:start + 4 * tasks]
        for row in chunk:
            this = row_env(row, cfg.env.id, cfg.env.kwargs)
            if this[0] != "toolrl/FunctionCalling-v0" or (env is not None and this != env):
                raise SystemExit(f"{args.rows}: row {row.get('id')!r} runs in {this}, not in "
                                 f"{env or 'toolrl/FunctionCalling-v0'}")
            env = this
        once = oracle_transcripts(env[0], chunk, tokenizer, env[1], max_len=10**9,
                                  max_turns=cfg.rollout.max_turns)
        for row, t in zip(chunk, once, strict=True):
            if len(kept) == tasks:
                break
            cut = t.loss_mask.index(1)
            if cut > prompt_limit:
                skipped["prompt"] += 1
            elif len(t.input_ids) - cut > turn:
                skipped["call"] += 1
            else:
                kept.append(row)
        if len(kept) == tasks:
            break
    if len(kept) < tasks or env is None:
        raise SystemExit(f"{args.rows}: {len(kept)} rows fit the {prompt_limit}-token prompt "
                         f"and the {turn}-token turn; --tasks asks for {tasks}")
    variants = [{**row, "id": f"{row.get('id')}-{k}"} for row in kept for k in range(group)]
    transcripts = oracle_transcripts(env[0], variants, tokenizer, env[1], max_len=10**9,
                                     max_turns=cfg.rollout.max_turns)
    prompts = [t.loss_mask.index(1) for t in transcripts[::group]]
    return Work("real_fc", model, tasks, group, turn, real_fc_actor(cfg, model),
                cfg.warm_start.batch_size, cfg.warm_start.lr, transcripts,
                {"file": _rel(args.rows), "ids": [r.get("id") for r in kept],
                 "skipped_prompt": skipped["prompt"], "skipped_call": skipped["call"],
                 "prompt_budget": prompt_limit, "prompt_tokens_min": min(prompts),
                 "prompt_tokens_max": max(prompts),
                 "categories": sorted({str(r.get("category", "?")) for r in kept})})


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def long_rows(n: int, every: int) -> list[int]:
    """The long-tail rows: every ``every``-th one, at least one (none with ``every`` = 0)."""
    if not every or not n:
        return []
    return list(range(every - 1, n, every)) or [n - 1]


def rollout_batch(work: Work, pad_token_id: int, long_every: int = 0) -> Any:
    """The rollout-layout batch of ``work``'s transcripts: the prompt up to the first loss
    token, the rest the response; with ``long_every`` = k, every k-th response (at least one)
    runs on to ``work.budget`` tokens (a policy at temperature 1 that does not stop: 1-10% of
    the quickstart's episodes end on the context limit); GRPO-like advantages per group."""
    import torch

    from toolrl.batch import ADVANTAGES, RESPONSE_MASK, build_rollout_batch

    transcripts = work.transcripts
    cut = [t.loss_mask.index(1) for t in transcripts]
    g = torch.Generator().manual_seed(0)
    responses = [t.input_ids[c:] for t, c in zip(transcripts, cut, strict=True)]
    masks = [t.loss_mask[c:] for t, c in zip(transcripts, cut, strict=True)]
    for i in long_rows(len(responses), long_every):
        extra = work.budget - len(responses[i])
        if extra > 0:
            responses[i] = responses[i] + torch.randint(10, 200, (extra,),
                                                        generator=g).tolist()
            masks[i] = masks[i] + [1] * extra
    td = build_rollout_batch([t.input_ids[:c] for t, c in zip(transcripts, cut, strict=True)],
                             responses, masks, pad_token_id)
    adv = torch.randn(work.tasks, generator=g).repeat_interleave(work.group) * torch.randn(
        work.tasks * work.group, generator=g).sign()
    td[ADVANTAGES] = adv[:, None] * td[RESPONSE_MASK].float()
    return td


# --- the floor and the SFT steps ---------------------------------------------------------------
def floor_micro_batches(td: Any, size: int | None) -> list[dict[str, Any]]:
    """``td`` cut into micro-batches of ``size`` rows (None: one), each cropped to its own
    longest prompt and response (what a plain collator pads a micro-batch to): the model's
    inputs, the positions whose logits predict the response tokens, labels, mask, advantages."""
    import torch

    from toolrl import batch as B

    n, p = B.batch_len(td), td[B.PROMPTS].shape[1]
    out = []
    for first in range(0, n, size or n):
        rows = slice(first, first + (size or n))
        attn = td[B.ATTENTION_MASK][rows]
        lo = int(attn[:, :p].any(0).nonzero()[0, 0])
        hi = p + int(attn[:, p:].any(0).nonzero()[-1, 0]) + 1
        r = hi - p
        out.append({"input_ids": td[B.INPUT_IDS][rows, lo:hi], "attention_mask": attn[:, lo:hi],
                    "position_ids": td[B.POSITION_IDS][rows, lo:hi],
                    "keep": torch.arange(p - lo - 1, hi - lo - 1),
                    "labels": td[B.RESPONSES][rows, :r],
                    "mask": td[B.RESPONSE_MASK][rows, :r].float(),
                    "advantages": td[B.ADVANTAGES][rows, :r]})
    return out


def floor_backward(model: Any, micros: list[dict[str, Any]]) -> float:
    """Forward and backward of the policy-gradient loss (token mean over all micro-batches),
    gradients accumulated; returns the loss."""
    import torch

    tokens = sum(m["mask"].sum() for m in micros)
    total = 0.0
    for m in micros:
        logits = model(input_ids=m["input_ids"], attention_mask=m["attention_mask"],
                       position_ids=m["position_ids"], logits_to_keep=m["keep"]).logits
        logp = torch.log_softmax(logits.float(), -1).gather(-1, m["labels"][..., None])[..., 0]
        loss = -(m["advantages"] * logp * m["mask"]).sum() / tokens
        loss.backward()
        total += float(loss.detach())
    return total


def bare_step(model_path: Path, td: Any, actor: Any) -> Any:
    """The floor: one plain transformers policy-gradient step on ``td`` in the actor's
    micro-batches, dtype, AdamW settings and gradient clipping."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolrl.workers.fsdp import torch_dtype

    model = AutoModelForCausalLM.from_pretrained(model_path,
                                                 dtype=torch_dtype(actor.dtype)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=actor.lr, betas=tuple(actor.betas),
                            eps=actor.eps, weight_decay=actor.weight_decay)
    micros = floor_micro_batches(td, actor.micro_batch_size)
    clip = actor.grad_clip or float("inf")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        floor_backward(model, micros)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()

    return step


def sft_steps(model_path: Path, batch: list[Any], lr: float) -> tuple[Any, Any]:
    """(padded SFT step as the warm start ran it before, shared-prefix SFT step now) on
    ``batch``'s transcripts."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolrl.batch import RESPONSE_MASK
    from toolrl.trainer.warm_start import shared_prefix_batch
    from toolrl.workers.scoring import enable_scoring, score_responses

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
        model = enable_scoring(AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32).train())  # the warm start's dtype
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


def sft_batch(work: Work) -> list[Any]:
    """The SFT step's transcripts: calculator every k-th of the step's, 16 in all; real_fc one
    per row (a group's are the same gold calls), the warm start's batch size."""
    if work.workload == "real_fc":
        return work.transcripts[::work.group][:work.sft_batch]
    ts = work.transcripts
    return ts[:: max(1, len(ts) // work.sft_batch)][:work.sft_batch]


# --- the plan and the report -------------------------------------------------------------------
def describe(args: argparse.Namespace) -> str:
    """The dry run's plan."""
    model = model_path(args)
    if args.workload == "calculator":
        return (f"calculator: {args.tasks or CALCULATOR['tasks']} tasks x "
                f"{args.group or CALCULATOR['group']} samples, model "
                f"{model if args.model else 'the tiny model (small), ' + _rel(model)}, "
                f"{args.reps} repetitions, {args.threads} threads -> {_rel(args.output)}")
    cfg = real_fc_config()
    a = real_fc_actor(cfg, model)
    return "\n".join([
        "bench_update plan, real_fc (dry run: nothing loaded or timed)",
        f"  model: {_rel(model)}",
        f"  rows: {_rel(args.rows)} (env toolrl/FunctionCalling-v0; the first that fit the "
        f"{cfg.rollout.max_prompt_len}-token prompt and the {cfg.rollout.max_tokens_per_turn}"
        "-token turn), oracle transcripts (the gold calls) with the model's chat template",
        f"  work: {args.tasks or REAL_FC['tasks']} rows x "
        f"{args.group or REAL_FC['group']} samples; long tail: every {LONG_EVERY}th "
        f"response (at least one) run on to {cfg.rollout.max_tokens_per_turn} tokens",
        f"  actor ({REAL_FC_CONFIG.relative_to(ROOT)}): dtype {a.dtype}, micro_batch_size "
        f"{a.micro_batch_size}, lr {a.lr:g} ({a.lr_schedule}), grad_clip {a.grad_clip}, "
        f"ppo_epochs {a.ppo_epochs}, loss {a.loss.policy_loss} {a.loss.loss_agg_mode}, "
        f"share_prompts True and False; the floor: the same micro-batches, dtype and AdamW",
        f"  SFT step: {cfg.warm_start.batch_size} rows, lr {cfg.warm_start.lr:g}",
        f"  {args.reps} repetitions, {args.threads} threads -> {_rel(args.output)}",
    ])


def work_lines(work: Work, args: argparse.Namespace, n: int, tokens: int, prompt_tokens: int,
               width: int, long_n: int) -> tuple[str, str]:
    """(the model-and-workload line, the work paragraph) of the report."""
    a = work.actor
    common = (f"{n} samples; uniform: {tokens} real tokens, of which {prompt_tokens} are prompt "
              f"tokens (~{prompt_tokens // n} per prompt, each prompt shared by {work.group} "
              f"samples), responses of at most {width}; long tail: the same with {long_n} of "
              f"the {n} responses (every {LONG_EVERY}th, at least one) run on to {work.budget} "
              "tokens.")
    timing = (f"Medians of {args.reps} repetitions after one warm-up, the rows of one workload "
              "alternating (then the next workload, then the SFT rows). Update ratios are "
              "against the floor on the same workload; SFT ratios against the padded SFT step.")
    if work.workload == "calculator":
        head = (f"Model: `{_rel(work.model)}`"
                + (" (the tiny model, small)" if args.model is None else "")
                + "; workload: calculator (Calculator oracle transcripts).")
        return head, (
            f"Work: {work.tasks} Calculator tasks x {work.group} = {common} Actor: "
            f"`ActorConfig` defaults (dtype {a.dtype}, the whole batch as one micro-batch), lr "
            f"{a.lr:g}; the floor pads every row to the batch's longest. SFT step: "
            f"{work.sft_batch} transcripts, lr {work.sft_lr:g}. {timing}")
    r = work.rows
    head = (f"Model: `{_rel(work.model)}`; workload: real_fc (function-calling rows of "
            f"`{r['file']}`, env toolrl/FunctionCalling-v0, oracle transcripts: the gold calls "
            "rendered by the model's own chat template).")
    return head, (
        f"Work: {work.tasks} rows x {work.group} = {common} Rows: the first {work.tasks} of the "
        f"file whose prompt fits the {r['prompt_budget']}-token prompt budget and whose gold "
        f"call fits the {work.budget}-token turn ({r['skipped_prompt']} longer prompts and "
        f"{r['skipped_call']} longer calls skipped before them); prompts "
        f"{r['prompt_tokens_min']}..{r['prompt_tokens_max']} tokens; categories "
        f"{', '.join(r['categories'])}. Actor as configs/real_fc.yaml gives it: dtype "
        f"{a.dtype}, micro-batches of {a.micro_batch_size}, lr {a.lr:g} ({a.lr_schedule}), "
        f"grad clip {a.grad_clip}, {a.loss.policy_loss} {a.loss.loss_agg_mode}; the floor takes "
        "the same micro-batches (each cropped to its own longest prompt and response, gradients "
        f"accumulated), dtype and AdamW settings. SFT step: {work.sft_batch} rows (the warm "
        f"start's batch), lr {work.sft_lr:g}. {timing}")


def summarize(work: Work, args: argparse.Namespace, argv: list[str], med: dict[str, float],
              td: Any, machine: str) -> str:
    """The markdown report: the model and workload, the medians (seconds) and their ratios."""
    from toolrl.batch import ATTENTION_MASK, RESPONSE_MASK, batch_len

    def ratio(name: str) -> float:
        ref = "SFT step, padded (the warm start before)" if name.startswith("SFT") else \
            f"{name.split(':')[0]}: floor, bare transformers step"
        return med[name] / med[ref]

    loads = ("uniform", "long tail")
    n = batch_len(td)
    long_n = len(long_rows(n, LONG_EVERY))
    table = [[name, f"{t * 1000:.0f}", f"{ratio(name):.2f}"] for name, t in med.items()]
    main_r = {w: ratio(f"{w}: toolrl update (default: shared prompts)") for w in loads}
    whole_r = {w: ratio(f"{w}: toolrl update, every row whole") for w in loads}
    ok = "met" if max(main_r.values()) <= TARGET else "NOT met"
    width = td[RESPONSE_MASK].shape[1]
    tokens = int(td[ATTENTION_MASK].sum())
    prompt_tokens = int(td[ATTENTION_MASK][:, :-width].sum())
    what = "" if work.workload == "calculator" else \
        f"{work.model.name}, function-calling rows: "
    headline = (f"**{what}toolrl actor update / bare transformers step on the same tokens = "
                f"{main_r['uniform']:.2f}x (uniform lengths), {main_r['long tail']:.2f}x "
                f"({long_n / n:.0%} of responses run to the budget)** (target <= {TARGET}x: "
                f"{ok}); with every row run whole {whole_r['uniform']:.2f}x / "
                f"{whole_r['long tail']:.2f}x; the warm start's SFT step "
                f"{ratio('SFT step, common prefix once (the warm start now)'):.2f}x of the "
                f"padded one.")
    head, paragraph = work_lines(work, args, n, tokens, prompt_tokens, width, long_n)
    title = "# Actor update vs a bare transformers step"
    if work.workload == "real_fc":
        title += f": {work.model.name} on function-calling rows"
    return "\n".join([
        title, "",
        head, "",
        f"Machine: {machine}", "",
        headline, "",
        md_table(["row", "ms (median)", "ratio"], table), "",
        paragraph, "",
        "Reproduce: `" + benchlib.command_line("bench_update.py", argv) + "`",
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print(describe(args))
    problem = missing(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.dry_run:
        return 0
    benchlib.set_bench_env()
    import torch

    torch.set_num_threads(args.threads)
    import transformers
    from transformers import AutoTokenizer

    from toolrl.workers.actor import FSDPActor

    work = real_fc_work(args) if args.workload == "real_fc" else calculator_work(args)
    tokenizer = AutoTokenizer.from_pretrained(work.model)
    loads = {"uniform": rollout_batch(work, tokenizer.pad_token_id),
             "long tail": rollout_batch(work, tokenizer.pad_token_id, long_every=LONG_EVERY)}
    actors = {"shared": FSDPActor(work.actor),
              "whole": FSDPActor(dataclasses.replace(work.actor, share_prompts=False))}
    times: dict[str, list[float]] = {}
    # One phase at a time, its rows alternating; each phase's models are built for it and
    # dropped after it (one memory footprint: SmolLM2 with its gradients and AdamW state is
    # ~2 GiB per model).
    for name, td in loads.items():
        rows = {f"{name}: floor, bare transformers step": bare_step(work.model, td, work.actor),
                f"{name}: toolrl update (default: shared prompts)":
                    lambda td=td: actors["shared"].update(td),
                f"{name}: toolrl update, every row whole":
                    lambda td=td: actors["whole"].update(td)}
        if name == "uniform":
            rows["uniform: old-log-prob forward (skipped on-policy)"] = \
                lambda td=td: actors["shared"].compute_log_prob(td)
        times.update(zip(rows, benchlib.timed_alternating(list(rows.values()), reps=args.reps,
                                                          desc=f"{name} batch"), strict=True))
        del rows
        gc.collect()
    actors.clear()
    gc.collect()
    sft_padded, sft_shared = sft_steps(work.model, sft_batch(work), work.sft_lr)
    rows = {"SFT step, padded (the warm start before)": sft_padded,
            "SFT step, common prefix once (the warm start now)": sft_shared}
    times.update(zip(rows, benchlib.timed_alternating(list(rows.values()), reps=args.reps,
                                                      desc="SFT step"), strict=True))
    med = {name: median(t) for name, t in times.items()}
    machine = benchlib.machine_label(torch=torch.__version__,
                                     transformers=transformers.__version__) + "."
    text = summarize(work, args, sys.argv[1:] if argv is None else argv, med,
                     loads["uniform"], machine)
    benchlib.write_result(args.output, text)
    benchlib.save_raw("update_real_fc" if work.workload == "real_fc" else "update",
                      {"model": str(work.model), "workload": work.workload, "rows": work.rows,
                       "medians": med, "times": times})
    return 0


if __name__ == "__main__":
    sys.exit(main())
