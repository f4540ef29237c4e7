"""`toolrl train --dry-run`: prompt token counts and oracle/bad-policy scores with the configured
rewards, in-process, with no Ray, no vLLM and no process started; what would waste a run is a
problem (exit 1)."""

from __future__ import annotations

import io
import json
import multiprocessing.process
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import toolrl
from toolrl.cli import main
from toolrl.rollout.chat import ChatRenderer
from toolrl.trainer.config import load_config
from toolrl.trainer.dry_run import BAD_POLICIES, dry_run

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
Calculator = type(toolrl.make_env("toolrl/Calculator-v0").unwrapped)


class EvaluateRaises(Calculator):
    """Calculator whose evaluate() raises on every episode."""

    def evaluate(self) -> bool:
        return self.row["no_such_field"] > 0


class NeverEnds(Calculator):
    """Calculator whose submit never ends the episode."""

    def on_turn(self, parse: Any, results: Any) -> toolrl.Turn:
        return toolrl.Turn()


@pytest.fixture(scope="module", autouse=True)
def broken_envs():
    """Registered when this module's tests run (not at import: other modules' tests run every
    registered env through check-env)."""
    toolrl.register_env("dryrun/EvaluateRaises-v0", EvaluateRaises)
    toolrl.register_env("dryrun/NeverEnds-v0", NeverEnds)


@toolrl.reward("dryrun_boom")
def boom(traj: toolrl.Trajectory) -> float:
    """Raises on every trajectory."""
    raise RuntimeError("boom from a reward")


@toolrl.reward("dryrun_constant")
def constant(traj: toolrl.Trajectory) -> float:
    """Pays everything the same."""
    return 0.5


def config(tiny_model_dir: Path, *overrides: str):
    return load_config(QUICKSTART, [f"model.path={tiny_model_dir}", "data.train_size=8",
                                    "data.val_size=2", *overrides])


def run(cfg, **kwargs):
    out = io.StringIO()
    report = dry_run(cfg, console=Console(file=out, width=160), **kwargs)
    return report, out.getvalue()


def test_quickstart_counts_prompt_tokens_and_scores_the_oracle_and_bad_policies(
        tiny_model_dir):
    from transformers import AutoTokenizer

    cfg = config(tiny_model_dir)
    report, text = run(cfg, tasks=3)
    assert report.ok, report.problems
    assert report.train_rows == 8 and report.val_rows == 2
    # the counts are the rollout worker's: the model's chat template with the env's tools
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))
    env = toolrl.make_env("toolrl/Calculator-v0", difficulty=1, style="plain")
    expected = []
    for row in [*env.unwrapped.make_tasks(2, seed=0, split="train", difficulty=1, style="plain"),
                env.unwrapped.make_tasks(1, seed=0, split="val", difficulty=1,
                                         style="plain")[0]]:
        messages, info = env.reset(options=row)
        expected.append((row["id"], len(renderer.render_prompt(messages, info["tools"]))))
    assert [(p.task_id, p.tokens) for p in report.prompts] == expected
    assert report.max_prompt_tokens == 192  # half of rollout.max_total_tokens=384
    by_policy = {s.policy: s for s in report.policies}
    assert set(by_policy) == {"oracle", *BAD_POLICIES}
    oracle = by_policy["oracle"]
    assert oracle.success == 1.0 and oracle.finish == {"terminated": 3}
    assert oracle.rewards == {"success": 1.0} and oracle.reward_total == 1.0
    assert by_policy["no_call"].reward_total == 0.0
    assert by_policy["unknown_tool"].tool_errors > 0
    for word in ("tokens", "oracle", "unknown_tool", "no problems found", str(expected[0][1])):
        assert word in text
    # the tiny template renders every part of the tool schemas: no coverage note
    assert "the model never sees" not in text


def test_no_process_is_started(tiny_model_dir, monkeypatch):
    """Ray, vLLM, subprocesses and multiprocessing: any start raises, the dry run still runs."""
    import ray

    def refuse(*args: Any, **kwargs: Any):
        raise AssertionError("the dry run started a process")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(ray, "init", refuse)
    was_up = ray.is_initialized()
    report, _ = run(config(tiny_model_dir), tasks=2)
    assert report.ok and report.prompts and report.policies
    assert ray.is_initialized() == was_up


def test_a_prompt_over_the_budget_is_a_problem_with_the_key_to_change(tiny_model_dir):
    report, text = run(config(tiny_model_dir, "rollout.max_prompt_tokens=100"), tasks=2)
    longest = max(p.tokens for p in report.prompts)
    assert longest > 100
    assert len(report.problems) == 1
    problem = report.problems[0]
    # every row is counted, as train counts them (not only the sampled ones)
    assert "8 of 8 train rows" in problem and "2 of 2 val rows" in problem
    assert "the longest has" in problem
    assert "rollout.max_prompt_tokens" in problem and "PROBLEM" in text



def test_per_turn_prompts_past_the_budget_are_a_problem_with_the_key_to_change(
        tiny_model_dir):
    """per_turn prompts each turn with the rendered history: the quickstart's 192-token budget
    holds the first prompt but not the second (every episode would end after one turn)."""
    per_turn = ("rollout.history_policy=per_turn", "trainer.infra_failures.rule=drop_sample")
    report, _ = run(config(tiny_model_dir, *per_turn), tasks=2)
    assert any("per_turn" in p and "turn 2" in p and "rollout.max_prompt_tokens=192" in p
               for p in report.problems), report.problems
    report, _ = run(config(tiny_model_dir, *per_turn, "rollout.max_prompt_tokens=352"), tasks=2)
    assert report.ok, report.problems


def test_a_tiny_build_of_another_size_is_a_problem_and_stays(tiny_model_dir):
    """A config that would build a tiny model of another size over an existing tiny build
    (an overridden model.path) is refused, not rebuilt: the folder may be another run's."""
    stamp = (tiny_model_dir / "toolrl_tiny.json").read_text()
    report, text = run(config(tiny_model_dir, "model.build_tiny_if_missing=true",
                              "model.tiny_size=medium"), tasks=2)
    assert any("holds a tiny 'small' model, and model.tiny_size='medium' would replace it"
               in p for p in report.problems), report.problems
    assert "PROBLEM" in text and (tiny_model_dir / "toolrl_tiny.json").read_text() == stamp

def test_rows_filtered_for_their_prompt_length_are_not_the_ones_played(tiny_model_dir,
                                                                        tmp_path):
    """With data.overlong_prompts=filter the dry run plays the rows train would run: the
    dropped row is not sampled, and its oracle (longer than the context) is no problem."""
    rows = Calculator.make_tasks(4, seed=0, split="train")
    rows[0]["question"] += " Think carefully about it." * 60
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lengths = [p.tokens for p in run(config(tiny_model_dir), tasks=2)[0].prompts]
    budget = [f"data.train_file={train}", f"rollout.max_prompt_tokens={max(lengths) + 20}",
              f"rollout.max_total_tokens={max(lengths) + 200}",
              f"rollout.engine.max_model_len={max(lengths) + 200}"]
    report, text = run(config(tiny_model_dir, *budget, "data.overlong_prompts=filter"),
                       tasks=3)
    assert report.ok, report.problems
    assert "dropped 1 of 4 train rows" in text
    assert len(report.prompts) == 3 and max(p.tokens for p in report.prompts) <= max(
        lengths) + 20
    report, _ = run(config(tiny_model_dir, *budget), tasks=3)  # refused, as train refuses it
    assert any("1 of 4 train rows" in p for p in report.problems), report.problems


def test_an_evaluate_that_raises_is_a_problem_naming_the_exception(tiny_model_dir):
    report, _ = run(config(tiny_model_dir, "env.id=dryrun/EvaluateRaises-v0"), tasks=2)
    oracle = next(s for s in report.policies if s.policy == "oracle")
    assert oracle.finish == {"error": 2}
    problem = next(p for p in report.problems if "oracle episodes ended in an env exception"
                   in p)
    assert "KeyError: 'no_such_field'" in problem and "in evaluate" in problem


def test_an_oracle_that_never_ends_is_a_problem(tiny_model_dir):
    report, _ = run(config(tiny_model_dir, "env.id=dryrun/NeverEnds-v0",
                           "env.kwargs={max_turns: 2}"), tasks=1)
    assert any("env cut the oracle" in p and "Turn(terminated=True)" in p
               for p in report.problems), report.problems


def test_reward_failures_and_a_reward_that_pays_everything_alike_are_problems(tiny_model_dir):
    cfg = config(tiny_model_dir, "reward.rewards=[{name: dryrun_boom}]")
    report, _ = run(cfg, tasks=1)
    assert any("reward 'dryrun_boom' raised on 1 of 1 oracle episodes" in p
               and "boom from a reward" in p for p in report.problems), report.problems
    report, _ = run(config(tiny_model_dir, "reward.rewards=[{name: dryrun_constant}]"),
                    tasks=1)
    assert any("does not tell a correct episode from a bad one" in p
               for p in report.problems), report.problems


def test_cli_exit_status(tiny_model_dir, capsys):
    base = ["train", "--config", str(QUICKSTART), "--dry-run", "--dry-run-tasks", "1",
            f"model.path={tiny_model_dir}", "data.train_size=4", "data.val_size=1"]
    assert main(base) == 0
    assert "no problems found" in capsys.readouterr().out
    assert main([*base, "rollout.max_prompt_tokens=64"]) == 1
    assert "PROBLEM" in capsys.readouterr().out
    assert main([*base, "env.id=nope/Nothing-v0"]) == 2  # not an env: one clear line
    capsys.readouterr()
    assert main([*base, "trainer.mode=pipeline"]) == 2  # off-policy with no correction
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "actor.loss.corrections is empty" in err


def test_an_oracle_longer_than_the_rollout_cap_and_mixed_envs(tiny_model_dir):
    """Rows of every env of a mixture are sampled; Bank's oracle needs 6 turns, more than a
    rollout.max_turns of 4 (in a token budget that holds Bank's prompts and turns: the dry run
    plays the rollout's own loop); its state-based reward sees the final state."""
    mixture = ("data.mixture=[{env: toolrl/Bank-v0, train_size: 2, val_size: 1}]",)
    budget = ("rollout.max_prompt_tokens=768", "rollout.max_total_tokens=1536",
              "rollout.max_tokens_per_turn=128", "rollout.engine.max_model_len=2048")
    cfg = config(tiny_model_dir, "rollout.max_turns=4", *mixture, *budget,
                 "env_rewards={toolrl/Bank-v0: {rewards: [{name: exec_state}]}}")
    report, _ = run(cfg, tasks=3)
    assert [p.env for p in report.prompts] == ["toolrl/Calculator-v0", "toolrl/Bank-v0",
                                               "toolrl/Calculator-v0"]
    oracle = next(s for s in report.policies if s.policy == "oracle")
    assert oracle.finish == {"terminated": 2, "max_turns": 1} and not oracle.reward_errors
    assert "toolrl/Bank-v0/exec_state" in oracle.rewards
    assert any("needs more than rollout.max_turns=4 turns" in p for p in report.problems)
    report, _ = run(config(tiny_model_dir, "rollout.max_turns=6", *mixture, *budget), tasks=3)
    assert report.ok, report.problems  # Bank's budget: its prompt and its 6 longer turns


def test_the_response_has_its_own_budget(tiny_model_dir):
    """What follows the first prompt has max_total_tokens - max_prompt_tokens, whatever the
    first prompt leaves unused: Bank's 6 oracle turns (~390 tokens after a prompt of at most
    589) do not fit 256 of it, though the whole transcript fits max_total_tokens (this let
    configs/function_calling_mixed.yaml cut every Bank episode). The rollout's own loop, which
    the dry run plays, cuts the oracle's episode there (finish reason 'context')."""
    base = ("rollout.max_turns=6", "rollout.max_tokens_per_turn=128",
            "data.mixture=[{env: toolrl/Bank-v0, train_size: 2, val_size: 1}]",
            "rollout.max_total_tokens=1024", "rollout.engine.max_model_len=1024")
    report, _ = run(config(tiny_model_dir, *base, "rollout.max_prompt_tokens=768"), tasks=3)
    assert any("after its first prompt" in p and "= 256" in p for p in report.problems), \
        report.problems
    report, _ = run(config(tiny_model_dir, *base, "rollout.max_prompt_tokens=600"), tasks=3)
    assert report.ok, report.problems


def test_an_oracle_turn_over_the_turn_cap_is_a_problem_naming_the_key(tiny_model_dir):
    """The rollout's loop cuts an oracle turn longer than max_tokens_per_turn (finish reason
    'length' on the turn); the problem names the key, and what the cut turns make go wrong
    (tool errors, a failed or unfinished episode, a reward that cannot tell the oracle from a
    bad policy) is not reported as problems of its own."""
    report, _ = run(config(tiny_model_dir, "rollout.max_tokens_per_turn=6"), tasks=2)
    assert len(report.problems) == 1, report.problems
    assert "rollout.max_tokens_per_turn=6" in report.problems[0]
    assert "'length'" in report.problems[0]


def test_the_reward_is_compared_over_the_oracles_uncut_episodes():
    """A cut oracle episode scores low however good the reward is: the oracle is compared
    with the bad policies over the other tasks only, and not at all when every one was cut."""
    from toolrl.trainer.dry_run import DryRunReport, PolicySummary, _check_episodes

    def summary(policy: str, scores: dict[int, float]) -> PolicySummary:
        return PolicySummary(policy, len(scores), 0.0, {}, [], 0,
                             sum(scores.values()) / len(scores), {}, {}, scores)

    def problems(uncut: set[int]) -> list[str]:
        report = DryRunReport(3, 0, 512, 1024, policies=[
            summary("oracle", {0: 1.0, 1: 0.0, 2: 0.0}), summary("no_call", {0: 0.0, 1: 0.5,
                                                                             2: 0.5})])
        _check_episodes(report, uncut)
        return report.problems

    assert problems({0}) == [] and problems(set()) == []
    assert len(problems({0, 1, 2})) == 1 and "over the" not in problems({0, 1, 2})[0]
    assert problems({0, 1}) == []
    assert "oracle 0.000 on average and the no_call policy 0.500 (over the 2 of 3 tasks whose " \
        "oracle episode was not cut)" in problems({1, 2})[0]


def test_without_a_tokenizer_episodes_are_played_as_text(tiny_model_dir, monkeypatch):
    """No tokenizer (no local model, no hub): no budgets to count in, so the episodes are
    text-level ones under the turn cap (toolrl.run_episode), and a note says so."""
    import toolrl.trainer.dry_run as module

    def offline(*args: Any, **kwargs: Any) -> Any:
        raise OSError("offline")

    monkeypatch.setattr(module, "_tokenizer", offline)
    report, _ = run(config(tiny_model_dir), tasks=2)
    assert report.ok, report.problems
    assert any("played as text" in n for n in report.notes), report.notes
    oracle = next(s for s in report.policies if s.policy == "oracle")
    assert oracle.finish == {"terminated": 2} and oracle.reward_total == 1.0
