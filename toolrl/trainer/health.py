"""Every training step checks its own health: a run that learns nothing says so, at once.

`HealthMonitor.check` reads a step's trajectories and the reward failures of its scoring:

- it prints one console line per kind of failure, counted: ``step 3: 5 of 64 episodes failed
  in acme/Shop-v0: step: ValueError: ... (at shop.py:42 in evaluate)``, and ``step 3: reward
  'exact' failed on 64 of 64 samples: TypeError: ...``, so env and reward exceptions reach
  the driver's console, not only a worker's log;
- it measures the shares that make a step worthless (``health/*`` metrics): episodes that
  ended with an error, that sampled no token, that the context limit ended, and samples a
  reward failed on;
- above ``trainer.health``'s thresholds, `HealthMonitor.act` stops the run with
  `UnhealthyRun` (one message: what happened, which key to change), or only warns with
  ``trainer.health.on_unhealthy=warn``.

Episodes the infrastructure failed (`Trajectory.infra_failure`: a tool server down, an env
that raised or timed out, a crashed episode loop) are not this check's: they never train, and
``trainer.infra_failures.max_fraction`` (`toolrl.trainer.failures.settle`) counts them on the
batch as generated and stops the run when too many fail. Here they are printed (counted, as
such) but left out of every share, which is taken over the episodes that train: so no episode
counts against both thresholds, and neither threshold hides the other. What the health check
counts as an error is what would train as a failure: a chat template that fails, an
observation the tokenizer rejects, a turn that produced no token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from toolrl.core.trajectory import Trajectory

__all__ = ["HealthConfig", "HealthMonitor", "HealthReport", "UnhealthyRun"]


@dataclass
class HealthConfig:
    """Per-step health checks (``trainer.health``); a share above its threshold is
    unhealthy (1.0 turns a check off)."""

    on_unhealthy: Literal["stop", "warn"] = "stop"  # an unhealthy step stops the run, or warns
    # episodes that ended with an error that is not an infrastructure failure (template,
    # observation, empty turn), among those that train; those are trainer.infra_failures
    max_error_fraction: float = 0.2
    max_no_token_fraction: float = 0.5  # episodes that sampled no token
    max_context_fraction: float = 0.9  # episodes the context limit ended
    max_reward_error_fraction: float = 0.5  # samples one reward component failed on

    def __post_init__(self) -> None:
        for name in ("max_error_fraction", "max_no_token_fraction", "max_context_fraction",
                     "max_reward_error_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"trainer.health.{name} must be within [0, 1], got {value}")


class UnhealthyRun(RuntimeError):
    """A step failed its health check with ``trainer.health.on_unhealthy=stop``."""


@dataclass
class HealthReport:
    """One step's health: the counted failure lines, the metrics, the problems (if any)."""

    step: int
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


class HealthMonitor:
    """Checks each step against a `HealthConfig`; prints through ``log`` (a console's)."""

    def __init__(self, config: HealthConfig, log: Any = print,
                 context_key: str = "rollout.max_total_tokens",
                 prompt_key: str = "rollout.max_prompt_tokens") -> None:
        self.config = config
        self.log = log
        self.context_key = context_key
        self.prompt_key = prompt_key

    def check(self, step: int, trajs: Sequence[Trajectory], envs: Sequence[str],
              reward_failures: Sequence[Any] = ()) -> HealthReport:
        """Count the step's failures, print them, and name what is unhealthy."""
        cfg = self.config
        report = HealthReport(step)
        infra = [i for i, t in enumerate(trajs) if t.infra_failure is not None]
        trains = [i for i, t in enumerate(trajs) if t.infra_failure is None]
        for (env, kind, error), idx in _group(trajs, envs, infra).items():
            report.notes.append(f"step {step}: {len(idx)} of {len(trajs)} episodes failed for "
                                f"infrastructure reasons ({kind}) in {env}: {error}; kept out "
                                f"of training (trainer.infra_failures)")
        n = len(trains)
        if not n:
            for note in report.notes:
                self.log(note)
            return report
        errored = [i for i in trains if trajs[i].finish_reason == "error"]
        no_tokens = [i for i in trains if trajs[i].sampled_tokens == 0]
        context = [i for i in trains if trajs[i].finish_reason == "context"]
        report.metrics = {"health/error_episodes": len(errored) / n,
                          "health/no_token_episodes": len(no_tokens) / n,
                          "health/context_episodes": len(context) / n,
                          "health/reward_failures": float(len(reward_failures))}
        groups: dict[tuple[str, str], list[int]] = {}
        for i in errored:
            groups.setdefault((envs[i], _first_line(trajs[i].error or "unknown error")),
                              []).append(i)
        for (env, error), idx in groups.items():
            report.notes.append(f"step {step}: {len(idx)} of {n} episodes failed in {env}: "
                                f"{error}")
        by_reward: dict[str, list[Any]] = {}
        for failure in reward_failures:
            by_reward.setdefault(failure.reward, []).append(failure)
        for name, failures in by_reward.items():
            report.notes.append(f"step {step}: reward {name!r} failed on {len(failures)} of "
                                f"{n} samples (scored with its fallback): "
                                f"{_first_line(failures[0].message)}")
        if len(errored) / n > cfg.max_error_fraction:
            worst = max(groups.items(), key=lambda kv: len(kv[1]))
            report.problems.append(
                f"step {step}: {len(errored)} of {n} episodes ended with an error (most in "
                f"{worst[0][0]}: {worst[0][1]}); fix the env (`toolrl check-env "
                f"{worst[0][0]}`), or raise trainer.health.max_error_fraction "
                f"({cfg.max_error_fraction})")
        if len(no_tokens) / n > cfg.max_no_token_fraction and len(no_tokens) > len(errored):
            report.problems.append(
                f"step {step}: {len(no_tokens)} of {n} episodes sampled no token (finish "
                f"reasons: {_reasons([trajs[i] for i in no_tokens])}), so the step trains on "
                f"nothing; raise {self.prompt_key} and {self.context_key} so the prompt leaves "
                f"room to answer, or raise trainer.health.max_no_token_fraction "
                f"({cfg.max_no_token_fraction})")
        if len(context) / n > cfg.max_context_fraction:
            per_turn = [i for i in context if (trajs[i].error or "").startswith("per_turn:")]
            key = self.prompt_key if len(per_turn) * 2 > len(context) else self.context_key
            why = f" ({_first_line(trajs[per_turn[0]].error)})" if key == self.prompt_key else ""
            report.problems.append(
                f"step {step}: the context limit ended {len(context)} of {n} episodes{why}; "
                f"raise {key} (or lower rollout.max_turns, or shorten the env's "
                f"observations), or raise trainer.health.max_context_fraction "
                f"({cfg.max_context_fraction})")
        for name, failures in by_reward.items():
            if len(failures) / n > cfg.max_reward_error_fraction:
                report.problems.append(
                    f"step {step}: reward {name!r} failed on {len(failures)} of {n} samples "
                    f"({_first_line(failures[0].message)}), each scored with its fallback; "
                    f"fix the reward or its kwargs, or raise "
                    f"trainer.health.max_reward_error_fraction "
                    f"({cfg.max_reward_error_fraction})")
        for note in report.notes:
            self.log(note)
        return report

    def act(self, report: HealthReport) -> None:
        """Stop (raise `UnhealthyRun` with the first problem) or warn, as configured."""
        if report.ok:
            return
        if self.config.on_unhealthy == "stop":
            more = f" (and {len(report.problems) - 1} more problem(s) above)" \
                if len(report.problems) > 1 else ""
            for problem in report.problems[1:]:
                self.log(problem)
            raise UnhealthyRun(report.problems[0] + more)
        for problem in report.problems:
            self.log(f"warning: {problem} (trainer.health.on_unhealthy=warn: going on)")


def _group(trajs: Sequence[Trajectory], envs: Sequence[str], indices: Sequence[int]
           ) -> dict[tuple[str, str, str], list[int]]:
    """``indices`` grouped by env, infrastructure-failure kind and first line of the error."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i in indices:
        t = trajs[i]
        error = t.error or next((f"{e.get('tool')}: {e.get('message')}" for e in t.errors
                                 if e.get("infra")), "unknown error")
        groups.setdefault((envs[i], str(t.infra_failure), _first_line(error)), []).append(i)
    return groups


def _first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _reasons(trajs: Sequence[Trajectory]) -> str:
    counts: dict[str, int] = {}
    for t in trajs:
        counts[t.finish_reason] = counts.get(t.finish_reason, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
