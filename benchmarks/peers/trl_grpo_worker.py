"""The TRL side of benchmarks/bench_trl.py: GRPOTrainer on the Calculator tasks, one step per
"go" from the coordinator.

Runs in the peer's own venv (benchmarks/.venv-trl: trl, transformers, accelerate, datasets,
torch; no toolrl), so the Calculator env is re-stated here with exactly the tools, docstrings and
success check of ``toolrl/Calculator-v0`` (envs/calculator.py). The episode is TRL's own
tool-calling loop through ``environment_factory``: one env instance per rollout, its public
methods are the tools, ``get_reward`` scores the rollout (1.0 when the submitted answer equals
the ground truth, the same as toolrl's ``success`` reward).

Protocol (line JSON; see benchlib.worker_channel): the worker sends ``ready``, then waits for a
``step`` command before each optimizer step and answers with that step's timings.

    benchmarks/.venv-trl/bin/python benchmarks/peers/trl_grpo_worker.py SPEC.json
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


def main() -> int:
    set_bench_env()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    send, receive = worker_channel()
    try:
        return run(json.loads(Path(sys.argv[1]).read_text()), send, receive)
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
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    torch.manual_seed(spec["seed"])
    tasks = [json.loads(line) for line in Path(spec["tasks"]).read_text().splitlines() if line]
    rows = [{"prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": t["question"]}],
             "ground_truth": float(t["ground_truth"])} for t in tasks]
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.padding_side = "left"
    # The tiny model's template is Hermes-style like Qwen's: TRL parses its tool calls with
    # the Qwen3 response template (TRL only knows the templates of published models).
    tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    batch, group = spec["batch_size"], spec["group_size"]
    args = GRPOConfig(
        output_dir=spec["output_dir"], use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=batch * group, num_generations=group,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        max_completion_length=spec["max_completion_length"],
        max_tool_calling_iterations=spec["max_turns"] - 1,
        max_steps=spec["steps"], learning_rate=spec["lr"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0, beta=0.0, loss_type="dapo",
        temperature=spec["temperature"], top_p=1.0, top_k=0, shuffle_dataset=False,
        logging_steps=1, report_to="none", save_strategy="no", seed=spec["seed"],
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )
    trainer = GRPOTrainer(model=model, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(rows),
                          environment_factory=CalculatorEnv)
    first_prompt = tokenizer.apply_chat_template(
        rows[0]["prompt"], tools=trainer._env_tools[None], add_generation_prompt=True,
        tokenize=True, return_dict=False, chat_template=trainer.chat_template)

    phase: dict[str, float] = {}
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
          "torch_threads": torch.get_num_threads(), "prompt_tokens": len(first_prompt)})
    with contextlib.suppress(SystemExit):  # the coordinator said stop before the last step
        trainer.train()
    send({"event": "done"})
    if receive().get("cmd") != "stop":
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
