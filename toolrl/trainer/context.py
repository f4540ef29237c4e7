"""What training, evaluation and the dry run share: one `RunContext` per run.

It holds the config (checked once, when the context is made), the model RL starts from (the
configured one, a tiny one built on first use, or its warm-started copy), the task rows, the
reward sets, the sampling seeds and, once started, the rollout workers on a Ray cluster. The
`Trainer` is a context with the actor (and reference, critic) and the schedule of a step;
``toolrl eval`` starts only the rollout workers; the dry run starts none.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from tensordict import TensorDict

from toolrl import batch as B
from toolrl.algo import place_rewards
from toolrl.controller import ResourcePoolManager, RoleSpec, init_ray
from toolrl.controller.worker_group import spawn
from toolrl.core.registration import env_class, env_of
from toolrl.core.trajectory import Trajectory
from toolrl.data import load_rows
from toolrl.models.families import family_tokenizer
from toolrl.models.tiny import build_tiny_model, needs_build
from toolrl.rollout.gateway.agent import is_episode_lead
from toolrl.rollout.worker import RolloutConfig, RolloutWorker, make_rollout_input
from toolrl.trainer.config import (
    ConfigError,
    ExperimentConfig,
    resolve_model,
    worker_rollout_config,
)
from toolrl.trainer.failures import RolloutFailedError, describe
from toolrl.trainer.mixture import RewardSets, mixture_rows
from toolrl.trainer.preflight import check_config, check_rows
from toolrl.trainer.warm_start import task_vocab_texts, warm_started

__all__ = ["RunContext"]


class RunContext:
    """The model, the rows, the rewards, the seeds and the rollout workers of one run."""

    def __init__(self, cfg: ExperimentConfig, console: Console | None = None) -> None:
        check_config(cfg)  # env ids, kwargs, rewards: one clear ConfigError before anything
        self.cfg = cfg
        self.console = console or Console()
        self.run_dir = cfg.run_dir
        self.step = 0
        self.handles: dict[str, Any] = {}
        self.reward = RewardSets(cfg.reward, cfg.env_rewards)
        self.env_ids: list[str] = [cfg.env.id]  # every env of the run's rows (load_tasks)
        self.model_path = cfg.model.path  # what the workers load (prepare_model's result)

    # --- the model and the rows ----------------------------------------------------------------
    def prepare_model(self) -> str:
        """The checkpoint RL starts from: the configured one, or its warm-started copy."""
        base = self.base_model()
        return warm_started(self.cfg, base, self.run_dir, self.console) \
            if self.cfg.warm_start.enabled else base

    def base_model(self) -> str:
        """The configured checkpoint: a local folder (a tiny one built there when missing and
        allowed), a hub id, or a cached hub id's snapshot folder (`resolve_model`)."""
        cfg = self.cfg
        path = resolve_model(cfg)  # the one check (a path the run builds: itself)
        assert path is not None
        if cfg.model.build_tiny_if_missing:
            try:
                build = needs_build(path, cfg.model.tiny_size,  # missing, or older
                                    cfg.model.tiny_tokenizer, cfg.model.tiny_vocab)
            except ValueError as exc:  # a tiny build of another size: never replaced
                raise ConfigError(str(exc)) from None
            if build:
                self.console.log(f"building a {cfg.model.tiny_size} model (random weights) at "
                                 f"{path}")
                texts = None
                if cfg.model.tiny_vocab == "task" and cfg.model.tiny_tokenizer != "tiny":
                    texts = task_vocab_texts(cfg, *self.load_tasks())
                    self.console.log(f"model.tiny_vocab=task: the tokens of {len(texts)} texts "
                                     f"of the task")

                build_tiny_model(Path(path).expanduser(), seed=cfg.seed,
                                 size=cfg.model.tiny_size, tokenizer=cfg.model.tiny_tokenizer,
                                 vocab_texts=texts, load_tokenizer=family_tokenizer)
        return path

    def load_tasks(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Train and val rows: ``env.id``'s (files or generator), then ``data.mixture``'s."""
        data = self.cfg.data
        env_cls = env_class(self.cfg.env.id) if not (data.train_file and data.val_file) else None

        def generated(size: int, split: str) -> list[dict[str, Any]]:
            try:
                return env_cls.make_tasks(size, seed=self.cfg.seed, split=split,
                                          **data.task_kwargs)
            except ValueError as exc:  # a value the generator refuses: the key that set it
                raise ConfigError(f"data.task_kwargs={dict(data.task_kwargs)}: "
                                  f"{self.cfg.env.id}'s make_tasks: {exc}") from None

        train = load_rows(data.train_file) if data.train_file else generated(data.train_size,
                                                                             "train")
        val = load_rows(data.val_file) if data.val_file else generated(data.val_size, "val")
        more_train, more_val = mixture_rows(data.mixture, self.cfg.seed, env_class)
        for rows, where in ((train, "data.train_file" if data.train_file else "train rows"),
                            (val, "data.val_file" if data.val_file else "val rows"),
                            (more_train + more_val, "data.mixture rows")):
            check_rows(rows, self.cfg, where)  # the envs rows name exist and take their kwargs
        train, val = train + more_train, val + more_val
        self.env_ids = sorted({env_of(r, self.cfg.env.id) for r in train + val})
        return train, val

    # --- the rollout workers --------------------------------------------------------------------
    def start_rollout(self) -> None:
        """The rollout workers alone (evaluation: no actor)."""
        res = self.cfg.resources
        init_ray(num_cpus=res.ray_num_cpus, address=res.ray_address)
        self.spawn_roles({"rollout": RoleSpec.of(RolloutWorker, self.rollout_config())})

    def spawn_roles(self, roles: dict[str, RoleSpec]) -> None:
        """Start the worker groups of ``roles``, all on one pool (a mode with pools of its own
        places them itself)."""
        res = self.cfg.resources
        pools = {"global": [res.processes_per_node] * res.nodes}
        manager = ResourcePoolManager.from_config({
            "pools": pools, "mapping": {role: "global" for role in roles},
            "use_gpu": res.device == "cuda", "cpus_per_process": res.cpus_per_process,
            "custom_resources": {p: res.pool_resources[p] for p in pools
                                 if p in res.pool_resources}})
        with self.console.status("starting workers (vLLM engines, FSDP actors)"):
            self.handles = spawn(manager, roles, call_timeout_s=self.cfg.trainer.call_timeout_s)

    def rollout_config(self) -> RolloutConfig:
        """The ``rollout:`` section as the workers get it (`worker_rollout_config`: the model,
        env, seeds and the run's weight push filled in, the engine's backend defaults)."""
        return worker_rollout_config(self.cfg, self.model_path)

    def rollout(self, rows: Sequence[Mapping[str, Any]], n: int, seed: int | None,
                greedy: bool = False, uids: Sequence[str] | None = None) -> TensorDict:
        """One episode per row and sample; a failed call (a dead, hung or raising worker)
        is a `RolloutFailedError` naming the worker."""
        batch = make_rollout_input(rows, n=n, uids=uids)
        try:
            return self.handles["rollout"].call(RolloutWorker.rollout, batch, seed=seed,
                                                greedy=greedy)
        except Exception as e:
            raise RolloutFailedError(f"rollout of step {self.step + 1} failed ({describe(e)})"
                                     ) from e

    def score(self, batch: TensorDict) -> dict[str, float]:
        """Reward plugins -> ``token_level_scores`` (`toolrl.algo.credit.place_rewards`)."""
        trajs = B.trajectories(batch)
        results, reward_metrics = self.reward.score(trajs, self.envs_of(trajs))
        totals = [r.score for r in results]
        batch.set(B.TOKEN_LEVEL_SCORES, place_rewards(
            batch[B.RESPONSE_MASK], totals, [r.per_turn for r in results],
            [t.turn_ends() for t in trajs]))
        metrics = {k: float(v) for k, v in reward_metrics.items()}
        per_episode = [x for x, t in zip(totals, trajs, strict=True)
                       if is_episode_lead(t)]  # a split agent episode counts once
        metrics["train/reward_mean"] = float(sum(per_episode) / max(len(per_episode), 1))
        return metrics

    def shutdown_workers(self) -> None:
        """Stop the engines, kill every worker group, release the pools."""
        if "rollout" in self.handles:
            try:  # a stalled run's workers may never answer: they are killed below
                self.handles["rollout"].call_async(RolloutWorker.shutdown).get(
                    timeout=5 if self.stalled else 120)
            except Exception as e:  # a dead or hung rollout worker: its group is killed below
                self.console.log(f"rollout shutdown: {e}")
        for group in {id(h.group): h.group for h in self.handles.values()}.values():
            group.shutdown()
            group.pool.release()
        self.handles = {}

    def close(self) -> None:
        self.shutdown_workers()
        self.reward.close()

    @property
    def stalled(self) -> bool:
        """The run's watchdog fired (the workers may never answer again)."""
        return False

    @property
    def mixed(self) -> bool:
        """The run's rows come from more than one env (per-env metrics are logged)."""
        return len(self.env_ids) > 1

    def envs_of(self, trajs: Sequence[Trajectory]) -> list[str]:
        """The env of each trajectory's row."""
        return [env_of(t.row, self.cfg.env.id) for t in trajs]

    def seed_of(self, what: str, step: int | None = None) -> int | None:
        """Sampling seed of this step (or ``step``): a function of (seed, step), so a resumed
        run draws the same samples as an uninterrupted one; None when episodes are unseeded
        (`RolloutConfig.seeded`)."""
        if not self.cfg.rollout.seeded:
            return None
        step = self.step if step is None else step
        return zlib.crc32(f"{self.cfg.seed}:{what}:{step}".encode()) % (2**31 - 1)
