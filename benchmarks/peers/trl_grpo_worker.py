"""The TRL side of benchmarks/bench_trl.py: GRPOTrainer on the Calculator tasks or on real
function-calling rows (``workload`` in the spec), one step per "go" from the coordinator.

Runs in the peer's own venv (benchmarks/.venv-trl: trl, transformers, accelerate, datasets,
torch; toolrl is not installed there).

calculator: the Calculator env is re-stated here with exactly the tools, docstrings and
success check of ``toolrl/Calculator-v0`` (envs/calculator.py). The episode is TRL's own
tool-calling loop through ``environment_factory``: one env instance per rollout, its public
methods are the tools, ``get_reward`` scores the rollout (1.0 when the submitted answer equals
the ground truth, the same as toolrl's ``success`` reward).

real_fc: one turn per row. The prompts arrive as text the coordinator rendered with toolrl's
chat renderer (the model's template and the row's tools) together with toolrl's token ids, and
every row is checked to tokenize here to exactly those ids. The reward function is
`real_fc_score`: toolrl's ``bfcl_ast`` and ``format`` rewards re-stated over toolrl's own
parser and BFCL checker (toolrl.core.parse, toolrl.core.bfcl: pure Python, imported from the
source tree, which needs only ``lazy_loader`` here); before training, each row's reference
completions must score here what toolrl's composed reward gave them in the coordinator.

Protocol (line JSON; see benchlib.worker_channel): the worker sends ``ready``, then waits for a
``step`` command before each optimizer step and answers with that step's timings.

    benchmarks/.venv-trl/bin/python benchmarks/peers/trl_grpo_worker.py SPEC.json [--check]

``--check`` (real_fc): run the checks above and build the trainer's config, print one JSON line,
train nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import set_bench_env, worker_channel

ROOT = Path(__file__).resolve().parents[2]

SYSTEM_PROMPT = "Use the tools to compute, then call submit with the answer."


def _num(x: float) -> float | int:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return int(x)
    return x


class CalculatorEnv:
    """envs/calculator.py's tools for TRL's ``environment_factory`` (same names, docstrings,
    argument types and results)."""

    def __init__(self) -> None:
        self.ground_truth: float | None = None
        self.submitted: float | None = None

    def reset(self, **row) -> None:
        self.ground_truth = float(row["ground_truth"])
        self.submitted = None

    def add(self, a: float, b: float) -> float:
        """a + b

        Args:
            a: a number
            b: a number
        """
        return _num(a + b)

    def sub(self, a: float, b: float) -> float:
        """a - b

        Args:
            a: a number
            b: a number
        """
        return _num(a - b)

    def mul(self, a: float, b: float) -> float:
        """a * b

        Args:
            a: a number
            b: a number
        """
        return _num(a * b)

    def div(self, a: float, b: float) -> float:
        """a / b

        Args:
            a: a number
            b: a number
        """
        return _num(a / b)

    def pow(self, a: float, b: float) -> float:
        """a ** b

        Args:
            a: a number
            b: a number
        """
        if abs(b) > 64 or abs(a) > 1e9:
            raise ValueError("operands too large for pow")
        return _num(float(a) ** b)

    def submit(self, answer: float) -> str:
        """Submit the final answer.

        Args:
            answer: the answer
        """
        self.submitted = answer
        return "submitted"

    def get_reward(self) -> float:
        if self.submitted is None or self.ground_truth is None:
            return 0.0
        try:
            submitted = float(self.submitted)
        except (TypeError, ValueError, OverflowError):
            return 0.0
        truth = self.ground_truth
        return float(abs(submitted - truth) <= 1e-6 * max(1.0, abs(truth)))


# --- real_fc: toolrl's reward, re-stated -----------------------------------------------------
def real_fc_score(text: str, task: dict, weights: dict[str, float]) -> tuple[float, float, int]:
    """(total, bfcl_ast, calls parsed) of one completion, as toolrl scores the one-turn episode
    of ``task`` (``row``: the row as the env holds it after reset, ``tools``: the episode's tool
    schemas, ``format``, ``strict_parse``): ``weights["bfcl_ast"] * bfcl_ast + weights["format"]
    * format`` with both rewards' defaults (rewards/bfcl_ast.py, rewards/format.py)."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # toolrl's source tree: its parser and BFCL checker
    from toolrl.core import bfcl
    from toolrl.core.parse import get_format

    row, tools = task["row"], task["tools"]
    parse = get_format(task["format"]).parse(text)
    # bfcl_ast: BFCL's AST check of the turn's calls against the row's possible answers
    verdict = bfcl.check_parsed([parse], row["ground_truth"], row.get("category"),
                                row.get("tools") or tools,
                                strict_parse=task.get("strict_parse", True))
    ast = 1.0 if verdict.valid else 0.0
    # format, one turn, defaults: parse error -1, unknown tool -1, json repair -0.5 (floor 0);
    # no call, no problem, where the row expects a call: 0
    known = {t.get("function", t).get("name") for t in tools} if tools else None
    penalty, problems = 0.0, False
    if parse.errors:
        penalty, problems = penalty + 1.0, True
    if known is not None and any(c.name not in known for c in parse.calls):
        penalty, problems = penalty + 1.0, True
    if parse.repaired:
        penalty, problems = penalty + 0.5, True
    fmt = max(0.0, 1.0 - penalty)
    truth = row.get("ground_truth")
    expects_call = bool(truth) if isinstance(truth, list) else bool(tools)
    if not parse.calls and not problems and expects_call:
        fmt = 0.0
    return weights["bfcl_ast"] * ast + weights["format"] * fmt, ast, len(parse.calls)


def check_real_fc_rows(prepared: list[dict], tokenizer, weights: dict[str, float]) -> dict:
    """Every row's prompt tokenizes here (as TRL tokenizes a text prompt) to toolrl's ids, and
    its reference completions score what toolrl's reward gave them; raises otherwise."""
    bad_ids, bad_scores = [], []
    for r in prepared:
        ids = tokenizer(text=[r["prompt"]])["input_ids"][0]
        if list(ids) != r["prompt_ids"]:
            bad_ids.append(r["id"])
        for name, ref in r["references"].items():
            got = real_fc_score(ref["text"], r["task"], weights)[0]
            if abs(got - ref["toolrl"]) > 1e-9:
                bad_scores.append(f"{r['id']} {name}: {got} here, {ref['toolrl']} in toolrl")
    if bad_ids or bad_scores:
        raise ValueError(f"the TRL side would not get the same work: prompt ids differ for "
                         f"{bad_ids or 'no row'}; scores differ for {bad_scores or 'no row'}")
    lengths = [len(r["prompt_ids"]) for r in prepared]
    return {"rows": len(prepared), "references": sum(len(r["references"]) for r in prepared),
            "prompt_tokens": sum(lengths) / len(lengths)}


def grpo_config(spec: dict):
    """The GRPOConfig of a spec: one generation and one optimizer step per step; real_fc in
    micro-batches of ``micro_batch_size`` sequences (gradient accumulation over the batch)."""
    from trl import GRPOConfig

    batch, group = spec["batch_size"], spec["group_size"]
    if spec.get("workload") == "real_fc":
        micro = spec["micro_batch_size"]
        shape = {"per_device_train_batch_size": micro,
                 "gradient_accumulation_steps": batch * group // micro,
                 "steps_per_generation": batch * group // micro}
    else:
        shape = {"per_device_train_batch_size": batch * group, "gradient_accumulation_steps": 1,
                 "steps_per_generation": 1,
                 "max_tool_calling_iterations": spec["max_turns"] - 1}
    return GRPOConfig(
        output_dir=spec["output_dir"], use_cpu=True, bf16=False, gradient_checkpointing=False,
        num_generations=group, num_iterations=1, **shape,
        max_completion_length=spec["max_completion_length"],
        max_steps=spec["steps"], learning_rate=spec["lr"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0, beta=0.0, loss_type="dapo",
        temperature=spec["temperature"], top_p=1.0, top_k=0, shuffle_dataset=False,
        logging_steps=1, report_to="none", save_strategy="no", seed=spec["seed"],
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )


def read_jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


def check(spec: dict) -> int:
    """``--check``: the real_fc rows' checks and the trainer's config; one JSON line out."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    out = check_real_fc_rows(read_jsonl(spec["tasks"]), tokenizer, spec["reward_weights"])
    args = grpo_config(spec)
    out["generation_batch_size"] = args.generation_batch_size
    out["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    print(json.dumps(out), flush=True)
    return 0


def main() -> int:
    set_bench_env()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    spec = json.loads(Path(sys.argv[1]).read_text())
    if "--check" in sys.argv[2:]:
        return check(spec)
    send, receive = worker_channel()
    try:
        return run(spec, send, receive)
    except Exception as e:
        traceback.print_exc()
        send({"event": "error", "error": f"{type(e).__name__}: {e}"})
        return 1


def run(spec: dict, send, receive) -> int:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    torch.manual_seed(spec["seed"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.padding_side = "left"
    phase: dict[str, float] = {}
    if spec.get("workload") == "real_fc":
        prepared = read_jsonl(spec["tasks"])
        checked = check_real_fc_rows(prepared, tokenizer, spec["reward_weights"])
        # text prompts (TRL's "standard" format): TRL tokenizes them, no template applied
        rows = [{"prompt": r["prompt"], "task": json.dumps(r["task"])} for r in prepared]
        weights = spec["reward_weights"]

        def real_fc(prompts, completions, task, **kwargs) -> list[float]:
            scores = [real_fc_score(c, json.loads(t), weights)
                      for c, t in zip(completions, task, strict=True)]
            phase["tool_calls_mean"] = sum(s[2] for s in scores) / len(scores)
            phase["success_mean"] = sum(s[1] for s in scores) / len(scores)
            return [s[0] for s in scores]

        trainer_kwargs = {"reward_funcs": [real_fc]}
        first_prompt = checked["prompt_tokens"]  # the mean over the rows, identical in toolrl
    else:
        tasks = read_jsonl(spec["tasks"])
        rows = [{"prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": t["question"]}],
                 "ground_truth": float(t["ground_truth"])} for t in tasks]
        # The tiny model's template is Hermes-style like Qwen's: TRL parses its tool calls with
        # the Qwen3 response template (TRL only knows the templates of published models).
        tokenizer.response_template = qwen3_template
        trainer_kwargs = {"environment_factory": CalculatorEnv}
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    args = grpo_config(spec)
    trainer = GRPOTrainer(model=model, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(rows), **trainer_kwargs)
    if spec.get("workload") != "real_fc":
        first_prompt = len(tokenizer.apply_chat_template(
            rows[0]["prompt"], tools=trainer._env_tools[None], add_generation_prompt=True,
            tokenize=True, return_dict=False, chat_template=trainer.chat_template))

    generate = trainer._generate_and_score_completions

    def timed_generate(inputs):
        start = time.perf_counter()
        out = generate(inputs)
        phase["rollout_s"] = time.perf_counter() - start
        mask = out["completion_mask"]
        if "tool_mask" in out:
            mask = mask * out["tool_mask"]
        phase["sampled_tokens"] = float(mask.sum())
        metrics = trainer._metrics["train"]
        if spec.get("workload") != "real_fc":  # real_fc: counted by the reward function
            calls = metrics.get("tools/call_frequency") or [0.0]
            phase["tool_calls_mean"] = float(calls[-1])
        phase["reward_mean"] = float((metrics.get("reward") or [float("nan")])[-1])
        return out

    trainer._generate_and_score_completions = timed_generate

    class StepGate(TrainerCallback):
        """Waits for the coordinator before each step and reports the step's timings."""

        def on_step_begin(self, args, state, control, **kwargs):
            message = receive()
            if message.get("cmd") != "step":
                raise SystemExit(0)
            phase.clear()
            phase["_start"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_s = time.perf_counter() - phase.pop("_start")
            rollout = phase.get("rollout_s", float("nan"))
            send({"event": "step", "step": state.global_step, "step_s": step_s,
                  "rollout_s": rollout, "update_s": step_s - rollout, **phase})

    trainer.add_callback(StepGate())
    send({"event": "ready", "versions": {"trl": trl.__version__,
                                         "transformers": transformers.__version__,
                                         "torch": torch.__version__},
          "torch_threads": torch.get_num_threads(), "prompt_tokens": first_prompt})
    with contextlib.suppress(SystemExit):  # the coordinator said stop before the last step
        trainer.train()
    send({"event": "done"})
    if receive().get("cmd") != "stop":
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
