"""The typed experiment schema: YAML files in configs/ map 1:1 onto these dataclasses.

`load_config(path, overrides)` merges a YAML file and ``key=value`` overrides onto the schema
with OmegaConf. An unknown key or a wrong type fails before any worker starts, with the key's
full path and the valid choices. The sections are then built deepest first (`_build`), so a
component config's own check (its ``__post_init__``) fails as a `ConfigError` naming its key
(`keyed`), and `validate` checks what the types cannot say: one validation pass, one line per
mistake, never a bare ValueError.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from toolrl.algo import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from toolrl.algo.kl import KLKind
from toolrl.core.families import FAMILIES
from toolrl.models.sizes import size_names
from toolrl.models.source import ModelNotFoundError, locate_model, require_model
from toolrl.reward import RewardConfigError, RewardEntry, RewardSection
from toolrl.reward.compose import as_section
from toolrl.rollout.worker import RolloutConfig
from toolrl.trainer.async_buffer import StalePolicy
from toolrl.trainer.failures import InfraFailureConfig
from toolrl.trainer.health import HealthConfig
from toolrl.trainer.progress import WatchdogConfig
from toolrl.trainer.tracking import redact, secret_values
from toolrl.workers.actor import ActorConfig
from toolrl.workers.critic import CriticConfig


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the valid choices."""


TINY_MODEL_PATH = "models/tiny"


@dataclass
class ModelConfig:
    """The policy to train: a local checkpoint directory or a hub id."""

    # a local folder or a hub id, told apart by one rule (toolrl.models.source): a path that
    # exists, is built, is written as a path (./, /, ~, two /) or whose first part is a local
    # folder is local; any other org/name is a hub id (hub cache, or a hub that answers)
    path: str = TINY_MODEL_PATH
    # build a model with random weights at `path` if absent; `path` is then always a local
    # folder, never a hub id (toolrl.models.source's rule). null (the default): true exactly
    # when `path` is toolrl's own `models/tiny` (a fresh clone has no models/ yet)
    build_tiny_if_missing: bool | None = None
    tiny_size: str = "small"  # what to build there: a tiny size or a real shape (qwen2.5-0.5b)
    # the tokenizer and chat template of that build: toolrl's tiny one, or a model family's
    # real one (toolrl.core.families, e.g. deepseek-r1-distill: its 152,064-token vocabulary)
    tiny_tokenizer: str = "tiny"
    # full: that tokenizer's whole vocabulary; task: only the tokens the task's texts use
    # (prompts, oracle and bad-policy turns, tool results), same pieces, checked against the
    # real tokenizer on every text the rollout encodes (toolrl.models.compact)
    tiny_vocab: Literal["full", "task"] = "full"


@dataclass
class EnvConfig:
    """The tool environment (a registered id) and keyword arguments for `make_env`."""

    id: str = "toolrl/Calculator-v0"  # a registered env id (`toolrl envs` lists them)
    kwargs: dict[str, Any] = field(default_factory=dict)  # the env's constructor arguments


@dataclass
class MixtureSource:
    """More task rows for one run, from another env: its file(s) or its own generator.

    Each row gets ``env`` (and ``env_kwargs``) unless it names its own, so one experiment can
    train on, e.g., FunctionCalling rows, Bank tasks and Calculator tasks at once.
    """

    env: str = ""  # a registered env id (required)
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # make_env kwargs of its rows
    train_file: str | None = None  # None: the env's generator
    val_file: str | None = None  # validation rows; None: the env's generator
    train_size: int = 1024  # generator rows (with no file)
    val_size: int = 32  # validation rows from the generator (with no val_file)
    task_kwargs: dict[str, Any] = field(default_factory=dict)  # the env's make_tasks kwargs


@dataclass
class DataConfig:
    """Where task rows come from: files, or the env's own seeded task generator.

    A row may name its own env (``env``, a registered id) and ``env_kwargs``; rows without one
    run in ``env.id`` with ``env.kwargs``. ``mixture`` adds rows of other envs.
    """

    train_file: str | None = None  # .json / .jsonl / .parquet; None: the env's generator
    val_file: str | None = None  # validation rows; None: the env's generator
    train_size: int = 4096  # rows drawn from the generator
    val_size: int = 128  # validation rows drawn from the generator (with no val_file)
    task_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {difficulty: 1}
    batch_size: int = 8  # tasks per step (each sampled `algorithm.group_size` times)
    shuffle: bool = True  # reshuffle the training rows every epoch (seeded)
    mixture: list[MixtureSource] = field(default_factory=list)  # rows of more envs
    # rows whose first prompt (tools included) exceeds rollout.max_prompt_tokens: refuse the
    # run (naming how many and the longest), or filter them out (the run says how many)
    overlong_prompts: Literal["refuse", "filter"] = "refuse"


@dataclass
class AlgorithmConfig:
    """The RL algorithm: GRPO-style (no critic) or PPO (critic + GAE)."""

    name: Literal["grpo", "ppo"] = "grpo"  # ppo adds the critic (algorithm.advantage: gae)
    advantage: str = "grpo"  # any registered advantage estimator
    group_size: int = 8  # samples per task (uid group)
    gamma: float = 1.0  # discount over sampled tokens (estimators that look along time)
    lam: float = 1.0  # GAE's lambda (advantage: gae)
    kl_in_reward_coef: float = 0.0  # > 0: KL to the reference subtracted from the reward
    kl_in_reward_kind: KLKind = "k1"  # KL estimator of the in-reward term
    use_reference: bool = False  # compute reference log-probs (needed by any KL term)
    # drop groups whose samples all got the same reward (zero advantage, no policy gradient)
    # before log-probs and the update, as DAPO's dynamic sampling does
    filter_groups: bool = False


@dataclass
class ResourcesConfig:
    """Where workers run: one Ray pool of processes; the roles share it (colocated)."""

    device: Literal["cpu", "cuda"] = "cpu"  # where the actor (and reference, critic) train
    nodes: int = 1  # machines of each pool
    processes_per_node: int = 1  # FSDP ranks per node (actor / reference / critic)
    rollout_processes_per_node: int = 1  # trainer.mode=pipeline: the rollout pool's own processes
    # Ray CPUs each process asks for; Ray sets its torch threads from it, so a lone colocated
    # process on CPU should ask for every core (the quickstart asks for 2)
    cpus_per_process: float = 1.0
    ray_num_cpus: int | None = None  # local cluster size; None: Ray's default
    ray_address: str | None = None  # connect to an existing cluster (or set RAY_ADDRESS)
    memory_check: Literal["refuse", "warn", "skip"] = "refuse"  # the pre-flight memory plan
    host_memory_gib: float | None = None  # RAM per node to plan with (None: this machine's)
    gpu_memory_gib: float | None = None  # memory per GPU to plan with (None: the visible GPU's)
    # Ray custom resources each bundle of a pool asks for, by pool: "global" (trainer.mode=sync),
    # "train" and "rollout" (pipeline), e.g. {rollout: {rollout_node: 0.01}} puts the rollout
    # workers on the nodes started with --resources '{"rollout_node": 1}'
    pool_resources: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class WarmStartConfig:
    """Supervised warm start on oracle transcripts of the env, before RL. It computes in
    ``actor.param_dtype`` (bf16 under autocast over fp32 weights; ``auto``: whichever a
    forward and backward of the model timed faster, `toolrl.workers.compute_dtype`)."""

    enabled: bool = False  # run the warm start before RL (its checkpoint is the RL start)
    steps: int = 300  # at most; the cosine schedule spans them
    stop_loss: float | None = None  # stop once the mean loss of the last 50 steps is this low
    lr: float = 3e-3  # peak AdamW learning rate (linear warmup, then cosine decay)
    batch_size: int = 16  # transcripts per step
    num_transcripts: int = 2048  # oracle episodes recorded to train on
    task_kwargs: dict[str, Any] = field(default_factory=dict)  # default: data.task_kwargs
    # rows the oracle plays (e.g. converted gold calls), the first num_transcripts of them;
    # None: num_transcripts rows from the env's generator
    train_file: str | None = None
    # rows (train_file's format) whose oracle transcripts are held out: their loss picks the
    # checkpoint and stops the run (needs eval_every > 0)
    val_file: str | None = None
    # instead of val_file: hold out this fraction of the transcripts (by seed; not trained on)
    val_fraction: float = 0.0
    eval_every: int = 0  # steps between held-out loss evaluations (0: never; > 0 needs held-out)
    # evaluations without a new best held-out loss before it stops; the checkpoint kept is the
    # best one (saved to disk at each new best, no copy in memory)
    patience: int = 3
    # steps between snapshots of the warm start's whole state (weights, AdamW, data order) in
    # <output>/.resume: started again after an interruption it goes on from the last one and
    # ends as if never interrupted (0: no snapshots)
    save_every: int = 0
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # over env.kwargs, oracle env only
    output: str | None = None  # where the warm-started HF checkpoint goes (default: run dir)


@dataclass
class TrainerConfig:
    """The loop: steps, validation, checkpoints, tracking."""

    total_steps: int = 20  # RL steps (each: rollout, reward, update, weight push)
    # held-out validation before the first step, every val_every steps and after the last;
    # 0: never (before and after only: val_every = total_steps)
    val_every: int = 5
    save_every: int = 0  # 0: no intermediate checkpoints
    keep_checkpoints: int = 2  # newest checkpoints kept in <run dir>/checkpoints/
    resume: str = "auto"  # auto | never | a checkpoint directory
    output_dir: str | None = None  # default: outputs/<experiment_name>
    # where metrics go: jsonl (metrics.jsonl), tensorboard, wandb, mlflow
    trackers: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    log_rollouts: int = 8  # trajectories dumped per step
    # sync; pipeline: one-step off-policy; async: streaming (trainer/async_mode.py)
    mode: Literal["sync", "pipeline", "async"] = "sync"
    # trainer.mode=async (trainer/async_buffer.py): no sample trains more than max_staleness
    # policy versions after its group started; a due group still generating is waited for
    # (continue: it keeps going under the new weights) or cancelled and counted (drop)
    max_staleness: int = 1
    stale_policy: StalePolicy = "continue"  # a due group still generating: wait, or drop it
    # trainer.mode pipeline / async train on samples of older weights, and a gateway agent's
    # grammar-constrained calls (tool_choice required / named) are sampled off the actor's
    # distribution: such runs need actor.loss.corrections; true trains them uncorrected on
    # purpose (no refusal, no warning)
    allow_uncorrected: bool = False
    export_hf: bool = True  # write final_hf/ at the end
    # a rollout worker that died or failed: stop the run naming it, or restart it (and its
    # engine) and redo the batch, at most max_retries times in a row (docs/reliability.md)
    on_rollout_failure: Literal["stop", "retry"] = "stop"
    max_retries: int = 1  # retries in a row (on_rollout_failure: retry) before the run stops
    call_timeout_s: float = 1800.0  # bound on one worker-group call; past it the call fails
    # Two thresholds, disjoint: infra_failures.max_fraction counts the episodes the
    # infrastructure failed (tool server down, env raised or timed out, episode loop crashed)
    # in the batch as generated; health.max_error_fraction the other errors (template,
    # observation, empty turn) among the episodes that train. No episode counts for both.
    health: HealthConfig = field(default_factory=HealthConfig)  # per-step health checks
    # infra-failed episodes are refilled or dropped, never trained on (trainer/failures.py)
    infra_failures: InfraFailureConfig = field(default_factory=InfraFailureConfig)
    # after each weight push, engine and actor score a fixed probe (sync/canary.py)
    # auto: stop for fp32 engines, warn for bf16 / fp16 (toolrl/weights/canary.py)
    sync_canary: Literal["auto", "stop", "warn", "off"] = "auto"
    # bound on the dtype's statistic (fp32: max |log-prob diff|; bf16: mean); None: by dtype
    sync_canary_tolerance: float | None = None
    # no step finished within the bound: stacks of every process to <run dir>/stalls/, one
    # line, exit 1 (trainer/progress.py)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    # SIGTERM / SIGINT: the step in flight may finish within this many seconds, then a
    # checkpoint of it is written and the run ends (0: stop at once; trainer/stopping.py)
    stop_grace_s: float = 120.0


def validates_after(step: int, trainer: TrainerConfig) -> bool:
    """Whether held-out validation runs after ``step`` steps (0: before training):
    ``trainer.val_every`` > 0 validates before training, every ``val_every`` steps and after
    the last step; 0 never validates."""
    every = trainer.val_every
    return every > 0 and (step % every == 0 or step == trainer.total_steps)


@dataclass
class ExperimentConfig:
    """One experiment, exactly as configs/*.yaml spell it."""

    experiment_name: str = "toolrl"  # names the run directory: outputs/<experiment_name>
    seed: int = 0  # seeds tasks, sampling, shuffles and the warm start (one seed, one run)
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    # the reward set: components with weights, gates, clip and scale (toolrl.reward)
    reward: RewardSection = field(default_factory=lambda: RewardSection(
        rewards=[RewardEntry(name="success", weight=1.0)]))
    # env id -> its own reward set (keys as in reward), for the rows of that env
    env_rewards: dict[str, RewardSection] = field(default_factory=dict)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.trainer.output_dir or Path("outputs") / self.experiment_name)

    @property
    def needs_reference(self) -> bool:
        """Reference log-probs are computed (a KL term, or ``algorithm.use_reference``)."""
        return self.algorithm.use_reference or self.actor.loss.kl_loss_coef > 0 or \
            self.algorithm.kl_in_reward_coef > 0

    @property
    def reference_worker(self) -> bool:
        """The reference is a model of its own (a `RefWorker`); a LoRA actor's reference is
        itself with its adapters switched off."""
        return self.needs_reference and not self.actor.lora.enabled


FILLED_BY_TRAINER: dict[str, str] = {
    "rollout.engine.model": "model.path (or the warm start's checkpoint)",
    "rollout.engine.seed": "seed", "rollout.seed": "seed", "rollout.env_id": "env.id",
    "rollout.env_kwargs": "env.kwargs",
    "rollout.engine.weight_bucket_mb": "actor.weight_bucket_mb",
    "rollout.engine.weight_transfer": "trainer.mode",
    "rollout.engine.max_lora_rank": "actor.lora (rank, with sync=adapter)",
    **{f"{m}.{k}": v for m in ("actor", "critic") for k, v in {
        "model_path": "model.path (or the warm start's checkpoint)", "seed": "seed",
        "total_steps": "trainer.total_steps, ppo_epochs and ppo_mini_batch_size",
        "updates_per_step": "ppo_epochs and ppo_mini_batch_size"}.items()},
    "actor.temperature": "rollout.temperature",
    "actor.max_response_length": "rollout.max_total_tokens",
    "critic.max_response_length": "rollout.max_total_tokens",
}
"""Keys of embedded component configs that the trainer fills (a value there would do nothing)."""

def _choices(cls: type, path: str = "") -> dict[str, tuple[str, ...]]:
    """Key -> valid values of every ``Literal`` field under ``cls`` (nested configs too)."""
    out: dict[str, tuple[str, ...]] = {}
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        key, hint = f"{path}{f.name}", hints[f.name]
        if typing.get_origin(hint) is Literal:
            out[key] = typing.get_args(hint)
        elif is_dataclass(hint):
            out.update(_choices(hint, f"{key}."))
    return out


CHOICES: dict[str, tuple[str, ...]] = _choices(ExperimentConfig)
"""Key -> its valid values, read off the schema's ``Literal`` types (OmegaConf checks them when a
config loads, `validate` when one is built in Python, the docs list them)."""

REGISTERED: dict[str, tuple[str, Callable[[], list[str]]]] = {
    "algorithm.advantage": ("registered advantage estimator", ADVANTAGE_ESTIMATORS.names),
    "actor.loss.policy_loss": ("registered policy loss", POLICY_LOSSES.names),
    "model.tiny_tokenizer": ("model family", FAMILIES.names),
    "model.tiny_size": ("tiny size or real shape", size_names),
}
"""Keys whose valid values are a registry's names (plugins add to them): what they name, and the
names known now."""


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = ()
                ) -> ExperimentConfig:
    """Schema <- YAML file <- ``key=value`` overrides, validated."""
    schema = OmegaConf.structured(ExperimentConfig)
    OmegaConf.set_readonly(schema, False)  # frozen worker configs are still overridable
    layers = []
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        try:
            layers.append(OmegaConf.load(path))
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: {_yaml_problem(exc)}") from None
    # an override into a list item (reward.rewards.0.weight=2, or [0]) is set on the merged
    # list: as a dotlist layer it would be a mapping merged onto the list
    into_list = [o for o in overrides if _LIST_INDEX.search(o.partition("=")[0])]
    try:
        layers.append(OmegaConf.from_dotlist([o for o in overrides if o not in into_list]))
        merged = OmegaConf.merge(schema, *layers)
        for override in into_list:
            _set_in_list(merged, override)
        cfg = _build(merged)
    except (ConfigKeyError, ValidationError) as exc:
        raise ConfigError(_explain(exc, layers)) from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {exc}") from None
    except TypeError as exc:  # OmegaConf merging a mapping onto a list (a.0.b=... overrides)
        raise ConfigError(f"invalid config: {exc}") from None
    assert isinstance(cfg, ExperimentConfig)
    validate(cfg)
    return cfg


_LIST_INDEX = re.compile(r"(?:^|\.)\d+(?:\.|$)|\[\d+\]")


def _set_in_list(merged: DictConfig, override: str) -> None:
    """Apply one ``key=value`` override whose key indexes a list (``a.0.b``, ``a[0].b``) to the
    merged config, the value parsed as a dotlist value is."""
    key, _, value = override.partition("=")
    parsed = OmegaConf.from_dotlist([f"value={value}"])["value"]
    parts = [p for p in re.split(r"[.\[\]]", key) if p]
    for i, part in enumerate(parts[1:], start=1):
        if not part.isdigit():
            continue
        at = OmegaConf.select(merged, ".".join(parts[:i]), default=None)
        if isinstance(at, ListConfig) and int(part) >= len(at):
            raise ConfigError(f"{key}={value!r}: {'.'.join(parts[:i])} has {len(at)} "
                              f"entr{'y' if len(at) == 1 else 'ies'} (set the whole list to "
                              f"add one)")
    try:
        OmegaConf.update(merged, key, parsed, merge=True)
    except (OmegaConfBaseException, IndexError, KeyError, TypeError, ValueError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{key}={value!r}: {message}") from None


def _build(node: Any, path: str = "") -> Any:
    """``OmegaConf.to_object`` section by section, the deepest first, so that a section's own
    check (a component config's ``__post_init__`` raising ValueError or TypeError) becomes a
    `ConfigError` naming its key path (`keyed`). Returns the built root."""
    if isinstance(node, ListConfig):
        for i, child in enumerate(node):
            if isinstance(child, (DictConfig, ListConfig)):
                _build(child, f"{path}[{i}]")
        return None
    cls = OmegaConf.get_type(node)
    for key in list(node.keys()):
        if OmegaConf.is_missing(node, key):
            continue
        child = node[key]
        if isinstance(child, (DictConfig, ListConfig)):
            # a dataclass's field: a.b; a dict's entry (env_rewards['toolrl/Bank-v0']): a['k']
            sub = f"{path}.{key}" if is_dataclass(cls) else f"{path}[{str(key)!r}]"
            _build(child, sub.lstrip("."))
    if not is_dataclass(cls):
        return None
    try:
        return OmegaConf.to_object(node)
    except OmegaConfBaseException:
        raise
    except (TypeError, ValueError) as exc:
        if not path:
            raise ConfigError(f"invalid config: {exc}") from None
        raise ConfigError(keyed(path, cls, exc)) from None


def keyed(path: str, cls: type, exc: BaseException) -> str:
    """The message of a section's own check (``cls`` at ``path``, e.g. ``rollout``) as one line
    that starts with the key path: the section's field the message names first
    (``concurrency must be >= 1`` -> ``rollout.concurrency: must be >= 1``), or the section
    itself; fields named after its first ``; `` or ``: `` (a list of valid keys) do not count.
    A message that already names a key under ``path`` stays as it is."""
    text = str(exc).strip()
    if text.startswith(f"{path}.") or f" {path}." in f" {text}":
        return text
    names = [f.name for f in fields(cls)] if is_dataclass(cls) else []
    subject = re.split(r"[;:] ", text, maxsplit=1)[0]  # "unknown x; valid: a, b": not a, b
    found = [(m.start(), -len(n), n) for n in names
             for m in [re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", subject)] if m]
    if not found:
        return f"{path}: {text}"
    start, _, name = min(found)
    key = f"{path}.{name}"
    if start > 0:
        return f"{key}: {text}"
    rest = text[len(name):]
    if rest.startswith(("=", "[", " (", ":")):
        return key + rest
    if rest.startswith((" must ", " is ", " needs ")):
        return f"{key}:{rest}"
    return f"{key}: {text}"


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The resolved config as plain data (what `config.yaml` in the run dir holds)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def save_config(cfg: ExperimentConfig, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML; values of secret-looking environment variables
    (e.g. a key read with ``${oc.env:MY_API_KEY}``) are written as ``***``."""
    OmegaConf.save(OmegaConf.create(redact(to_dict(cfg), secret_values())), Path(path))


def validate(cfg: ExperimentConfig) -> None:
    """Checks the schema's types cannot express: choices, registry names, sizes, the rules
    between keys, the component configs as the trainer fills them, local model paths. With
    `load_config`'s typing (and the sections' own checks, `keyed`) it is the one validation
    pass: each mistake is one `ConfigError` line naming its key path."""
    _type_reward_sets(cfg)
    for key, valid in CHOICES.items():
        value = _get(cfg, key)
        if value not in valid:
            raise ConfigError(f"{key}={value!r} is not valid; choose one of {list(valid)}")
    for key, (what, names) in REGISTERED.items():
        value = _get(cfg, key)
        if value not in names():
            raise ConfigError(f"{key}={value!r} is not a {what}; choose one of {names()}")
    if cfg.algorithm.name == "ppo" and cfg.algorithm.advantage != "gae":
        raise ConfigError("algorithm.name=ppo needs algorithm.advantage=gae (it uses the critic)")
    positive = ("data.batch_size", "algorithm.group_size",
                "rollout.max_tokens_per_turn", "rollout.max_turns", "resources.nodes",
                "resources.processes_per_node", "resources.rollout_processes_per_node",
                "trainer.total_steps")
    for key in positive:
        if _get(cfg, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {_get(cfg, key)}")
    for key in ("trainer.max_retries", "trainer.infra_failures.refill_attempts",
                "trainer.val_every", "trainer.save_every", "warm_start.save_every"):
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {_get(cfg, key)}")
    if not 0.0 <= cfg.trainer.infra_failures.max_fraction <= 1.0:
        raise ConfigError(f"trainer.infra_failures.max_fraction must be in [0, 1], got "
                          f"{cfg.trainer.infra_failures.max_fraction}")
    split = cfg.trainer.mode in ("pipeline", "async")
    pools = ("train", "rollout") if split else ("global",)
    stray = sorted(set(cfg.resources.pool_resources) - set(pools))
    if stray:
        raise ConfigError(f"resources.pool_resources: no pool {stray} in trainer.mode="
                          f"{cfg.trainer.mode}; its pools: {list(pools)}")
    for key in ("first_step_s", "multiple", "floor_s", "grace_s"):
        if not _get(cfg, f"trainer.watchdog.{key}") > 0:
            raise ConfigError(f"trainer.watchdog.{key} must be > 0, got "
                              f"{_get(cfg, f'trainer.watchdog.{key}')}")
    if not cfg.trainer.stop_grace_s >= 0:
        raise ConfigError(f"trainer.stop_grace_s must be >= 0 (0: a signal stops the run at "
                          f"once), got {cfg.trainer.stop_grace_s}")
    tolerance = cfg.trainer.sync_canary_tolerance
    if tolerance is not None and not tolerance > 0:
        raise ConfigError(f"trainer.sync_canary_tolerance must be > 0 or null, got {tolerance}")
    if cfg.algorithm.advantage in ("grpo", "dr_grpo", "rloo", "grpo_turn") and \
            cfg.algorithm.group_size < 2:
        raise ConfigError(f"algorithm.advantage={cfg.algorithm.advantage} compares samples "
                          "of a group: algorithm.group_size must be >= 2")
    if cfg.actor.lora.enabled and cfg.actor.lora.sync == "adapter" and \
            cfg.trainer.mode != "sync":
        raise ConfigError("actor.lora.sync=adapter pushes into colocated engines only: use "
                          "trainer.mode=sync, or actor.lora.sync=merge")
    if cfg.rollout.agent is not None:
        _check_agent(cfg)
    if cfg.rollout.engine.sleep_level == 2 and cfg.actor.lora.enabled and \
            cfg.actor.lora.sync == "adapter":
        raise ConfigError("rollout.engine.sleep_level=2 drops the engine's base weights while "
                          "the actor trains and actor.lora.sync=adapter never pushes them "
                          "again: use sleep_level 1 (the default) or actor.lora.sync=merge")
    if cfg.rollout.engine.sleep_level and split:
        raise ConfigError(f"rollout.engine.sleep_level > 0 needs trainer.mode=sync: in "
                          f"{cfg.trainer.mode} mode the engines generate while the actor trains")
    _check_async(cfg)
    _check_corrections(cfg)
    _check_warm_start(cfg.warm_start)
    if cfg.rollout.history_policy == "per_turn" and \
            cfg.algorithm.advantage not in AGENT_ADVANTAGES:
        raise ConfigError(f"rollout.history_policy=per_turn makes each model turn a sample "
                          f"sharing its episode's advantage: algorithm.advantage must be one of "
                          f"{', '.join(AGENT_ADVANTAGES)}, not {cfg.algorithm.advantage}")
    for i, source in enumerate(cfg.data.mixture):
        if not source.env:
            raise ConfigError(f"data.mixture[{i}].env is required (a registered env id)")
        if source.train_file is None and source.train_size < 1:
            raise ConfigError(f"data.mixture[{i}] ({source.env}): give train_file or a "
                              f"train_size >= 1")

    defaults = {"rollout": RolloutConfig(), "actor": ActorConfig(), "critic": CriticConfig()}
    for key, source in FILLED_BY_TRAINER.items():
        section, _, rest = key.partition(".")
        if _get(cfg, key) != _get(defaults[section], rest):
            raise ConfigError(f"{key} is set by the trainer from {source}; set {source} "
                              f"instead")
    for key in ("actor", "critic"):
        model = getattr(cfg, key)
        if model.lr_schedule == "cosine" and optimizer_steps(cfg, model) <= model.warmup_steps:
            raise ConfigError(f"{key}.lr_schedule=cosine needs more optimizer steps "
                              f"({optimizer_steps(cfg, model)} in this run) than "
                              f"{key}.warmup_steps ({model.warmup_steps})")
    _check_filled(cfg)
    for key in MODEL_KEYS:  # local paths only: a hub id is pre-flight's (that may ask the hub)
        resolve_model(cfg, key, ask_hub=False)


MODEL_KEYS = ("model.path", "rollout.engine.tokenizer")
"""The keys that name a model (a local folder or a hub id), each checked by `resolve_model`."""


def resolve_model(cfg: ExperimentConfig, key: str = "model.path", *, ask_hub: bool = True
                  ) -> str | None:
    """The one check of a model path (``model.path``, or ``rollout.engine.tokenizer``): where
    it loads from, by `toolrl.models.source`'s rule: a local folder (or ``model.path`` the run
    builds, ``model.build_tiny_if_missing``, whose default it settles), a hub id that answers,
    or a cached hub id's snapshot folder. One `ConfigError` line naming ``key`` otherwise, in
    seconds. None when ``key`` is unset, or names a hub id and ``ask_hub`` is false (the
    validation pass asks no network). `validate`, pre-flight (`check_model`), the run context,
    the memory plan and the dry run all resolve the model here."""
    model = cfg.model
    if model.build_tiny_if_missing is None:
        model.build_tiny_if_missing = model.path == TINY_MODEL_PATH
    if key == "model.path":
        path, build = model.path, bool(model.build_tiny_if_missing)
    elif key == "rollout.engine.tokenizer":
        path, build = cfg.rollout.engine.tokenizer, False
    else:
        raise KeyError(f"{key} names no model; one of {MODEL_KEYS}")
    if path is None:
        return None
    if not ask_hub and locate_model(path, build).kind == "hub":
        return None
    try:
        return require_model(path, build, key=key)
    except ModelNotFoundError as exc:
        raise ConfigError(str(exc)) from None


def _type_reward_sets(cfg: ExperimentConfig) -> None:
    """Reward sets written as plain data in a config built in Python (``reward={...}``) are
    typed here as `load_config` types them (`as_section`), their errors keyed alike."""
    try:
        if not isinstance(cfg.reward, RewardSection):
            cfg.reward = as_section(cfg.reward)
    except RewardConfigError as exc:
        raise ConfigError(keyed("reward", RewardSection, exc)) from None
    for env_id, section in list(cfg.env_rewards.items()):
        try:
            if not isinstance(section, RewardSection):
                cfg.env_rewards[env_id] = as_section(section)
        except RewardConfigError as exc:
            raise ConfigError(keyed(f"env_rewards[{env_id!r}]", RewardSection, exc)) from None


def _check_corrections(cfg: ExperimentConfig) -> None:
    """Off-policy modes train with a correction, unless the config says so on purpose."""
    corrections = cfg.actor.loss.corrections
    if cfg.trainer.allow_uncorrected and corrections:
        raise ConfigError(f"trainer.allow_uncorrected=true with actor.loss.corrections "
                          f"{[c.name for c in corrections]}: the corrections apply; drop one "
                          f"of the two")
    if cfg.trainer.mode in ("pipeline", "async") and not corrections and \
            not cfg.trainer.allow_uncorrected:
        raise ConfigError(f"trainer.mode={cfg.trainer.mode} trains on samples of older weights "
                          f"but actor.loss.corrections is empty: list one (e.g. "
                          f"'actor.loss.corrections=[{{name: tis, cap: 2.0}}]', see "
                          f"docs/guides/algorithms.md) or set trainer.allow_uncorrected=true")


def _check_async(cfg: ExperimentConfig) -> None:
    """``trainer.max_staleness`` / ``stale_policy`` belong to ``trainer.mode=async``."""
    t, default = cfg.trainer, TrainerConfig()
    if t.mode != "async":
        for key in ("max_staleness", "stale_policy"):
            if getattr(t, key) != getattr(default, key):
                raise ConfigError(f"trainer.{key} applies to trainer.mode=async only (this run "
                                  f"is trainer.mode={t.mode}; pipeline mode is always one "
                                  f"version behind)")
        return
    if isinstance(t.max_staleness, bool) or not isinstance(t.max_staleness, int) or \
            t.max_staleness < 0:
        raise ConfigError(f"trainer.max_staleness must be an integer >= 0 (policy versions a "
                          f"sample may lag the actor that trains on it), got "
                          f"{t.max_staleness!r}")


def _check_warm_start(ws: WarmStartConfig) -> None:
    """The warm start's held-out keys: held-out transcripts and evaluations go together."""
    if not 0.0 <= ws.val_fraction < 1.0:
        raise ConfigError(f"warm_start.val_fraction must be in [0, 1), got {ws.val_fraction}")
    if ws.val_file and ws.val_fraction > 0:
        raise ConfigError("warm_start.val_file and warm_start.val_fraction both hold out "
                          "transcripts: set one of them")
    if ws.eval_every < 0 or ws.patience < 1:
        raise ConfigError(f"warm_start.eval_every must be >= 0 and warm_start.patience >= 1, "
                          f"got {ws.eval_every} and {ws.patience}")
    held_out = bool(ws.val_file) or ws.val_fraction > 0
    if ws.eval_every > 0 and not held_out:
        raise ConfigError(f"warm_start.eval_every={ws.eval_every} evaluates the held-out loss: "
                          f"set warm_start.val_file or warm_start.val_fraction")
    if held_out and ws.eval_every == 0:
        raise ConfigError("warm_start.val_file / val_fraction hold out transcripts for the "
                          "held-out loss: set warm_start.eval_every > 0 (steps between "
                          "evaluations)")


def _check_agent(cfg: ExperimentConfig) -> None:
    """``rollout.agent``: an episode may become several samples sharing one advantage."""
    if cfg.algorithm.advantage not in AGENT_ADVANTAGES:
        raise ConfigError(f"rollout.agent needs an outcome advantage (one value per episode, "
                          f"shared by its samples): algorithm.advantage must be one of "
                          f"{list(AGENT_ADVANTAGES)}, got {cfg.algorithm.advantage!r}")
    if cfg.trainer.infra_failures.rule == "refill":
        raise ConfigError("rollout.agent: trainer.infra_failures.rule=refill cannot put an "
                          "episode that split into several samples in one failed sample's "
                          "place; set trainer.infra_failures.rule=drop_sample or drop_group")


AGENT_ADVANTAGES = ("grpo", "dr_grpo", "rloo")


def worker_rollout_config(cfg: ExperimentConfig, model: str | None = None) -> RolloutConfig:
    """The ``rollout:`` section as the rollout workers get it: what the trainer fills
    (`FILLED_BY_TRAINER`: the model, seeds, env, the run's weight push) and the engine's
    backend defaults (`EngineConfig.resolved`). GPU engines that share the actor's processes
    (``trainer.mode=sync``) sleep while it trains unless ``rollout.engine.sleep_level`` says
    otherwise: level 2 (weights dropped) when every weight is pushed after the wake-up anyway,
    as verl does (level 1 would copy every weight to host memory and back each step for
    nothing); level 1 (weights offloaded) when a LoRA actor pushes only its adapter
    (``actor.lora.sync=adapter``: the base weights must survive the sleep). Engines on a pool
    of their own receive weights over NCCL and never sleep."""
    r, e = cfg.rollout, cfg.rollout.engine
    sync = cfg.trainer.mode == "sync"
    lora = cfg.actor.lora
    adapter = lora.enabled and lora.sync == "adapter"
    sleep = e.sleep_level if e.sleep_level is not None else \
        (1 if adapter else 2) if e.backend == "gpu" and sync else 0
    engine = replace(r.engine_config(), model=model or cfg.model.path, seed=cfg.seed,
                     weight_bucket_mb=cfg.actor.weight_bucket_mb,
                     max_lora_rank=lora.engine_rank if adapter else 0,
                     weight_transfer="ipc" if sync else "nccl", sleep_level=sleep).resolved()
    return replace(r, engine=engine, env_id=cfg.env.id, env_kwargs=dict(cfg.env.kwargs),
                   seed=cfg.seed)


def worker_model_config(cfg: ExperimentConfig, key: Literal["actor", "critic"],
                        model: str | None = None) -> Any:
    """The ``actor:`` or ``critic:`` section as its workers get it: what the trainer fills
    (`FILLED_BY_TRAINER`: the model, the seed, the optimizer steps of its LR schedule, the
    response length; the actor's sampling temperature)."""
    section = getattr(cfg, key)
    changes: dict[str, Any] = dict(
        model_path=model or cfg.model.path, total_steps=optimizer_steps(cfg, section),
        updates_per_step=updates_per_step(cfg, section), seed=cfg.seed,
        max_response_length=cfg.rollout.max_total_tokens)
    if key == "actor":
        changes["temperature"] = cfg.rollout.temperature
    return replace(section, **changes)


def _check_filled(cfg: ExperimentConfig) -> None:
    """The component configs as the trainer fills them pass their own checks here, in the
    validation pass, as `ConfigError`s naming the section, never later in a worker."""
    built: dict[str, Callable[[], Any]] = {
        # the episode loop's budget (EpisodeConfig) is derived from the section in the workers
        "rollout": lambda: worker_rollout_config(cfg).episode_config(),
        "actor": lambda: worker_model_config(cfg, "actor")}
    if cfg.algorithm.name == "ppo":
        built["critic"] = lambda: worker_model_config(cfg, "critic")
    for key, build in built.items():
        try:
            build()
        except (TypeError, ValueError) as exc:
            message = keyed(key, type(getattr(cfg, key)), exc)
            filled = [k for k in FILLED_BY_TRAINER if re.match(rf"{re.escape(k)}\b", message)]
            if filled:  # a value the trainer put there: name where it came from
                key = max(filled, key=len)
                message = message.replace(key, f"{key} (set by the trainer from "
                                               f"{FILLED_BY_TRAINER[key]})", 1)
            raise ConfigError(message) from None


def updates_per_step(cfg: ExperimentConfig, model: Any) -> int:
    """Optimizer steps a trainer step plans for a trained model: PPO epochs x mini-batches of
    one sample per episode (a step whose batch differs still moves the LR schedule by this
    much: `FSDPConfig.updates_per_step`)."""
    samples = cfg.data.batch_size * cfg.algorithm.group_size
    mini = model.ppo_mini_batch_size or samples
    return model.ppo_epochs * -(-samples // mini)


def optimizer_steps(cfg: ExperimentConfig, model: Any) -> int:
    """Planned optimizer steps of a trained model over the run (what its LR schedule spans)."""
    return cfg.trainer.total_steps * updates_per_step(cfg, model)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML syntax error in one line: what and where."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"YAML syntax error{where}: {problem}"


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _explain(exc: ConfigKeyError | ValidationError, layers: Sequence[Any] = ()) -> str:
    full_key = getattr(exc, "full_key", None) or "?"
    owner = getattr(exc, "object_type", None)
    top = full_key.split(".")[0].split("[")[0]
    if top not in {f.name for f in fields(ExperimentConfig)} and is_dataclass(owner):
        # inside a list item (data.mixture[i], reward.rewards[i]) OmegaConf loses the path
        full_key = _locate(owner, getattr(exc, "key", None), layers) or full_key
    first = str(exc).splitlines()[0]
    if not first.endswith((".", "?", "!")):  # OmegaConf's "Did you mean ...?" ends one already
        first += "."
    if getattr(exc, "key", None) is True:
        first += " YAML 1.1 reads the key on (or yes) as true: write the key the schema names."
    if isinstance(exc, ConfigKeyError):
        parent = full_key.rpartition(".")[0]
        valid = _valid_keys(parent)
        if not valid and is_dataclass(owner) and owner is not ExperimentConfig:
            # a section in a list or a mapping (data.mixture[i], env_rewards[...]): its class
            return (f"unknown config key {full_key!r}. {first} Valid keys of "
                    f"{owner.__name__}: {sorted(f.name for f in fields(owner))}")
        return f"unknown config key {full_key!r}. {first} Valid keys" + \
            (f" under {parent!r}" if parent else "") + f": {valid}"
    if full_key in CHOICES:  # a Literal's value (the message validate gives a built config)
        value = str(exc).split("'")[1] if str(exc).count("'") >= 2 else str(exc)
        return f"{full_key}={value!r} is not valid; choose one of {list(CHOICES[full_key])}"
    return f"invalid value for {full_key!r}: {first}"


def _locate(owner: type, key: Any, layers: Sequence[Any]) -> str | None:
    """The key path, in what the user wrote (``layers``), of ``key`` of a section of type
    ``owner``: where OmegaConf's error inside a list item names only the last key."""
    def walk(node: Any, parts: tuple[Any, ...]) -> str | None:
        if not isinstance(node, (DictConfig, ListConfig)):
            return None
        items = enumerate(node) if isinstance(node, ListConfig) else \
            ((k, node._get_node(k)) for k in node)
        for k, child in items:
            if k == key and isinstance(node, DictConfig) and _schema_type(parts) is owner:
                return _render((*parts, k))
            found = walk(child, (*parts, k))
            if found:
                return found
        return None

    for layer in reversed(list(layers)):  # the last layer wins a merge: it raised
        found = walk(layer, ())
        if found:
            return found
    return None


def _schema_type(parts: tuple[Any, ...]) -> Any:
    """The schema's type at a path of keys and list indices (None when it has none)."""
    node: Any = ExperimentConfig
    for part in parts:
        if is_dataclass(node) and isinstance(part, str):
            node = typing.get_type_hints(node).get(part)
        elif typing.get_origin(node) in (list, dict):
            node = typing.get_args(node)[-1]
        else:
            return None
        args = [a for a in typing.get_args(node) if a is not type(None)]
        if typing.get_origin(node) not in (list, dict, Literal) and len(args) == 1:
            node = args[0]  # X | None
    return node


def _render(parts: tuple[Any, ...]) -> str:
    """``("env_rewards", "toolrl/Bank-v0", "rewards", 0, "weight")`` ->
    ``env_rewards['toolrl/Bank-v0'].rewards[0].weight`` (as `keyed` writes key paths)."""
    out = ""
    for i, part in enumerate(parts):
        if isinstance(part, int) and not isinstance(part, bool):  # a list index
            out += f"[{part}]"
        elif i and not is_dataclass(_schema_type(parts[:i])):
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else part
    return out


def _valid_keys(parent: str) -> list[str]:
    node: Any = ExperimentConfig
    for part in filter(None, parent.split(".")):
        match = [f for f in fields(node) if f.name == part] if is_dataclass(node) else []
        if not match:
            return []
        default = match[0].default_factory() if callable(match[0].default_factory) else None
        node = type(default) if is_dataclass(default) else None
        if node is None:
            return []
    return sorted(f.name for f in fields(node)) if is_dataclass(node) else []
