"""``toolrl check-env``: gymnasium's ``check_env`` plus the checks a tool env needs.

- ``gymnasium``: ``gymnasium.utils.env_checker.check_env`` on the unwrapped env; its warnings
  count as failures.
- ``tool schemas``: every tool is an OpenAI function schema with a valid JSON Schema for its
  parameters that survives a JSON round trip; names are unique and well-formed.
- ``tool docs``: every tool has a description and every parameter a type (a tool written
  without type hints or a docstring gives the model nothing to go on); parameters without a
  description are listed.
- ``evaluate``: ``evaluate`` does not raise on the oracle's episode (if it did, every episode
  of a run would end in an error).
- ``scripted policy``: the env's oracle reaches ``success`` with no error observations and ends
  the episode itself (``terminated``, not cut at ``max_turns``), within ``max_turns`` turns when
  a rollout's cap is given.
- ``prompt budget`` (with a token counter): the first prompts of a few tasks, tools included,
  fit ``max_prompt_tokens``.
- ``call round trip``: every oracle message parses, renders and parses back to the same calls.
- ``seeded determinism``: two fresh envs given the same seed play identical episodes.
- ``episode isolation``: an env reused after another episode, and two envs run concurrently,
  give the same episodes as fresh envs run alone (no state leaks).
"""

from __future__ import annotations

import asyncio
import json
import re
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from gymnasium.utils.env_checker import check_env

from toolrl.core.env import run_episode
from toolrl.core.registration import ensure_registered, env_ids, make_env
from toolrl.core.trajectory import Trajectory
from toolrl.registry import RegistryError

__all__ = ["CheckReport", "CheckResult", "check_tool_env", "describe_exception"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class CheckReport:
    env_id: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    def __str__(self) -> str:
        lines = [f"check-env {self.env_id}: {'PASS' if self.ok else 'FAIL'}"]
        lines += [f"  [{'ok' if r.ok else 'FAIL'}] {r.name}" + (f": {r.detail}" if r.detail
                                                               else "") for r in self.results]
        return "\n".join(lines)


def _fingerprint(ep: Trajectory) -> dict[str, Any]:
    """What must be identical between two plays of one episode (timings excluded)."""
    return {"messages": ep.messages, "rewards": [t.env_reward for t in ep.turns],
            "success": ep.success, "state": ep.final_state, "finish": ep.finish_reason,
            "errors": [t.errors for t in ep.turns]}


def _check_gymnasium(env_id: str, kwargs: dict[str, Any]) -> CheckResult:
    env = make_env(env_id, **kwargs)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)
        notes = [str(w.message) for w in caught
                 if not issubclass(w.category, (DeprecationWarning, ResourceWarning))]
        if notes:
            return CheckResult("gymnasium check_env", False, "; ".join(notes)[:500])
        return CheckResult("gymnasium check_env", True)
    finally:
        env.close()


def _check_schemas(tools: list[dict[str, Any]]) -> CheckResult:
    names = []
    for schema in tools:
        fn = schema.get("function") if schema.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return CheckResult("tool schemas", False, f"not an OpenAI function schema: {schema}")
        if not _NAME.match(fn["name"]):
            return CheckResult("tool schemas", False, f"bad tool name {fn['name']!r}")
        names.append(fn["name"])
        if json.loads(json.dumps(schema)) != schema:
            return CheckResult("tool schemas", False, f"{fn['name']}: not JSON round-trippable")
        params = fn.get("parameters", {})
        try:
            jsonschema.validators.validator_for(params).check_schema(params)
        except jsonschema.SchemaError as exc:
            return CheckResult("tool schemas", False, f"{fn['name']}: {exc.message}")
        if params.get("type") != "object":
            return CheckResult("tool schemas", False, f"{fn['name']}: parameters must be an "
                                                      f"object schema")
    if len(set(names)) != len(names):
        return CheckResult("tool schemas", False, f"duplicate tool names: {names}")
    return CheckResult("tool schemas", True, f"{len(names)} tools")


_TYPED = ("type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref")


def _check_tool_docs(tools: list[dict[str, Any]]) -> CheckResult:
    problems, undescribed = [], []
    for schema in tools:
        fn = schema["function"]
        if not str(fn.get("description") or "").strip():
            problems.append(f"{fn['name']} has no description (a docstring)")
        for param, spec in (fn.get("parameters") or {}).get("properties", {}).items():
            if not isinstance(spec, dict) or not any(k in spec for k in _TYPED):
                problems.append(f"{fn['name']}({param}) has no type (a type hint)")
            elif not str(spec.get("description") or "").strip():
                undescribed.append(f"{fn['name']}({param})")
    if problems:
        return CheckResult("tool docs", False, "; ".join(problems) + ": the model sees only "
                           "the schema; write type hints and a Google-style docstring")
    return CheckResult("tool docs", True, f"parameters without a description: "
                       f"{', '.join(undescribed)}" if undescribed else "")


def _check_prompts(env: Any, rows: list[Any],
                   count_tokens: Callable[[list[dict[str, Any]], list[dict[str, Any]]], int],
                   max_prompt_tokens: int) -> CheckResult:
    counts = []
    for row in rows:
        messages, info = env.reset(seed=0, options=row)
        counts.append(count_tokens(messages, info["tools"]))
    over = [c for c in counts if c > max_prompt_tokens]
    longest = max(counts)
    if over:
        return CheckResult("prompt budget", False,
                           f"{len(over)} of {len(counts)} task prompts (tools included) exceed "
                           f"max_prompt_tokens={max_prompt_tokens} (longest {longest}): those "
                           f"episodes would end before the model says a word; raise "
                           f"rollout.max_prompt_tokens or shorten the prompt and tool docs")
    return CheckResult("prompt budget", True, f"longest of {len(counts)} prompts: {longest} of "
                       f"{max_prompt_tokens} tokens")


def describe_exception(exc: BaseException) -> str:
    """``Type: message (at file:line in function)``: the exception and its innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in " \
            f"{frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _raised_in_evaluate(exc: BaseException) -> bool:
    return any(f.name in ("evaluate", "aevaluate")
               for f in traceback.extract_tb(exc.__traceback__))


def _check_round_trip(env: Any, ep: Trajectory) -> CheckResult:
    parser = env.unwrapped.parser
    for message in ep.messages:
        if message["role"] != "assistant":
            continue
        first = parser.parse(message["content"])
        again = parser.parse(parser.render(first.calls, first.text))
        if [c.to_dict() for c in again.calls] != [c.to_dict() for c in first.calls] or \
                again.text != first.text or first.errors or again.errors:
            return CheckResult("call round trip", False,
                               f"{message['content'][:120]!r} does not round-trip")
    return CheckResult("call round trip", True)


def _run(check: Callable[[], CheckResult], name: str) -> CheckResult:
    try:
        return check()
    except Exception as exc:  # a crashing check is a failed check, reported with its cause
        return CheckResult(name, False, f"{type(exc).__name__}: {exc}")


def check_tool_env(env_id: str, *, seed: int = 0,
                   env_kwargs: dict[str, Any] | None = None, max_turns: int | None = None,
                   count_tokens: Callable[[list[dict[str, Any]], list[dict[str, Any]]], int]
                   | None = None, max_prompt_tokens: int | None = None) -> CheckReport:
    """Run every check on ``env_id``; never raises for a failing env (see the report).

    ``max_turns``: the rollout's turn cap the oracle must end within; ``count_tokens(messages,
    tools)`` with ``max_prompt_tokens``: the prompt budget check (skipped without them)."""
    kwargs = dict(env_kwargs or {})
    report = CheckReport(env_id)
    try:
        ensure_registered(env_id)
    except RegistryError as exc:
        report.results.append(CheckResult("registered", False, str(exc)))
        return report
    report.results.append(_run(lambda: _check_gymnasium(env_id, kwargs), "gymnasium check_env"))

    def play(env: Any, **options: Any) -> Trajectory:
        return asyncio.run(run_episode(env, **options))

    def episodes() -> list[CheckResult]:
        envs = [make_env(env_id, **kwargs) for _ in range(3)]
        try:
            a, b, c = envs
            _, info = a.reset(seed=seed)
            out = [_check_schemas(info["tools"])]
            out.append(_run(lambda: _check_tool_docs(info["tools"]), "tool docs"))
            if count_tokens is not None and max_prompt_tokens is not None:
                try:
                    rows: list[Any] = a.unwrapped.make_tasks(8, seed=seed)
                except TypeError:  # no task generator: the prompt of a bare reset
                    rows = [None]
                out.append(_run(lambda: _check_prompts(a, rows, count_tokens,
                                                       max_prompt_tokens), "prompt budget"))
            try:
                first = play(a, seed=seed)
            except Exception as exc:
                if _raised_in_evaluate(exc):
                    out.append(CheckResult("evaluate", False, f"evaluate() raised on the "
                                           f"oracle's episode: {describe_exception(exc)}; "
                                           f"every episode of a run would end in an error"))
                out.append(CheckResult("scripted policy", False,
                                       f"the oracle's episode raised {describe_exception(exc)}"))
                return out
            out.append(CheckResult("evaluate", True))
            problems = []
            if not first.success or first.errors:
                problems.append(f"success={first.success}, errors={first.errors[:3]}")
            if first.finish_reason != "terminated":
                problems.append(f"the episode did not end by itself: the env cut it after "
                                f"{len(first.turns)} turns (its max_turns); on_turn must return "
                                f"Turn(terminated=True) once the task is done")
            elif max_turns is not None and len(first.turns) > max_turns:
                problems.append(f"the oracle needs {len(first.turns)} turns, more than the "
                                f"rollout's max_turns={max_turns}")
            out.append(CheckResult("scripted policy", not problems, "; ".join(problems)))
            out.append(_check_round_trip(a, first))
            same = play(b, seed=seed)
            out.append(CheckResult("seeded determinism",
                                   _fingerprint(same) == _fingerprint(first),
                                   "" if _fingerprint(same) == _fingerprint(first) else
                                   "two envs with the same seed played different episodes"))
            rows = a.unwrapped.make_tasks(2, seed=seed + 1)
            reused = [play(a, row=rows[0]), play(a, row=rows[1])]
            fresh = play(b, row=rows[1])

            async def both() -> list[Trajectory]:
                return list(await asyncio.gather(run_episode(c, row=rows[0]),
                                                 run_episode(b, row=rows[1])))

            concurrent = asyncio.run(both())
            leaks = []
            if _fingerprint(reused[1]) != _fingerprint(fresh):
                leaks.append("a reused env differs from a fresh one")
            if [_fingerprint(e) for e in concurrent] != [_fingerprint(e) for e in reused]:
                leaks.append("concurrent episodes differ from sequential ones")
            out.append(CheckResult("episode isolation", not leaks, "; ".join(leaks)))
            return out
        finally:
            for env in envs:
                env.close()

    try:
        report.results.extend(episodes())
    except Exception as exc:  # e.g. the env cannot be made or reset: one failed check
        report.results.append(CheckResult("episodes", False, f"{type(exc).__name__}: {exc}"))
    return report


def describe_envs() -> list[tuple[str, str]]:
    """``(env id, its tools)`` for every registered env (tools of a ``reset(seed=0)``)."""
    rows = []
    for env_id in env_ids():
        try:
            env = make_env(env_id)
            try:
                _, info = env.reset(seed=0)
                names = [t["function"]["name"] for t in info["tools"]]
                note = " (per task)" if getattr(env.unwrapped, "per_task_tools", False) else ""
                rows.append((env_id, ", ".join(names) + note))
            finally:
                env.close()
        except Exception as exc:  # listing must go on: show why this env cannot be made
            rows.append((env_id, f"<cannot make: {type(exc).__name__}: {exc}>"))
    return rows
