"""``toolrl train --dry-run``: what a run would train on, in seconds, with no Ray and no vLLM.

It loads the config and the task rows exactly as the trainer does and runs the trainer's own
check of every row (`toolrl.trainer.preflight.check_task_rows`: tools, gold answers, prompts
rendered with their tools by the model's chat template against the rollout's prompt budget), so
it refuses exactly what ``toolrl train`` refuses, with the same counts. Then it plays a few
distinct rows (never one twice) with the env's oracle and with a few bad policies (no call, an
unknown tool, a call without arguments, random arguments, random text), scores every episode with
the configured rewards and prints per-reward scores, finish reasons and errors. What would make
the run train on nothing (rows the check refuses, an oracle that cannot succeed, does not end or
makes tool errors, env or reward exceptions, a reward that pays the oracle no more than a bad
policy) is listed as a problem with the key to change; `dry_run` returns them (the command exits
1 when there are any).
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
        episodes = {name: _play_all(cfg, rows, policy, rollout)
                    for name, policy in {"oracle": _oracle, **BAD_POLICIES}.items()}
        if not episodes["oracle"]:
            report.notes.append(f"{cfg.env.id} has no oracle (oracle_action): only the bad "
                                f"policies were played")
        for name, trajs in episodes.items():
            if trajs:
                report.policies.append(_summarize(name, trajs, run.reward, cfg.env.id))
        _check_oracle(episodes["oracle"], renderer, rollout, report)
        _check_episodes(report)
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
              rollout: RolloutConfig) -> list[Trajectory]:
    out = []
    for i, row in enumerate(rows):
        env_id, kwargs = row_env(row, cfg.env.id, cfg.env.kwargs)
        rng = random.Random(f"{cfg.seed}:{i}")
        try:
            traj = asyncio.run(_play(env_id, kwargs, row, policy, cfg.seed + i,
                                     rollout.max_turns, rng))
        except OracleUnavailable:
            continue
        out.append(traj)
    return out


async def _play(env_id: str, kwargs: dict[str, Any], row: dict[str, Any], policy: Policy,
                seed: int, max_turns: int, rng: random.Random) -> Trajectory:
    """One text-level episode under the rollout's turn cap, ended as the rollout ends it (an
    exception of the env ends it with ``error``, never the dry run)."""
    env = make_env(env_id, **kwargs)
    try:
        return await run_episode(env, lambda e, messages: policy(e, messages, rng), row=row,
                                 seed=seed, max_steps=max_turns, record_errors=True)
    finally:
        env.close()


def _summarize(name: str, trajs: list[Trajectory], rewards: RewardSets, default_env: str
               ) -> PolicySummary:
    envs = [env_of(t.row, default_env) for t in trajs]
    totals: list[float] = []
    means: dict[str, list[float]] = {}
    failures: dict[str, list[str]] = {}
    groups: dict[str | None, list[int]] = {}
    for i, env in enumerate(envs):
        groups.setdefault(env if env in rewards.per_env else None, []).append(i)
    for env, indices in groups.items():
        fn: ComposedReward = rewards.default if env is None else rewards.per_env[env]
        batch: RewardBatch = fn.score([trajs[i] for i in indices])
        prefix = "" if env is None else f"{env}/"
        totals += batch.scores
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
        reward_total=sum(totals) / len(totals),
        rewards={k: sum(v) / len(v) for k, v in means.items() if v}, reward_errors=failures)


def _check_oracle(trajs: list[Trajectory], renderer: Any, rollout: RolloutConfig,
                  report: DryRunReport) -> None:
    """The oracle must succeed, end by itself within the turn cap, and fit the token budget."""
    if not trajs:
        return
    failed = [t for t in trajs if not t.success and t.finish_reason == "terminated"]
    if failed:
        why = (failed[0].final_state or {}).get("error") if isinstance(
            failed[0].final_state, Mapping) else None
        report.problems.append(
            f"the oracle failed {len(failed)} of {len(trajs)} tasks that it ended itself (task "
            f"{failed[0].id!r}" + (f": {why}" if why else "") + "): check that row's ground "
            "truth, or the env's evaluate() and oracle_action()")
    erring = [t for t in trajs if t.errors]
    if erring:
        first = erring[0].errors[0]
        report.problems.append(
            f"the oracle made tool errors in {len(erring)} of {len(trajs)} tasks (task "
            f"{erring[0].id!r}: {first.get('type')}: {first.get('message')}): a model that "
            f"acts like the oracle is told it is wrong; check that row's ground truth")
    capped = [t for t in trajs if t.finish_reason == "max_turns"]
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
    if renderer is None:
        return
    for t in trajs:
        action = max((len(renderer.encode(turn.action)) for turn in t.turns), default=0)
        if action > rollout.max_tokens_per_turn:
            report.problems.append(
                f"an oracle turn of task {t.id!r} has {action} tokens, more than "
                f"rollout.max_tokens_per_turn={rollout.max_tokens_per_turn}: a model that "
                f"acts like the oracle is cut off (finish reason 'length')")
            break
        try:
            total = len(renderer.encode(renderer.render_text(t.messages, t.tools)))
        except Exception:  # the template cannot render this transcript: counted nowhere else
            continue
        if total > rollout.max_total_tokens:
            report.problems.append(
                f"the oracle's transcript of task {t.id!r} has about {total} tokens, more than "
                f"rollout.max_total_tokens={rollout.max_total_tokens}: a model that acts like "
                f"the oracle runs out of context; raise rollout.max_total_tokens")
            break
        if getattr(renderer, "per_turn", False):
            if _per_turn_overflow(t, renderer, report):
                break
        elif _response_overflow(t, renderer, total, rollout, report):
            break


def _response_overflow(t: Trajectory, renderer: Any, total: int, rollout: Any,
                       report: DryRunReport) -> bool:
    """What follows the first prompt (every turn and observation) has its own budget,
    ``rollout.max_response_len`` = max_total_tokens - max_prompt_tokens: a first prompt shorter
    than its budget does not lend the rest to the response."""
    first = next((i for i, m in enumerate(t.messages) if m.get("role") == "assistant"), None)
    if first is None:
        return False
    try:
        prompt = len(renderer.render_prompt(t.messages[:first], t.tools))
    except Exception:  # counted nowhere else: the template check reports it
        return False
    if total - prompt <= rollout.max_response_len:
        return False
    report.problems.append(
        f"the oracle's episode of task {t.id!r} has about {total - prompt} tokens after its "
        f"first prompt, more than the response's budget rollout.max_total_tokens - "
        f"rollout.max_prompt_tokens = {rollout.max_response_len}: a model that acts like the "
        f"oracle runs out of room before it ends (finish reason 'context'); raise "
        f"rollout.max_total_tokens")
    return True


def _per_turn_overflow(t: Trajectory, renderer: Any, report: DryRunReport) -> bool:
    """``per_turn`` prompts every turn with the template's rendering of the history: a later
    turn's prompt past the prompt budget ends the episode there (finish reason 'context')."""
    starts = [i for i, m in enumerate(t.messages) if m.get("role") == "assistant"]
    for k, i in enumerate(starts[1:], start=2):
        try:
            tokens = len(renderer.render_prompt(t.messages[:i], t.tools))
        except Exception:  # counted nowhere else: the template check reports it
            return False
        if tokens > report.max_prompt_tokens:
            report.problems.append(
                f"rollout.history_policy=per_turn prompts each turn with the rendered history: "
                f"turn {k} of the oracle's episode of task {t.id!r} has a {tokens}-token "
                f"prompt, more than rollout.max_prompt_tokens={report.max_prompt_tokens}, so "
                f"every such episode ends before that turn (finish reason 'context'); raise "
                f"rollout.max_prompt_tokens")
            return True
    return False


def _check_episodes(report: DryRunReport) -> None:
    """Env exceptions, reward exceptions, and a reward that does not tell good from bad."""
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
    if oracle is not None and bad:
        best = max(bad, key=lambda s: s.reward_total)
        if oracle.reward_total <= best.reward_total:
            report.problems.append(
                f"the configured reward pays the oracle {oracle.reward_total:.3f} on average "
                f"and the {best.policy} policy {best.reward_total:.3f}: it does not tell a "
                f"correct episode from a bad one; check the reward section")


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

