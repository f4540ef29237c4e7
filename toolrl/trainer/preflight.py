"""Pre-flight checks: every mistake an experiment can show before a directory is written or a
worker starts, each one `ConfigError` whose one line names the key path and the valid choices.
What the schema says (keys, types, values, the rules between keys, local model paths) is
`toolrl.trainer.config.validate`'s, checked once when the config loads; pre-flight checks what
only the code, the files and the machine can tell.

- `check_config`: the env ids (``env.id``, ``data.mixture[i].env``, ``env_rewards`` keys), the
  kwargs each env takes (``env.kwargs``, ``data.task_kwargs``, ``warm_start.env_kwargs`` /
  ``task_kwargs``, ``data.mixture[i].env_kwargs`` / ``task_kwargs``) against its constructor's
  and ``make_tasks``' signatures, and the reward sets (``reward``, ``env_rewards[...]``): their
  ids, and kwargs against each reward's signature and type annotations; the task files; then
  (`check_loop`) the trackers, the episode runner and the checkpoint to resume from; the
  devices; the model (`check_model`: a hub id answers or is cached, `resolve_model`).
- `check_rows`: the env (and ``env_kwargs``) that task rows from files name.
- `check_task_rows` (what train, eval and the dry run call; `fit_prompt_budget` loads the
  tokenizer for it): every row through `toolrl.data.check_rows` (tools, gold answers), then its
  first prompt rendered with its tools by the model's chat template (`prompt_lengths`) and
  counted against ``rollout.max_prompt_tokens`` (`apply_prompt_budget`); over-long rows refuse
  the run, or are dropped with ``data.overlong_prompts=filter``. A chat template that drops
  ``tools`` refuses it first (`check_template_tools`).

How kwargs are matched: the named parameters of ``__init__`` (and of ``make_tasks``, without
``n``, ``seed``, ``split``); a ``**kwargs`` is taken to forward to the parent class's method, so
the parent's names count too, up to `ToolEnv`, which takes no more. A kwarg whose parameter is
annotated must validate against the annotation (pydantic's rules, except that no string or
bool is turned into a number). The functions are public so that a dry run or ``check-env`` can
reuse them.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from pydantic import TypeAdapter, ValidationError

from toolrl.core.env import ToolEnv
from toolrl.core.registration import env_entry_point, make_env, row_env
from toolrl.data.check import check_rows as check_row_data  # not this module's check_rows
from toolrl.registry import RegistryError
from toolrl.reward import RewardSection, get_reward_spec
from toolrl.rollout.chat import ChatRenderer, TemplateError, drops_tools, drops_tools_message
from toolrl.rollout.worker import resolve_runner
from toolrl.trainer.checkpoint import COMPLETE
from toolrl.trainer.config import ConfigError, ExperimentConfig, resolve_model
from toolrl.trainer.tracking import TRACKERS

__all__ = [
    "PromptBudget",
    "accepted_kwargs",
    "apply_prompt_budget",
    "budget_key",
    "check_config",
    "check_devices",
    "check_env_kwargs",
    "check_history",
    "check_kwargs",
    "check_loop",
    "check_reward_section",
    "check_rows",
    "check_task_files",
    "check_task_kwargs",
    "check_task_rows",
    "check_template_tools",
    "env_creator",
    "fit_prompt_budget",
    "has_generator",
    "prompt_lengths",
    "type_problem",
]

Row = dict[str, Any]
_TASK_ARGS = ("n", "seed", "split")  # what the trainer passes make_tasks itself
_MAKE_KWARGS = ("max_episode_steps", "disable_env_checker", "observation_budget", "tokenizer")
"""Keywords `toolrl.make_env` (and ``gymnasium.make`` under it) take for themselves."""


# --- envs ------------------------------------------------------------------------------------
def env_creator(env_id: str, key: str) -> Any:
    """The class (or factory) registered as ``env_id``, without making an env; an unknown id
    is a `ConfigError` naming ``key`` and the known ids."""
    try:
        return env_entry_point(env_id)
    except RegistryError as exc:
        raise ConfigError(f"{key}={env_id!r}: {exc}") from None
    except Exception as exc:  # a registered entry point that does not import
        raise ConfigError(f"{key}={env_id!r}: its entry point cannot be loaded: "
                          f"{type(exc).__name__}: {_first_line(exc)}") from None


def accepted_kwargs(creator: Any, method: str = "__init__", skip: Sequence[str] = ()
                    ) -> dict[str, inspect.Parameter] | None:
    """``name -> Parameter`` that ``creator``'s ``method`` accepts as keywords, following
    ``**kwargs`` up the class hierarchy (see the module docstring); None when a ``**kwargs``
    leads nowhere (anything is accepted)."""
    if not inspect.isclass(creator):
        funcs = [creator] if method == "__init__" else [getattr(creator, method, None)]
        if funcs[0] is None:
            return {}
    else:
        funcs = []
        for klass in creator.__mro__:
            if klass is object or (method != "__init__" and klass is ToolEnv):
                break
            raw = vars(klass).get(method)
            if raw is not None:
                funcs.append(getattr(raw, "__func__", raw))
    params: dict[str, inspect.Parameter] = {}
    for fn in funcs:
        try:
            sig = inspect.signature(fn)
            hints = _hints(fn)
        except (TypeError, ValueError):
            return None
        open_ = False
        for i, p in enumerate(sig.parameters.values()):
            if p.kind is p.VAR_KEYWORD:
                open_ = True
            elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in params \
                    and p.name not in skip and not (i == 0 and inspect.isclass(creator)):
                params[p.name] = p.replace(annotation=hints.get(p.name, p.annotation))
        if not open_:
            return params
    if not funcs or (inspect.isclass(creator) and (method != "__init__" or
                                                   issubclass(creator, ToolEnv))):
        return params  # the chain ended at ToolEnv: nothing more is accepted
    return None


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations are not checked
        return {}


def check_kwargs(params: Mapping[str, inspect.Parameter] | None, kwargs: Mapping[str, Any],
                 key: str, owner: str) -> None:
    """Each of ``kwargs`` must be a parameter in ``params`` (None: any name) and fit its
    annotation; otherwise a `ConfigError` naming ``key.<kwarg>`` and the valid names."""
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"{key} must be a mapping of keyword arguments, got {kwargs!r}")
    for name, value in kwargs.items():
        if params is None:
            continue
        if name not in params:
            valid = ", ".join(_describe(p) for p in params.values()) or "(none)"
            raise ConfigError(f"{key}.{name}: {owner} takes no argument {name!r}; "
                              f"valid: {valid}")
        problem = type_problem(params[name].annotation, value)
        if problem:
            raise ConfigError(f"{key}.{name}={value!r}: {owner} wants "
                              f"{_type_name(params[name].annotation)} ({problem})")


def _describe(p: inspect.Parameter) -> str:
    return p.name + ("" if p.default is p.empty else f"={p.default!r}")


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) if isinstance(annotation, type) \
        else str(annotation).replace("typing.", "")


def type_problem(annotation: Any, value: Any) -> str | None:
    """Why ``value`` does not fit ``annotation`` (None: it fits, or nothing can be said)."""
    if annotation is inspect.Parameter.empty or annotation is Any or isinstance(annotation, str):
        return None
    try:
        adapter = TypeAdapter(annotation)
    except Exception:  # an annotation pydantic cannot read: not checked
        return None
    try:
        adapter.validate_python(value, strict=True)
        return None
    except ValidationError:
        pass
    except Exception:
        return None
    try:
        out = adapter.validate_python(value)
    except ValidationError as exc:
        return exc.errors()[0]["msg"]
    except Exception:
        return None
    if _coerced(value, out):
        return f"got {type(value).__name__}"
    return None


def _coerced(value: Any, out: Any) -> bool:
    """A string or bool turned into a number (or a number into a bool), at any depth."""
    if isinstance(out, (bool, int, float)) and (
            isinstance(value, str) or isinstance(value, bool) != isinstance(out, bool)):
        return True
    if isinstance(value, Mapping) and isinstance(out, Mapping):
        return any(_coerced(value[k], out[k]) for k in value if k in out)
    if isinstance(value, (list, tuple)) and isinstance(out, (list, tuple)) and \
            len(value) == len(out):
        return any(_coerced(a, b) for a, b in zip(value, out, strict=True))
    return False


def check_env_kwargs(env_id: str, kwargs: Mapping[str, Any], key: str,
                     env_key: str = "env.id") -> Any:
    """``kwargs`` for ``make_env(env_id, ...)`` (``key``); returns the env's class."""
    creator = env_creator(env_id, env_key)
    params = accepted_kwargs(creator)
    if params is not None:
        params = {**params, **{k: inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY)
                               for k in _MAKE_KWARGS}}
    check_kwargs(params, kwargs, key, f"{env_id}'s constructor")
    return creator


def check_task_kwargs(env_id: str, creator: Any, kwargs: Mapping[str, Any], key: str) -> None:
    """``kwargs`` for ``make_tasks`` of ``env_id`` (``key``); the env must have a generator."""
    if not has_generator(creator):
        raise ConfigError(f"{key}: {env_id} has no task generator (make_tasks); give task "
                          f"files instead (data.train_file and data.val_file)")
    check_kwargs(accepted_kwargs(creator, "make_tasks", skip=_TASK_ARGS), kwargs, key,
                 f"{env_id}'s make_tasks")


def has_generator(creator: Any) -> bool:
    """Whether the env class overrides `ToolEnv.make_tasks`."""
    fn = getattr(creator, "make_tasks", None)
    return fn is not None and getattr(fn, "__func__", fn) is not ToolEnv.make_tasks.__func__


# --- rewards ---------------------------------------------------------------------------------
def check_reward_section(section: RewardSection, key: str) -> None:
    """A reward set's components (``key``: where it sits) name registered rewards, with kwargs
    they take, of the types they annotate (its keys and values are the schema's, checked by
    `validate`)."""
    for i, c in enumerate(section.rewards):
        where = f"{key}.rewards[{i}]"
        try:
            spec = get_reward_spec(c.name)
        except RegistryError as exc:
            raise ConfigError(f"{where}.name={c.name!r}: {exc}") from None
        target = spec.target
        params = accepted_kwargs(target, skip=() if inspect.isclass(target) else
                                 _first_param(target))
        check_kwargs(params, c.kwargs, f"{where}.kwargs", f"reward {c.name!r}")


def _first_param(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The trajectory parameter of a reward function (not a kwarg)."""
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
    except (TypeError, ValueError):
        return ()
    return (first.name,) if first is not None else ()


# --- the whole config ------------------------------------------------------------------------
def check_config(cfg: ExperimentConfig) -> None:
    """Everything of ``cfg`` that names code or files: env ids and their kwargs, task generators
    and their kwargs, task files, reward ids and their kwargs. Raises `ConfigError` (one
    line)."""
    data, ws = cfg.data, cfg.warm_start
    files = bool(data.train_file and data.val_file)
    creator = check_env_kwargs(cfg.env.id, cfg.env.kwargs, "env.kwargs")
    if not files or data.task_kwargs:
        check_task_kwargs(cfg.env.id, creator, data.task_kwargs, "data.task_kwargs")
    if ws.enabled:
        check_env_kwargs(cfg.env.id, {**cfg.env.kwargs, **ws.env_kwargs},
                         "warm_start.env_kwargs")
        check_task_kwargs(cfg.env.id, creator, ws.task_kwargs or data.task_kwargs,
                          "warm_start.task_kwargs" if ws.task_kwargs else "data.task_kwargs")
    for i, source in enumerate(data.mixture):
        where = f"data.mixture[{i}]"
        mixed = check_env_kwargs(source.env, source.env_kwargs, f"{where}.env_kwargs",
                                 f"{where}.env")
        if not (source.train_file and source.val_file) or source.task_kwargs:
            check_task_kwargs(source.env, mixed, source.task_kwargs, f"{where}.task_kwargs")
    check_task_files(cfg)
    check_reward_section(cfg.reward, "reward")
    for env_id, section in cfg.env_rewards.items():
        env_creator(env_id, "env_rewards key")
        check_reward_section(section, f"env_rewards[{env_id!r}]")
    check_loop(cfg)
    check_devices(cfg)
    check_model(cfg)


def check_task_files(cfg: ExperimentConfig) -> None:
    """Every task file the config names exists; a `ConfigError` naming the key otherwise."""
    keys = [("data.train_file", cfg.data.train_file), ("data.val_file", cfg.data.val_file),
            ("warm_start.train_file", cfg.warm_start.train_file if cfg.warm_start.enabled
             else None),
            ("warm_start.val_file", cfg.warm_start.val_file if cfg.warm_start.enabled else None)]
    for i, source in enumerate(cfg.data.mixture):
        keys += [(f"data.mixture[{i}].train_file", source.train_file),
                 (f"data.mixture[{i}].val_file", source.val_file)]
    for key, path in keys:
        if path and not Path(path).expanduser().exists():
            raise ConfigError(f"{key}={path!r}: the task file does not exist (convert your data "
                              f"with `toolrl data convert`, or set {key} to an existing .jsonl, "
                              f".json or .parquet file)")


def check_devices(cfg: ExperimentConfig) -> None:
    """A config that asks for GPUs on a machine without any (and no Ray cluster to run on) is
    a `ConfigError` that says so and names the overrides that run it on CPU."""
    if cfg.resources.ray_address or os.environ.get("RAY_ADDRESS"):
        return  # the cluster's nodes, not this machine, have the devices
    asks = []
    if cfg.resources.device == "cuda":
        asks.append("resources.device=cuda")
    if cfg.rollout.engine.backend == "gpu":
        asks.append("rollout.engine.backend=gpu")
    if not asks:
        return
    if torch.cuda.is_available():
        return
    cpu = ["resources.device=cpu", "rollout.engine.backend=cpu"]
    if cfg.resources.processes_per_node > 1:
        cpu.append("resources.processes_per_node=1")
    if (cfg.rollout.engine.gpu_memory_utilization or 0) > 0.1:  # vLLM CPU reads it of RAM
        cpu.append("rollout.engine.gpu_memory_utilization=0.1")
    if cfg.actor.param_dtype not in (None, "auto"):
        cpu.append("actor.param_dtype=null")
    raise ConfigError(f"the config asks for GPUs ({', '.join(asks)}) and this machine has none "
                      f"(torch sees no CUDA device); to run it on CPU add the overrides "
                      f"{' '.join(cpu)} (and a model small enough for CPU), or run it on a GPU "
                      f"machine or a Ray cluster with GPUs (resources.ray_address)")


def check_model(cfg: ExperimentConfig) -> str:
    """``model.path`` (and ``rollout.engine.tokenizer``) can be loaded (`resolve_model`, which
    now may ask the hub): a local folder, one the run builds, a cached hub id or a reachable
    hub. Returns where the model loads from; one `ConfigError` line naming the key otherwise,
    in seconds, never after hub retries."""
    resolve_model(cfg, "rollout.engine.tokenizer")
    path = resolve_model(cfg)
    assert path is not None
    return path


def check_loop(cfg: ExperimentConfig) -> None:
    """What the loop names: trackers, the episode runner, the checkpoint to resume from."""
    for i, name in enumerate(cfg.trainer.trackers):
        try:
            TRACKERS.get(name)
        except RegistryError as exc:
            raise ConfigError(f"trainer.trackers[{i}]={name!r}: {exc}") from None
    if cfg.rollout.runner is not None:
        try:
            resolve_runner(cfg.rollout.runner)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"rollout.runner={cfg.rollout.runner!r}: "
                              f"{_first_line(exc)}") from None
    resume = cfg.trainer.resume
    if resume not in ("auto", "never") and not (Path(resume) / COMPLETE).exists():
        raise ConfigError(f"trainer.resume={resume!r} is not a complete checkpoint (no "
                          f"{COMPLETE} marker); choose auto, never or a checkpoint directory "
                          f"such as <run dir>/checkpoints/step_N")


def check_rows(rows: Iterable[Mapping[str, Any]], cfg: ExperimentConfig, where: str) -> None:
    """The env each row runs in (its ``env`` field, else ``env.id``) exists and takes the
    row's ``env_kwargs``; ``where`` names the rows' source (e.g. ``data.train_file``)."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for i, row in enumerate(rows):
        label = f"{where}: row {i} ({_row_id(row)})"
        try:
            env_id, kwargs = row_env(row, cfg.env.id, cfg.env.kwargs)
        except ValueError as exc:
            raise ConfigError(f"{label}: {exc}") from None
        key = (env_id, tuple(sorted(kwargs)))
        if key in seen:
            continue
        seen.add(key)
        check_env_kwargs(env_id, kwargs, f"{label} env_kwargs", f"{label} env")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def _row_id(row: Mapping[str, Any]) -> str:
    return f"id {row['id']!r}" if row.get("id") is not None else "no id"


# --- the prompt budget -----------------------------------------------------------------------
@dataclass
class PromptBudget:
    """What `apply_prompt_budget` did with one split's rows."""

    where: str  # the rows' source, e.g. "train rows (env's generator)"
    rows: int
    limit: int
    over: list[int]  # indices of rows over the limit
    longest: int  # tokens of the longest prompt
    longest_id: Any

    @property
    def dropped(self) -> int:
        return len(self.over)

    def summary(self) -> str:
        return (f"{self.where}: {self.rows} rows, longest first prompt {self.longest} tokens "
                f"(row {self.longest_id!r}); budget rollout.max_prompt_tokens={self.limit}")


def budget_key(cfg: ExperimentConfig) -> str:
    """How the prompt budget is set, for messages."""
    r = cfg.rollout
    if r.max_prompt_tokens is not None:
        return f"rollout.max_prompt_tokens={r.max_prompt_tokens}"
    return (f"rollout.max_prompt_tokens (unset: min(rollout.max_total_tokens // 2, 512) = "
            f"{r.max_prompt_len})")


def prompt_lengths(rows: Sequence[Mapping[str, Any]], cfg: ExperimentConfig, tokenizer: Any,
                   where: str, *, failures: list[tuple[int, str]] | None = None,
                   skip: Iterable[int] = ()) -> list[int | None]:
    """Tokens of each row's first prompt: its env's ``reset(options=row)`` messages and tools,
    rendered by ``tokenizer``'s chat template with the generation prompt (what the engine
    gets). One env per (env id, kwargs) is made and reset for every row, then closed.

    A row that cannot be rendered raises a `ConfigError`, or with ``failures`` is appended to
    it as ``(index, reason)`` and counted None; rows in ``skip`` are not rendered (None)."""
    renderer = ChatRenderer(tokenizer, check=False,
                            chat_template_kwargs=cfg.rollout.chat_template_kwargs,
                            family=cfg.rollout.family)
    envs: dict[str, Any] = {}
    seen: dict[str, int | str] = {}  # a row repeated (a split cycled) is rendered once
    lengths: list[int | None] = []
    skip = set(skip)
    try:
        for i, row in enumerate(rows):
            if i in skip:
                lengths.append(None)
                continue
            env_id, kwargs = row_env(row, cfg.env.id, cfg.env.kwargs)
            key = json.dumps([env_id, kwargs], sort_keys=True, default=str)
            same = json.dumps([key, row], sort_keys=True, default=str)
            if same not in seen:
                try:
                    if key not in envs:
                        envs[key] = make_env(env_id, **kwargs)
                    messages, info = envs[key].reset(seed=cfg.seed, options=dict(row))
                    seen[same] = len(renderer.render_prompt(messages, info.get("tools")))
                except Exception as exc:
                    seen[same] = f"cannot be rendered in {env_id}: {type(exc).__name__}: " \
                                 f"{_first_line(exc)}"
            if isinstance(seen[same], int):
                lengths.append(seen[same])
                continue
            if failures is None:
                raise ConfigError(f"{where}: row {i} ({_row_id(row)}) {seen[same]}")
            failures.append((i, str(seen[same])))
            lengths.append(None)
    finally:
        for env in envs.values():
            with contextlib.suppress(Exception):  # the lengths are known already
                env.close()
    return lengths


def apply_prompt_budget(rows: list[Row], lengths: Sequence[int], cfg: ExperimentConfig,
                        where: str) -> tuple[list[Row], PromptBudget]:
    """Rows whose first prompt fits ``rollout.max_prompt_len``: all of them, or (with
    ``data.overlong_prompts=filter``) those that fit. Refuses with the numbers otherwise, and
    when filtering leaves no row."""
    limit = cfg.rollout.max_prompt_len
    over = [i for i, n in enumerate(lengths) if n > limit]
    top = max(range(len(lengths)), key=lengths.__getitem__) if lengths else 0
    budget = PromptBudget(where, len(rows), limit, over, lengths[top] if lengths else 0,
                          rows[top].get("id") if rows else None)
    if not over:
        return rows, budget
    share = f"{len(over)} of {len(rows)} {where}"
    detail = (f"have a first prompt (messages and tool schemas, chat template applied) longer "
              f"than {budget_key(cfg)}: the longest has {budget.longest} tokens (row "
              f"{budget.longest_id!r}), and such an episode ends before sampling a token")
    if cfg.data.overlong_prompts != "filter":
        raise ConfigError(f"{share} {detail}. Raise rollout.max_prompt_tokens (within "
                          f"rollout.max_total_tokens={cfg.rollout.max_total_tokens}), shorten "
                          f"the prompts, or set data.overlong_prompts=filter to drop them")
    if len(over) == len(rows):
        raise ConfigError(f"{share} {detail}; data.overlong_prompts=filter would drop every "
                          f"row. Raise rollout.max_prompt_tokens")
    dropped = set(over)
    return [r for i, r in enumerate(rows) if i not in dropped], budget


def check_task_rows(train: list[Row], val: list[Row], cfg: ExperimentConfig,
                    tokenizer: Any | None, log: Callable[[str], Any] = print
                    ) -> tuple[list[Row], list[Row]]:
    """THE check of a run's task rows, which train, eval and the dry run all call: every row
    passes `toolrl.data.check_rows` (tools, duplicate names, schema types, gold answers) and
    renders in its env, and its first prompt fits the budget (`apply_prompt_budget`; with
    ``tokenizer`` None the prompts are not rendered). Returns the rows to run (over-budget
    ones dropped with ``data.overlong_prompts=filter``); one `ConfigError` lists every
    problem otherwise: per source of rows, the counts, then one line per offender."""
    if tokenizer is not None:
        check_template_tools(tokenizer, cfg)
        log(check_history(tokenizer, cfg).line())
    messages: list[str] = []
    out = []
    for rows, where in ((train, "train rows"), (val, "val rows")):
        if not rows:
            out.append(rows)
            continue
        report = check_row_data(rows, where, cfg.env.id)
        if report.notes:
            log(report.notes_summary())
        if tokenizer is not None:
            failures: list[tuple[int, str]] = []
            lengths = prompt_lengths(rows, cfg, tokenizer, where, failures=failures,
                                     skip={p.index for p in report.blocking})
            for i, reason in failures:
                report.add(i, rows[i], "prompt does not render", reason)
            report.problems.sort(key=lambda p: p.index)
        if not report.ok:
            messages.append(report.summary())
        if tokenizer is None:
            out.append(rows)
            continue
        try:
            kept, budget = apply_prompt_budget(rows, [n or 0 for n in lengths], cfg, where)
        except ConfigError as exc:
            messages.append(str(exc))
            continue
        if budget.dropped:
            log(f"data.overlong_prompts=filter: dropped {budget.dropped} of {budget.rows} "
                f"{where} whose first prompt exceeds {budget_key(cfg)} (longest "
                f"{budget.longest} tokens)")
        else:
            log(f"prompt budget: {budget.summary()}")
        out.append(kept)
    if messages:
        raise ConfigError("\n".join(messages))
    return out[0], out[1]


def check_history(tokenizer: Any, cfg: ExperimentConfig) -> Any:
    """The history policy the rollout will use with this tokenizer's template
    (`toolrl.rollout.history`): its `HistoryDecision` (whose ``line()`` names the policy and
    why); one `ConfigError` line when the asked-for policy cannot hold the template."""
    try:
        decision = ChatRenderer(
            tokenizer, chat_template_kwargs=cfg.rollout.chat_template_kwargs,
            family=cfg.rollout.family, history_policy=cfg.rollout.history_policy,
            allow_non_prefix_preserving=cfg.rollout.allow_non_prefix_preserving).history
    except TemplateError as exc:
        raise ConfigError(f"rollout.history_policy={cfg.rollout.history_policy}: {exc}"
                          ) from None
    if decision.per_turn and cfg.trainer.infra_failures.rule == "refill":
        raise ConfigError("the history policy is per_turn (an episode becomes one sample per "
                          "model turn), and trainer.infra_failures.rule=refill cannot put such "
                          "an episode in a failed one's rows; set trainer.infra_failures.rule="
                          "drop_sample or drop_group")
    return decision


def check_template_tools(tokenizer: Any, cfg: ExperimentConfig) -> None:
    """The chat template of the run's tokenizer renders ``tools``: one `ConfigError` line
    naming ``model.path`` (or ``rollout.engine.tokenizer``) when it drops them."""
    key, path = ("rollout.engine.tokenizer", cfg.rollout.engine.tokenizer) \
        if cfg.rollout.engine.tokenizer is not None else ("model.path", cfg.model.path)
    try:
        renderer = ChatRenderer(tokenizer, check=False,
                                chat_template_kwargs=cfg.rollout.chat_template_kwargs,
                                family=cfg.rollout.family)
        dropped = drops_tools(renderer)
    except TemplateError:
        return  # a template that cannot render at all is reported where prompts are rendered
    if dropped:
        raise ConfigError(drops_tools_message(key, str(path)))


def fit_prompt_budget(train: list[Row], val: list[Row], cfg: ExperimentConfig, model: str,
                      log: Callable[[str], Any] = print) -> tuple[list[Row], list[Row]]:
    """`check_task_rows` with ``model``'s tokenizer (what train and eval call)."""
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    except Exception as exc:  # the engine could not load it either
        raise ConfigError(f"model.path={model!r}: cannot load its tokenizer to count prompt "
                          f"tokens: {type(exc).__name__}: {_first_line(exc)}") from None
    return check_task_rows(train, val, cfg, tokenizer, log)
