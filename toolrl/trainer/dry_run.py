"""``toolrl train --dry-run``: what a run would train on, in seconds, with no Ray and no vLLM.

It loads the config and the task rows exactly as the trainer does and runs the trainer's own
check of every row (`toolrl.trainer.preflight.check_task_rows`: tools, gold answers, prompts
rendered with their tools by the model's chat template against the rollout's prompt budget), so
it refuses exactly what ``toolrl train`` refuses, with the same counts. Then it plays a few
distinct rows (never one twice) with the env's oracle and with a few bad policies (no call, an
unknown tool, a call without arguments, random arguments, random text) through the rollout's own
episode loop (`toolrl.rollout.scripted.ScriptedRunner`: the policy writes each turn in place of
the engine, the loop applies the run's token budgets, turn cap and per-turn prompts and gives the
finish reasons training would see), scores every episode with the configured rewards and prints
per-reward scores, finish reasons and errors. What would make the run train on nothing (rows the
check refuses, an oracle that cannot succeed, does not end, makes tool errors or is cut by the
budget, env or reward exceptions, a reward that pays the oracle no more than a bad policy) is
listed as a problem with the key to change; `dry_run` returns them (the command exits 1 when
there are any).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from toolrl.core.env import OracleUnavailable, run_episode
from toolrl.core.registration import env_of, make_env, row_env
from toolrl.core.trajectory import Trajectory
from toolrl.data.check import check_rows
from toolrl.models.families import family_tokenizer
from toolrl.models.tiny import build_tokenizer, needs_build
from toolrl.registry import RegistryError
from toolrl.reward import ComposedReward, RewardBatch, RewardConfigError
from toolrl.rollout.chat import ChatRenderer, TemplateError, tool_coverage
from toolrl.rollout.conformance import template_report
from toolrl.rollout.scripted import ScriptedPolicy, ScriptedRunner
from toolrl.rollout.worker import RolloutConfig
from toolrl.trainer.config import (
    ConfigError,
    ExperimentConfig,
    resolve_model,
    worker_rollout_config,
)
from toolrl.trainer.context import RunContext
from toolrl.trainer.mixture import RewardSets
from toolrl.trainer.policies import BAD_POLICIES, Policy
from toolrl.trainer.policies import oracle_policy as _oracle
from toolrl.trainer.preflight import check_task_rows

__all__ = ["BAD_POLICIES", "DryRunReport", "PolicySummary", "PromptCount", "dry_run"]


@dataclass
class PromptCount:
    """One sampled task's first prompt: its env and token count."""

    task_id: Any
    env: str
    tokens: int


@dataclass
class PolicySummary:
    """How one policy's episodes went: success, finish reasons, errors and reward scores."""

    policy: str
    episodes: int
    success: float
    finish: dict[str, int]
    env_errors: list[str]  # an episode that ended in an exception: where and why
    tool_errors: int  # typed error observations (bad calls), not failures
    reward_total: float
    rewards: dict[str, float]  # component alias (or env/alias) -> mean raw score
    reward_errors: dict[str, list[str]]  # component -> the messages of its failures
    scores: dict[int, float] = field(default_factory=dict)  # sampled row index -> total


@dataclass
class DryRunReport:
    """What `dry_run` found (`problems` empty: nothing that would waste the run)."""

    train_rows: int
    val_rows: int
    max_prompt_tokens: int
    max_total_tokens: int
    prompts: list[PromptCount] = field(default_factory=list)
    policies: list[PolicySummary] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def dry_run(cfg: ExperimentConfig, *, tasks: int = 4, console: Console | None = None
            ) -> DryRunReport:
    """Check ``cfg`` end to end without Ray or vLLM (see the module docstring); ``tasks``
    rows (train rows first, then one validation row) are rendered and played."""
    console = console or Console()
    rollout = worker_rollout_config(cfg)
    try:  # an unknown env or reward, or bad reward kwargs: one clear line, as a config error
        run = RunContext(cfg, console=console)
    except (RegistryError, RewardConfigError) as exc:
        raise ConfigError(str(exc)) from None
    try:
        try:
            train, val = run.load_tasks()
        except RegistryError as exc:
            raise ConfigError(str(exc)) from None
        report = DryRunReport(len(train), len(val), rollout.max_prompt_len,
                              rollout.max_total_tokens)
        renderer = _renderer(cfg, rollout, report)
        try:  # the trainer's check of every row: the same verdict and counts as train, and
            # the rows it would run (data.overlong_prompts=filter drops some) are those sampled
            train, val = check_task_rows(train, val, cfg,
                                         renderer.tokenizer if renderer else None,
                                         log=lambda line: report.notes.append(line))
        except ConfigError as exc:
            report.problems.append(str(exc))
        rows = _sample(_fit(train, cfg), _fit(val, cfg), tasks, cfg.env.id)
        first_prompt = _count_prompts(cfg, rows, renderer, rollout, report)
        if renderer is None:
            report.notes.append("episodes played as text, without the rollout's token "
                                "budgets (no tokenizer)")
        episodes = {name: _play_all(cfg, rows, policy, rollout, renderer)
                    for name, policy in {"oracle": _oracle, **BAD_POLICIES}.items()}
        if not episodes["oracle"]:
            report.notes.append(f"{cfg.env.id} has no oracle (oracle_action): only the bad "
                                f"policies were played")
        for name, played in episodes.items():
            if played:
                report.policies.append(_summarize(name, played, run.reward, cfg.env.id))
        _check_oracle([t for _, t in episodes["oracle"]], rollout, report)
        _check_episodes(report, uncut={i for i, t in episodes["oracle"] if not _cut(t)})
    finally:
        run.close()
    _print(cfg, report, first_prompt, console)
    return report


def _fit(rows: list[dict[str, Any]], cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """The rows the row check does not refuse (those it refuses are problems already)."""
    bad = {p.index for p in check_rows(rows, "rows", cfg.env.id).blocking}
    return [r for i, r in enumerate(rows) if i not in bad]


def _sample(train: list[dict[str, Any]], val: list[dict[str, Any]], n: int, default_env: str
            ) -> list[dict[str, Any]]:
    """``n`` distinct rows: train rows taken in turn from each env of the run, then a
    validation row; a row already taken (the same id and content, e.g. a val file that is the
    train file) is never taken again."""
    seen: set[str] = set()

    def distinct(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for row in rows:
            key = json.dumps(row, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                out.append(row)
        return out

    by_env: dict[str, list[dict[str, Any]]] = {}
    for row in distinct(train):
        by_env.setdefault(env_of(row, default_env), []).append(row)
    val = distinct(val)
    want = max(n - 1, 1) if val else max(n, 1)
    picked: list[dict[str, Any]] = []
    for k in range(want):
        for rows in by_env.values():
            if len(picked) < want and k < len(rows):
                picked.append(rows[k])
    return [dict(r) for r in picked + val[:max(n, 1) - len(picked)]]


def _renderer(cfg: ExperimentConfig, rollout: RolloutConfig, report: DryRunReport) -> Any:
    """The rollout workers' `ChatRenderer` on the run's tokenizer (None: none could be loaded;
    the report says why)."""
    try:
        tokenizer = _tokenizer(cfg, rollout)
    except ConfigError as exc:  # the run itself would refuse this model path
        report.problems.append(str(exc))
        return None
    except Exception as exc:  # no local model and no hub: counts are skipped, not the run
        report.notes.append(f"no tokenizer ({type(exc).__name__}: {exc}): prompt token counts "
                            f"skipped")
        return None
    try:
        renderer = ChatRenderer(tokenizer,
                                allow_non_prefix_preserving=rollout.allow_non_prefix_preserving,
                                chat_template_kwargs=rollout.chat_template_kwargs,
                                family=rollout.family, history_policy=rollout.history_policy)
    except TemplateError as exc:
        report.problems.append(f"chat template: {exc}")
        return None

    report.notes.extend(f"template: {line}" for line in template_report(renderer))
    try:
        coverage = tool_coverage(renderer)
    except TemplateError as exc:
        report.notes.append(f"tool coverage not checked: {exc}")
    else:
        if not coverage.ok:
            report.notes.append(coverage.describe())
    return renderer


def _builds(cfg: ExperimentConfig) -> bool:
    """Whether the run would build its tiny model (a build of another size: ConfigError)."""
    try:
        return needs_build(cfg.model.path, cfg.model.tiny_size, cfg.model.tiny_tokenizer,
                           cfg.model.tiny_vocab)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _tokenizer(cfg: ExperimentConfig, rollout: RolloutConfig) -> Any:
    if rollout.engine.tokenizer is not None:
        path = resolve_model(cfg, "rollout.engine.tokenizer")
    elif cfg.model.build_tiny_if_missing and _builds(cfg):
        if cfg.model.tiny_tokenizer != "tiny":  # a family's real tokenizer (cached)

            return family_tokenizer(cfg.model.tiny_tokenizer)
        return build_tokenizer(seed=cfg.seed)  # the tokenizer of the model the run would build
    else:
        path = resolve_model(cfg)
    return AutoTokenizer.from_pretrained(path)


def _count_prompts(cfg: ExperimentConfig, rows: list[dict[str, Any]], renderer: Any,
                   rollout: RolloutConfig, report: DryRunReport) -> str:
    """Token counts of the sampled rows' first prompts; returns the first one's text."""
    first = ""
    if renderer is None:
        return first
    for row in rows:
        env_id, kwargs = row_env(row, cfg.env.id, cfg.env.kwargs)
        env = make_env(env_id, **kwargs)
        try:
            messages, info = env.reset(seed=cfg.seed, options=row)
            tools = info.get("tools") or []
            ids = renderer.render_prompt(messages, tools)
            first = first or renderer.render_text(messages, tools, add_generation_prompt=True)
        except Exception as exc:
            report.problems.append(f"task {row.get('id')!r} ({env_id}): the first prompt "
                                   f"cannot be rendered: {type(exc).__name__}: {exc}")
            continue
        finally:
            env.close()
        report.prompts.append(PromptCount(row.get("id"), env_id, len(ids)))
    return first  # prompts over the budget: check_task_rows counted every row


def _play_all(cfg: ExperimentConfig, rows: list[dict[str, Any]], policy: Policy,
              rollout: RolloutConfig, renderer: ChatRenderer | None
              ) -> list[tuple[int, Trajectory]]:
    """Each row's episode with its index in ``rows`` (a row the oracle cannot play: none)."""
    out = []
    for i, row in enumerate(rows):
        env_id, kwargs = row_env(row, cfg.env.id, cfg.env.kwargs)
        rng = random.Random(f"{cfg.seed}:{i}")
        try:
            traj = asyncio.run(_play(env_id, kwargs, row, lambda e, messages, rng=rng: policy(
                e, messages, rng), cfg.seed + i, rollout, renderer))
        except OracleUnavailable:
            continue
        out.append((i, traj))
    return out


async def _play(env_id: str, kwargs: dict[str, Any], row: dict[str, Any],
                policy: ScriptedPolicy, seed: int, rollout: RolloutConfig,
                renderer: ChatRenderer | None) -> Trajectory:
    """One episode of the rollout's own loop (`ScriptedRunner`: the first prompt's and the
    response's budgets, the turn cap, per-turn prompts, env errors and timeouts, finish
    reasons), the policy writing the turns. Only when no tokenizer can be loaded (no budgets
    to count in) is it a text-level episode under the turn cap (`toolrl.run_episode`, env
    exceptions recorded as finish reason ``error``, as the rollout ends them)."""
    env = make_env(env_id, **kwargs)
    try:
        if renderer is None:
            return await run_episode(env, policy, row=row, seed=seed,
                                     max_steps=rollout.max_turns, record_errors=True)
        runner = ScriptedRunner(policy, renderer, rollout.episode_config(),
                                max_model_len=rollout.engine.max_model_len)
        return await runner.run(env, row, seed=seed)
    finally:
        env.close()


def _summarize(name: str, played: list[tuple[int, Trajectory]], rewards: RewardSets,
               default_env: str) -> PolicySummary:
    trajs = [t for _, t in played]
    envs = [env_of(t.row, default_env) for t in trajs]
    totals: dict[int, float] = {}
    means: dict[str, list[float]] = {}
    failures: dict[str, list[str]] = {}
    groups: dict[str | None, list[int]] = {}
    for i, env in enumerate(envs):
        groups.setdefault(env if env in rewards.per_env else None, []).append(i)
    for env, indices in groups.items():
        fn: ComposedReward = rewards.default if env is None else rewards.per_env[env]
        batch: RewardBatch = fn.score([trajs[i] for i in indices])
        prefix = "" if env is None else f"{env}/"
        totals.update(zip(indices, batch.scores, strict=True))
        for alias, values in batch.components.items():
            if "/" not in alias:
                means.setdefault(prefix + alias, []).extend(v for v in values if v is not None)
        for failure in batch.failures:
            failures.setdefault(prefix + failure.reward, []).append(failure.message)
    return PolicySummary(
        policy=name, episodes=len(trajs), success=sum(t.success for t in trajs) / len(trajs),
        finish=dict(Counter(t.finish_reason for t in trajs)),
        env_errors=[f"task {t.id!r}: {t.error}" for t in trajs if t.finish_reason == "error"],
        tool_errors=sum(len(t.errors) for t in trajs),
        reward_total=sum(totals.values()) / len(totals),
        rewards={k: sum(v) / len(v) for k, v in means.items() if v}, reward_errors=failures,
        scores={played[i][0]: score for i, score in totals.items()})


def _check_oracle(trajs: list[Trajectory], rollout: RolloutConfig, report: DryRunReport
                  ) -> None:
    """The oracle must succeed, end by itself within the turn cap, and fit the token budget
    (its episodes are the rollout's own: cut turns and episodes say it)."""
    if not trajs:
        return
    # what a turn cut by rollout.max_tokens_per_turn makes go wrong is that cut's problem
    whole = [t for t in trajs if not _turn_cut(t)]
    failed = [t for t in whole if not t.success and t.finish_reason == "terminated"]
    if failed:
        why = (failed[0].final_state or {}).get("error") if isinstance(
            failed[0].final_state, Mapping) else None
        report.problems.append(
            f"the oracle failed {len(failed)} of {len(trajs)} tasks that it ended itself (task "
            f"{failed[0].id!r}" + (f": {why}" if why else "") + "): check that row's ground "
            "truth, or the env's evaluate() and oracle_action()")
    erring = [t for t in whole if t.errors]
    if erring:
        first = erring[0].errors[0]
        report.problems.append(
            f"the oracle made tool errors in {len(erring)} of {len(trajs)} tasks (task "
            f"{erring[0].id!r}: {first.get('type')}: {first.get('message')}): a model that "
            f"acts like the oracle is told it is wrong; check that row's ground truth")
    capped = [t for t in whole if t.finish_reason == "max_turns"]
    if capped:
        report.problems.append(
            f"the oracle's episode of task {capped[0].id!r} needs more than rollout.max_turns="
            f"{rollout.max_turns} turns (the rollout stops it there, unfinished): raise "
            f"rollout.max_turns")
    cut = [t for t in trajs if t.finish_reason == "truncated"]
    if cut:
        report.problems.append(
            f"the env cut the oracle's episode of task {cut[0].id!r} at its max_turns "
            f"({len(cut[0].turns)} turns) instead of ending it: does on_turn return "
            f"Turn(terminated=True) once the task is done?")
    long_turn = next((t for t in trajs if _turn_cut(t)), None)
    if long_turn is not None:
        report.problems.append(
            f"an oracle turn of task {long_turn.id!r} is longer than "
            f"rollout.max_tokens_per_turn={rollout.max_tokens_per_turn}: a model that acts "
            f"like the oracle is cut off (finish reason 'length'); raise "
            f"rollout.max_tokens_per_turn")
    # an episode cut at its first prompt is a row the row check counted already; one whose
    # turns were cut (then retried) is the turn cap's problem, said above
    short = next((t for t in trajs if t.finish_reason in ("context", "length") and t.turns
                  and not _turn_cut(t)), None)
    if short is None:
        return
    if (short.error or "").startswith("per_turn:"):
        report.problems.append(
            f"rollout.history_policy=per_turn prompts each turn with the rendered history: "
            f"the oracle's episode of task {short.id!r} ends after {len(short.turns)} turns "
            f"({short.error}), so every such episode ends there (finish reason 'context'); "
            f"raise rollout.max_prompt_tokens={rollout.max_prompt_len}")
        return
    report.problems.append(
        f"the oracle's episode of task {short.id!r} runs out of context after "
        f"{len(short.turns)} turns: its turns and observations after its first prompt need "
        f"more than the response's budget rollout.max_total_tokens - "
        f"rollout.max_prompt_tokens = {rollout.max_response_len}, so a model that acts like "
        f"the oracle is cut off there (finish reason {short.finish_reason!r}); raise "
        f"rollout.max_total_tokens")


def _turn_cut(traj: Trajectory) -> bool:
    """Whether ``rollout.max_tokens_per_turn`` cut one of the episode's turns (finish reason
    'length' on a turn the env then got; not the last turn of an episode whose budget ran out
    in it: finish reason 'length' on the episode)."""
    turns = traj.turns[:-1] if traj.finish_reason == "length" else traj.turns
    return any(turn.finish_reason == "length" for turn in turns)


def _cut(traj: Trajectory) -> bool:
    """Whether the rollout's budgets or turn cap stopped the episode or cut one of its turns
    (the problems `_check_oracle` reports): its reward says nothing of the reward's design."""
    return traj.finish_reason in ("context", "length", "max_turns") or _turn_cut(traj)


def _check_episodes(report: DryRunReport, uncut: set[int]) -> None:
    """Env exceptions, reward exceptions, and a reward that does not tell good from bad:
    compared over the rows whose oracle episode was not cut (``uncut``: the rows' indices;
    a cut one scores low however good the reward is, and is a problem of its own)."""
    for s in report.policies:
        if s.env_errors:
            report.problems.append(
                f"{len(s.env_errors)} of {s.episodes} {s.policy} episodes ended in an env "
                f"exception (finish reason 'error', no reward signal): {s.env_errors[0]}")
        for alias, messages in s.reward_errors.items():
            report.problems.append(
                f"reward {alias!r} raised on {len(messages)} of {s.episodes} {s.policy} "
                f"episodes (scored with the fallback): {messages[0].splitlines()[0]}")
    oracle = next((s for s in report.policies if s.policy == "oracle"), None)
    bad = [s for s in report.policies if s.policy != "oracle"]
    if oracle is None or not bad or not uncut:
        return

    def mean(s: PolicySummary) -> float:
        scores = [v for i, v in s.scores.items() if i in uncut]
        return sum(scores) / len(scores) if scores else float("-inf")

    best = max(bad, key=mean)
    if mean(oracle) <= mean(best):
        over = "" if len(uncut) == oracle.episodes else \
            f" (over the {len(uncut)} of {oracle.episodes} tasks whose oracle episode was not cut)"
        report.problems.append(
            f"the configured reward pays the oracle {mean(oracle):.3f} on average and the "
            f"{best.policy} policy {mean(best):.3f}{over}: it does not tell a correct episode "
            f"from a bad one; check the reward section")


def _print(cfg: ExperimentConfig, report: DryRunReport, first_prompt: str,
           console: Console) -> None:
    console.print(f"[bold]dry run[/bold] {cfg.experiment_name}: env {cfg.env.id}, "
                  f"{report.train_rows} train / {report.val_rows} val tasks, prompt budget "
                  f"{report.max_prompt_tokens} of {report.max_total_tokens} tokens, "
                  f"{cfg.rollout.max_turns} turns of <= {cfg.rollout.max_tokens_per_turn} tokens")
    if report.prompts:
        table = Table(title="first prompts (with tools)")
        for col in ("task", "env", "tokens", "budget"):
            table.add_column(col, justify="right" if col in ("tokens", "budget") else "left")
        for p in report.prompts:
            over = p.tokens > report.max_prompt_tokens
            table.add_row(str(p.task_id), p.env, f"[red]{p.tokens}[/red]" if over else
                          str(p.tokens), str(report.max_prompt_tokens))
        console.print(table)
    if first_prompt:
        console.print("first prompt as the model sees it:", style="bold")
        console.print(first_prompt[:2000] + (" [...]" if len(first_prompt) > 2000 else ""),
                      markup=False, highlight=False)
    if report.policies:
        table = Table(title="episodes of the oracle and of bad policies")
        for col in ("policy", "n", "success", "finish reasons", "tool errors", "env errors"):
            table.add_column(col, justify="left" if col in ("policy", "finish reasons") else
                             "right")
        for s in report.policies:
            finish = ", ".join(f"{k} {v}" for k, v in sorted(s.finish.items()))
            table.add_row(s.policy, str(s.episodes), f"{s.success:.2f}", finish,
                          str(s.tool_errors), str(len(s.env_errors)))
        console.print(table)
        aliases = sorted({a for s in report.policies for a in s.rewards})
        table = Table(title="configured rewards (mean raw scores)")
        for col in ("policy", *aliases, "total", "errors"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for s in report.policies:
            table.add_row(s.policy,
                          *(f"{s.rewards[a]:.3f}" if a in s.rewards else "-" for a in aliases),
                          f"{s.reward_total:.3f}",
                          str(sum(len(m) for m in s.reward_errors.values())))
        console.print(table)
    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    if report.ok:
        console.print("[green]no problems found[/green] (no Ray, no vLLM started)")
    for problem in report.problems:
        console.print(f"PROBLEM: {problem}", style="red", markup=False, highlight=False)

