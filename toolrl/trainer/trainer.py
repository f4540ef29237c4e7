"""The single-controller RL trainer: one driver, Ray worker groups, one step on one screen.

    rollout -> reward -> log-probs -> advantage -> update -> sync

The driver holds the schedule; the math is `toolrl.algo`'s (rewards on tokens, advantages),
and episodes arrive as `toolrl.core.trajectory.Trajectory` records. Workers do the heavy work:
`RolloutWorker` (a vLLM engine running multi-turn episodes), `ActorWorker` (FSDP2 policy),
`RefWorker` and `CriticWorker` (PPO). Roles on the same pool share one process per bundle, so
on one machine the weights go from the actor to the engine in-process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from tensordict import TensorDict

from toolrl import batch as B
from toolrl.algo import (
    apply_kl_in_reward,
    compute_advantage,
    episode_advantage,
    ratio_stats,
    uniform_groups,
)
from toolrl.controller import RoleSpec, init_ray
from toolrl.controller.cluster import kill_local_cluster, kill_process_tree
from toolrl.controller.worker_group import WorkerDiedError, WorkerGroupError
from toolrl.core.trajectory import Trajectory
from toolrl.data import TaskLoader
from toolrl.rollout.gateway.agent import (
    episode_leads,
    one_per_episode,
)
from toolrl.rollout.worker import RolloutWorker, rollout_metrics
from toolrl.trainer import checkpoint as ckpt
from toolrl.trainer.async_mode import AsyncSchedule
from toolrl.trainer.compute import model_shape, rollout_account, step_account
from toolrl.trainer.config import (
    ExperimentConfig,
    save_config,
    to_dict,
    validates_after,
    worker_model_config,
)
from toolrl.trainer.context import RunContext
from toolrl.trainer.failures import RetryCount, RolloutFailedError, describe, settle
from toolrl.trainer.health import HealthMonitor, HealthReport
from toolrl.trainer.memory import check_memory
from toolrl.trainer.mixture import success_by
from toolrl.trainer.pipeline import PipelineSchedule
from toolrl.trainer.preflight import fit_prompt_budget
from toolrl.trainer.progress import ProgressWatchdog, note_phase, watching
from toolrl.trainer.run_dir import RunDirLock, check_same_run
from toolrl.trainer.schedule import SyncSchedule, first, timed
from toolrl.trainer.stopping import RunStopped, stop_requested, stoppable
from toolrl.trainer.tracking import Tracker
from toolrl.trainer.warm_start import warm_started
from toolrl.weights import canary
from toolrl.workers.actor import ActorWorker, RefWorker
from toolrl.workers.compute_dtype import COMPUTE_DTYPE_FILE, is_auto
from toolrl.workers.critic import CriticWorker

ROLES_ORDER = ("actor", "ref", "critic", "rollout")


class Trainer(RunContext):
    """Build workers from an `ExperimentConfig` and run `fit()`."""

    def __init__(self, cfg: ExperimentConfig, console: Console | None = None) -> None:
        super().__init__(cfg, console)
        self.lock: RunDirLock | None = None
        self.health = HealthMonitor(cfg.trainer.health, log=self.console.log)
        self.tracker: Tracker | None = None
        self.retries = RetryCount(cfg.trainer.max_retries)  # trainer.on_rollout_failure: retry
        self.schedule = schedule_of(self)  # trainer.mode: how a step is laid out in time

    # --- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        # a config that cannot fit the machine stops here, before anything is built or started
        plan = check_memory(cfg)
        if plan is not None:
            self.console.log(plan.summary())
        base = self.base_model()
        self.train_rows, self.val_rows = self.load_tasks()
        # every prompt fits rollout.max_prompt_tokens (or over-long rows are dropped)
        self.train_rows, self.val_rows = fit_prompt_budget(
            self.train_rows, self.val_rows, cfg, base, log=self.console.log)
        self.lock = RunDirLock(self.run_dir).acquire()  # a second run here stops now
        check_same_run(self.run_dir, to_dict(cfg), cfg.trainer.resume)  # another run's state
        save_config(cfg, self.run_dir / "config.yaml")
        torch.manual_seed(cfg.seed)
        self.model_path = warm_started(cfg, base, self.run_dir, self.console) \
            if cfg.warm_start.enabled else base
        self.shape = model_shape(self.model_path)  # perf/* metrics (toolrl.trainer.compute)
        self.loader = TaskLoader(self.train_rows, cfg.data.batch_size, seed=cfg.seed,
                                 shuffle=cfg.data.shuffle)
        self.start_workers()
        resume = self.find_resume_point()
        if resume is not None:
            self.restore(resume)
        else:  # a fresh start in a used run dir: metrics of an earlier attempt do not count
            _truncate_metrics(self.run_dir / "metrics.jsonl", -1)
        self.tracker = self.open_tracker()

    def open_tracker(self) -> Tracker:
        cfg = self.cfg
        return Tracker(self.run_dir, cfg.experiment_name, config=_plain(cfg),
                       backends=cfg.trainer.trackers, total_steps=cfg.trainer.total_steps,
                       console=self.console, start_step=self.step)

    def start_workers(self) -> None:
        """Every role of the run: actor (+ reference, critic) and the rollout workers."""
        cfg = self.cfg
        init_ray(num_cpus=cfg.resources.ray_num_cpus, address=cfg.resources.ray_address)
        actor_cfg = worker_model_config(cfg, "actor", self.model_path)
        roles: dict[str, RoleSpec] = {"actor": RoleSpec.of(ActorWorker, actor_cfg)}
        if cfg.reference_worker:
            roles["ref"] = RoleSpec.of(RefWorker, actor_cfg)
        if cfg.algorithm.name == "ppo":
            critic_cfg = worker_model_config(cfg, "critic", self.model_path)
            roles["critic"] = RoleSpec.of(CriticWorker, critic_cfg)
        roles["rollout"] = RoleSpec.of(RolloutWorker, self.rollout_config())
        self.schedule.spawn_roles(roles)
        self.schedule.workers_started()
        self.actor_dtype = first(self.actor.call(ActorWorker.compute_dtype))
        (self.run_dir / COMPUTE_DTYPE_FILE).write_text(json.dumps(self.actor_dtype, indent=2))
        if is_auto(cfg.actor.param_dtype):
            self.console.log(f"actor.param_dtype=auto: the actor computes in "
                             f"{self.actor_dtype['dtype']} ({self.actor_dtype['reason']})")

    # --- one step ------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One step as ``trainer.mode`` lays it out (the schedule's)."""
        return self.schedule.train_step()

    def sync_weights(self) -> int:
        """Push the actor's weights into the engines; the new policy version."""
        return self.schedule.sync_weights()

    def learned_nothing(self) -> dict[str, float]:
        """Every episode of the batch failed for infrastructure reasons (and were dropped)."""
        self._last_batch = None
        return {}

    def settle(self, batch: TensorDict) -> tuple[TensorDict | None, dict[str, float]]:
        """Episodes the infrastructure failed never train: refilled (run again, same group)
        or dropped per ``trainer.infra_failures`` (`toolrl.trainer.failures.settle`)."""
        def rerun(rows: list[dict[str, Any]], uids: list[str], attempt: int) -> TensorDict:
            return self.rollout(rows, 1, seed=self.seed_of(f"refill{attempt}"), uids=uids)

        self._infra_failed = [t for t in B.trajectories(batch) if t.infra_failure is not None]
        return settle(batch, self.cfg.trainer.infra_failures, rerun)

    def check_sync(self, version: int) -> dict[str, float]:
        """The weight-sync canary (`toolrl.weights.canary`): every engine and the actor score
        the same probe; the dtype's statistic of the gaps past its tolerance stops the run
        (or warns: ``trainer.sync_canary``, ``auto`` by the dtype of the less precise side:
        the engine's, or the actor's compute dtype)."""
        dtype = canary.rule_dtype(self.rollout_config().engine.dtype,
                                  self.actor_dtype["dtype"])
        mode = canary.mode(self.cfg.trainer.sync_canary, dtype)
        if mode == "off":
            return {}
        start = time.perf_counter()
        probes = self.handles["rollout"].call(  # at the temperature the actor scores with
            RolloutWorker.probe, canary.PROBE_TEXTS, canary.PROBE_TOKENS, canary.PROBE_SEED,
            self.cfg.rollout.temperature)
        scored = [self.actor.call(ActorWorker.compute_log_prob, p) for p in probes]
        stats = [canary.probe_stats(p[B.ROLLOUT_LOG_PROBS], s[B.OLD_LOG_PROBS],
                                    p[B.RESPONSE_MASK]) for p, s in zip(probes, scored,
                                                                       strict=True)]
        stat = canary.statistic(dtype)
        bound = canary.tolerance(dtype, self.cfg.trainer.sync_canary_tolerance)
        problem = canary.verdict([s[stat] for s in stats], bound, version, stat)
        if problem is not None:
            if mode == "stop":
                raise canary.SyncCanaryError(problem)
            self.console.log(f"[yellow]warning:[/] {problem}")
        return {"sync/probe_max_abs_diff": canary.max_diff([s["max"] for s in stats]),
                "sync/probe_mean_abs_diff": canary.max_diff([s["mean"] for s in stats]),
                "timing/sync_probe_s": time.perf_counter() - start}  # within timing/sync_s

    def learn(self, batch: TensorDict, timing: dict[str, float]) -> dict[str, float]:
        """reward -> log-probs -> advantage -> update on a finished rollout ``batch``; phase
        times go into ``timing``. Returns the step's metrics."""
        with timed(timing, "reward"):
            reward_metrics = self.score(batch)
        train, adv_metrics = self.informative(batch)
        metrics: dict[str, float] = {}
        if train is not None:
            metrics, more = self.train_on(train, timing)
            adv_metrics.update(more)
            critic = "critic" in self.handles  # same body: its update and values count too
            metrics.update(step_account(
                self.shape, train, timing, epochs=self.cfg.actor.ppo_epochs * (1 + critic),
                log_prob_passes=int(self.needs_old_log_probs) + critic + int(
                    "ref" in self.handles or self.cfg.needs_reference)))
        for key in ("log_prob_diff_abs_mean", "log_prob_diff_abs_max"):  # on-policy steps
            if f"actor/{key}" in metrics:
                metrics[f"rollout/{key}"] = metrics.pop(f"actor/{key}")
        metrics.update(reward_metrics)
        metrics.update(adv_metrics)
        metrics.update(rollout_metrics(batch))
        metrics.update(rollout_account(self.shape, batch, timing.get("rollout")))
        warning = None if self._warned_uncorrected else uncorrected_warning(metrics, self.cfg)
        if warning is not None:
            self._warned_uncorrected = True
            self.console.log(f"[yellow]warning:[/] {warning}")
        trajs = one_per_episode(B.trajectories(batch))
        metrics["train/success"] = sum(t.success for t in trajs) / len(trajs)
        if self.mixed:
            metrics.update(success_by("train/success", trajs, self.envs_of(trajs)))
        self._last_batch = batch
        return metrics

    def informative(self, batch: TensorDict) -> tuple[TensorDict | None, dict[str, float]]:
        """The rows to train on: all of ``batch``, or with ``algorithm.filter_groups`` those of
        groups whose rewards differ (None when no group does: the step trains on nothing)."""
        uids = B.get_non_tensor(batch, B.UID)
        uniform = uniform_groups(batch[B.TOKEN_LEVEL_SCORES].sum(-1), uids)
        flat = {u for u, f in zip(uids, uniform.tolist(), strict=True) if f}
        metrics = {"train/uniform_groups": len(flat) / max(len(set(uids)), 1)}
        if not self.cfg.algorithm.filter_groups or not uniform.any():
            return batch, metrics
        keep = (~uniform).nonzero().flatten().tolist()
        metrics["train/update_samples"] = float(len(keep))
        return (B.select_rows(batch, keep) if keep else None), metrics

    def train_on(self, batch: TensorDict, timing: dict[str, float]
                 ) -> tuple[dict[str, float], dict[str, float]]:
        """log-probs -> advantage -> update on the rows to train on; returns the update's and
        the advantage's metrics."""
        with timed(timing, "log_probs"):
            if self.needs_old_log_probs:
                batch.update(self.actor.call(ActorWorker.compute_log_prob, batch))
            if "ref" in self.handles:
                batch.update(self.handles["ref"].call(RefWorker.compute_ref_log_prob, batch))
            elif self.cfg.needs_reference:  # a LoRA actor's base model: its adapter switched off
                batch.update(self.actor.call(ActorWorker.compute_ref_log_prob, batch))
            if "critic" in self.handles:
                batch.update(self.handles["critic"].call(CriticWorker.compute_values, batch))
        with timed(timing, "advantage"):
            adv_metrics = self.compute_advantages(batch)
            adv_metrics.update(_mismatch_metrics(batch))
        with timed(timing, "update"):
            metrics = first(self.actor.call(ActorWorker.update, batch))
            if "critic" in self.handles:
                metrics.update(first(self.handles["critic"].call(CriticWorker.update_critic,
                                                                  batch)))
        return metrics, adv_metrics

    @property
    def needs_old_log_probs(self) -> bool:
        """A separate forward for ``old_log_probs`` unless the update is on-policy (one
        optimizer step, no TIS) and no in-reward KL reads them."""
        return not self.cfg.actor.on_policy or self.cfg.algorithm.kl_in_reward_coef > 0

    def compute_advantages(self, batch: TensorDict) -> dict[str, float]:
        cfg = self.cfg.algorithm
        mask = batch[B.RESPONSE_MASK]
        metrics: dict[str, float] = {}
        rewards = batch[B.TOKEN_LEVEL_SCORES]
        if cfg.kl_in_reward_coef > 0:
            rewards, kl_metrics = apply_kl_in_reward(rewards, batch[B.OLD_LOG_PROBS],
                                                     batch[B.REF_LOG_PROBS], mask,
                                                     cfg.kl_in_reward_coef, cfg.kl_in_reward_kind)
            metrics.update(kl_metrics)
        batch.set(B.TOKEN_LEVEL_REWARDS, rewards)
        uids = B.get_non_tensor(batch, B.UID)
        values = batch.get(B.VALUES, None)
        leads = episode_leads(B.trajectories(batch))  # agent episodes split into samples
        if leads is None:
            adv, ret = compute_advantage(cfg.advantage, rewards, mask, uids=uids, values=values,
                                         gamma=cfg.gamma, lam=cfg.lam)
        else:
            adv, ret = episode_advantage(cfg.advantage, rewards, mask, leads, uids,
                                         values=values, gamma=cfg.gamma, lam=cfg.lam)
            batch.set(B.EPISODE, torch.tensor(leads))  # its rows share a mini-batch
        batch.set(B.ADVANTAGES, adv)
        batch.set(B.RETURNS, ret)
        valid = mask.bool()
        metrics["advantage/mean"] = float(adv[valid].mean()) if valid.any() else 0.0
        metrics["advantage/abs_mean"] = float(adv[valid].abs().mean()) if valid.any() else 0.0
        return metrics

    # --- validation ----------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Greedy episodes on the held-out rows: success overall, per category and (in a run
        of several envs) per env; the configured reward (``val/reward_mean``, components as
        ``val/reward/<alias>``) and the env's own (``val/env_reward_mean``)."""
        batch = self.rollout(self.val_rows, 1, seed=self.seed_of("val"),
                             greedy=self.cfg.rollout.val_temperature == 0.0)
        every = one_per_episode(B.trajectories(batch))  # an episode split into samples: once
        trajs = [t for t in every if t.infra_failure is None]  # not the policy's to answer for
        out = {"val/success": sum(t.success for t in trajs) / max(len(trajs), 1),
               "val/infra_failed": float(len(every) - len(trajs))}
        by_cat: dict[str, list[bool]] = {}
        for t in trajs:
            by_cat.setdefault(str(t.row.get("category", "all")), []).append(t.success)
        if len(by_cat) > 1:
            out.update({f"val/success/{c}": sum(v) / len(v) for c, v in by_cat.items()})
        if self.mixed:
            out.update(success_by("val/success", trajs, self.envs_of(trajs)))
        results, reward_metrics = self.reward.score(trajs, self.envs_of(trajs))
        out["val/reward_mean"] = sum(r.score for r in results) / max(len(results), 1)
        out.update({f"val/{k}": v for k, v in reward_metrics.items() if k != "reward/total"})
        out["val/env_reward_mean"] = sum(t.env_reward for t in trajs) / max(len(trajs), 1)
        return out

    # --- the loop ------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Train ``trainer.total_steps`` steps; returns the final metrics."""
        if self.tracker is None:
            self.setup()
        assert self.tracker is not None
        cfg = self.cfg.trainer
        first_val: float | None = None
        last: dict[str, float] = {}
        try:
            with watching(self.make_watchdog()) as self.watchdog:
                if self.step == 0 and validates_after(0, cfg):
                    note_phase("validation")
                    val = self.validate()
                    first_val = val["val/success"]
                    self.tracker.log(0, val)
                with stoppable(cfg.stop_grace_s):
                    while self.step < cfg.total_steps:
                        try:
                            last = self.run_step()
                        except (RolloutFailedError, WorkerDiedError) as e:
                            self.recover(e)  # raises unless trainer.on_rollout_failure retries
                            if self.watchdog is not None:
                                self.watchdog.restart_clock()
                        if (signum := stop_requested()) is not None:
                            raise RunStopped(signum, self.step, self.save_if_due())
                if cfg.export_hf:
                    note_phase("export")
                    self.export_final()
        finally:
            try:
                self.schedule.stop()
            finally:
                self.tracker.close()
        self.summarize(first_val, last)
        return last

    # --- progress (trainer.watchdog, `toolrl.trainer.progress`) -----------------------------
    def make_watchdog(self) -> ProgressWatchdog | None:
        wd = self.cfg.trainer.watchdog
        if not wd.enabled:
            return None
        return ProgressWatchdog(wd, self.run_dir, step=lambda: self.step,
                                waits=self.stall_waits, dump_workers=self.dump_worker_stacks,
                                kill_workers=self.kill_workers, recover=self.recover_stall)

    def worker_groups(self) -> list[Any]:
        return list({id(h.group): h.group for h in self.handles.values()}.values())

    def stall_waits(self) -> list[str]:
        """The worker calls the driver waits on now, and what the schedule waits for (the stall
        line names them)."""
        return [*(g.waiting for g in self.worker_groups() if g.waiting),
                *self.schedule.stall_waits()]

    def dump_worker_stacks(self, directory: Path) -> list[Path]:
        return [Path(f) for g in self.worker_groups() for f in g.dump_stacks(directory)]

    def kill_workers(self) -> None:
        """The watchdog's hard stop: SIGKILL every worker process (and what they started)."""
        for group in self.worker_groups():
            for pid in group.pids:
                kill_process_tree(pid)
        kill_local_cluster()

    def recover_stall(self, phase: str) -> str | None:
        """The watchdog's first resort, the same in every mode: with
        ``trainer.on_rollout_failure: retry`` and a retry left, a stall in the rollout kills
        the rollout workers, so the driver's wait fails as on a dead worker and the retry path
        restarts them and redoes the batch. None: the run stops."""
        cfg = self.cfg.trainer
        if cfg.on_rollout_failure != "retry" or not self.retries.allows() or \
                not phase.startswith("rollout") or "rollout" not in self.handles:
            return None
        pids = list(self.handles["rollout"].group.pids)
        for pid in pids:
            kill_process_tree(pid)
        return (f"killed the rollout worker(s) (pids {pids}): trainer.on_rollout_failure=retry "
                f"restarts them and redoes the batch")

    @property
    def stalled(self) -> bool:
        return self.watchdog is not None and self.watchdog.fired is not None

    def export_final(self) -> None:
        """``final_hf/``: the trained model. A LoRA actor also writes ``final_adapter/`` (PEFT
        format) and writes ``final_hf/`` (merged) only with ``actor.lora.export_merged``."""
        lora = self.cfg.actor.lora
        if lora.enabled:
            self.actor.call(ActorWorker.export_hf, str(self.run_dir / "final_adapter"))
            if not lora.export_merged:
                return
        self.actor.call(ActorWorker.export_hf, str(self.run_dir / "final_hf"),
                        merged=lora.enabled)

    def check_health(self) -> HealthReport:
        """The last step's `HealthReport` (its failures printed, counted): the batch it
        trained on, and the episodes the infrastructure failed (printed, not counted)."""
        trajs = B.trajectories(self._last_batch) if self._last_batch is not None else []
        trajs = [*trajs, *self._infra_failed]
        return self.health.check(self.step, trajs, self.envs_of(trajs),
                                 self.reward.last_failures)

    def run_step(self) -> dict[str, float]:
        """One step with its validation, logging and checkpoint; returns its metrics."""
        cfg = self.cfg.trainer
        start = time.perf_counter()
        metrics = self.train_step()
        self.step += 1
        metrics["timing/step_s"] = time.perf_counter() - start
        if validates_after(self.step, cfg):
            note_phase("validation")
            metrics.update(self.validate())
        metrics["trainer/rollout_retries"] = float(self.retries.total)
        health = self.check_health()
        metrics.update(health.metrics)
        assert self.tracker is not None
        self.tracker.log(self.step, metrics)
        self.dump_rollouts()
        self.health.act(health)  # an unhealthy step stops the run (or warns)
        if cfg.save_every and self.step % cfg.save_every == 0:
            note_phase("checkpoint")
            self.save()
        self.retries.step_done(self.step)
        if self.watchdog is not None:
            self.watchdog.step_done()
        return metrics

    # --- rollout failures (trainer.on_rollout_failure) -------------------------------------
    def retry_or_stop(self, error: BaseException) -> None:
        """Raise `RolloutFailedError` unless ``on_rollout_failure=retry`` has a retry left;
        else count one."""
        cfg = self.cfg.trainer
        if cfg.on_rollout_failure != "retry" or not self.retries.allows():
            why = ("trainer.on_rollout_failure=stop" if cfg.on_rollout_failure != "retry"
                   else f"{self.retries.in_a_row} retries in a row (trainer.max_retries="
                        f"{cfg.max_retries})")
            what = str(error) if isinstance(error, RolloutFailedError) else describe(error)
            raise RolloutFailedError(
                f"{what}; the run stops ({why}) after step {self.step}, the last "
                f"step trained, synced and logged: no step trained on any part of the failed "
                f"batch. trainer.resume=auto continues from the last checkpoint") from error
        self.retries.failed(self.step)
        self.console.log(f"[yellow]rollout failed[/] ({error}); retry "
                         f"{self.retries.in_a_row} of {cfg.max_retries}")

    def recover(self, error: BaseException) -> None:
        """After a failed step: stop, or redo it. A rollout that raised on a healthy worker
        is redone as is; a dead or hung worker is restarted, and since the rollout role shares
        its process with the actor, the actor too: the run goes on from the last complete
        checkpoint (or from the start), whose step is redone with the same rows and seeds."""
        if self.schedule.retries_in_step:  # the schedule retried what could be: stop
            raise error
        self.retry_or_stop(error)
        if not isinstance(error.__cause__, WorkerGroupError) and \
                not isinstance(error, WorkerDiedError) and self._rollout_healthy():
            self.loader.load_state_dict(self.step_data)
            return
        self.restart_workers()

    def _rollout_healthy(self) -> bool:
        try:
            return all(self.handles["rollout"].call_async(RolloutWorker.check_health)
                       .get(timeout=60))
        except Exception:
            return False

    def restart_workers(self) -> None:
        """Kill every worker group, start them again and resume from the newest complete
        checkpoint (or step 0); metrics after that step are dropped (they are redone)."""
        assert self.tracker is not None
        self.tracker.close()
        self.shutdown_workers()
        self.start_workers()
        path = ckpt.latest_checkpoint(self.run_dir / "checkpoints")
        if path is not None:
            self.restore(path)
        else:
            self.step = 0
            self.loader = TaskLoader(self.train_rows, self.cfg.data.batch_size,
                                     seed=self.cfg.seed, shuffle=self.cfg.data.shuffle)
            _truncate_metrics(self.run_dir / "metrics.jsonl", 0)
        self.console.log(f"workers restarted; the run goes on from step {self.step}")
        self.tracker = self.open_tracker()

    def dump_rollouts(self) -> None:
        n = self.cfg.trainer.log_rollouts
        if not n or self._last_batch is None:
            return
        trajs = B.trajectories(self._last_batch)[:n]
        scores = self._last_batch[B.TOKEN_LEVEL_SCORES].sum(-1).tolist()[:n]
        self.tracker.log_rollouts(self.step, [{"reward": s, **t.to_dict()}
                                              for t, s in zip(trajs, scores, strict=True)])

    def summarize(self, first_val: float | None, last: Mapping[str, float]) -> None:
        table = Table(title=f"{self.cfg.experiment_name}: done at step {self.step}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        if first_val is not None:
            table.add_row("val/success at step 0", f"{first_val:.3f}")
        for key in ("val/success", "val/reward_mean", "train/success", "train/reward_mean"):
            if key in last:
                table.add_row(f"{key} (final)", f"{last[key]:.3f}")
        table.add_row("run dir", str(self.run_dir))
        self.console.print(table)

    # --- checkpoints ---------------------------------------------------------------------------
    def save(self) -> Path:
        root, keep = self.run_dir / "checkpoints", self.cfg.trainer.keep_checkpoints
        with self.schedule.checkpoint_position(), \
                ckpt.atomic_checkpoint(root, self.step, keep=keep) as d:
            self.actor.call(ActorWorker.save_checkpoint, str(d / "actor"))
            if "critic" in self.handles:
                self.handles["critic"].call(CriticWorker.save_checkpoint, str(d / "critic"))
            ckpt.save_trainer_state(d, self.trainer_state())
        return ckpt.checkpoint_dir(root, self.step)

    def save_if_due(self) -> Path | None:
        """A checkpoint of this step unless it has one (or no step ran): a run stopped by a
        signal resumes here."""
        latest = ckpt.latest_checkpoint(self.run_dir / "checkpoints")
        if self.step == 0 or (latest is not None and latest == ckpt.checkpoint_dir(
                self.run_dir / "checkpoints", self.step)):
            return None
        note_phase("checkpoint")
        return self.save()

    def trainer_state(self) -> dict[str, Any]:
        """What a checkpoint holds beside the models: the step, the data position and what the
        schedule adds."""
        return {"step": self.step, "data": self.loader.state_dict(), **self.schedule.state()}

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.loader.load_state_dict(state["data"])
        self.schedule.load_state(state)

    def find_resume_point(self) -> Path | None:
        mode = self.cfg.trainer.resume
        if mode == "never":
            return None
        if mode == "auto":
            return ckpt.latest_checkpoint(self.run_dir / "checkpoints")
        path = Path(mode)
        if not (path / ckpt.COMPLETE).exists():
            raise FileNotFoundError(f"trainer.resume={mode!r} is not a complete checkpoint")
        return path

    def restore(self, path: Path) -> None:
        self.actor.call(ActorWorker.load_checkpoint, str(path / "actor"))
        if "critic" in self.handles:
            self.handles["critic"].call(CriticWorker.load_checkpoint, str(path / "critic"))
        self.load_trainer_state(ckpt.load_trainer_state(path))
        self.actor.call(ActorWorker.set_policy_version, self.step - 1)
        self.sync_weights()  # the engine gets the restored weights, as version `step`
        _truncate_metrics(self.run_dir / "metrics.jsonl", self.step)
        self.console.log(f"resumed from {path} at step {self.step}")

    def close(self) -> None:
        super().close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # --- helpers -------------------------------------------------------------------------------
    @property
    def actor(self) -> Any:
        return self.handles["actor"]

    _last_batch: TensorDict | None = None
    actor_dtype: Mapping[str, Any] = MappingProxyType({"dtype": "float32"})  # start_workers's
    watchdog: ProgressWatchdog | None = None
    _infra_failed: Sequence[Trajectory] = ()  # the last batch's, as generated (health notes)
    _warned_uncorrected = False  # the grammar-constrained samples' warning, once per run
    step_data: dict[str, int] | None = None  # the loader's position before this step's rows


def uncorrected_warning(metrics: Mapping[str, float], cfg: ExperimentConfig) -> str | None:
    """The warning for a step whose gateway samples were grammar-constrained (``tool_choice``
    required or named: tokens sampled off the actor's distribution) while the config lists no
    correction and does not say ``trainer.allow_uncorrected``; None otherwise."""
    calls = metrics.get("rollout/gateway_constrained_calls", 0.0)
    if not calls or cfg.actor.loss.corrections or cfg.trainer.allow_uncorrected:
        return None
    return (f"{calls:.0f} of this step's agent calls were sampled through a grammar "
            f"(tool_choice required or a named function): their tokens are off the actor's "
            f"distribution and actor.loss.corrections is empty; list one (e.g. "
            f"'actor.loss.corrections=[{{name: mis}}]', docs/guides/algorithms.md) or set "
            f"trainer.allow_uncorrected=true")


def _mismatch_metrics(batch: TensorDict) -> dict[str, float]:
    """How far the trainer's log-probs are from the engine's on the sampled tokens (a large
    value means the rollout and the update see different models or misaligned tokens): the
    importance ratio's distribution (``correction/ratio_*``) and ``rollout/log_prob_diff_abs_*``
    (mean, p99, max) over the trained tokens."""
    if B.ROLLOUT_LOG_PROBS not in batch or B.OLD_LOG_PROBS not in batch:
        return {}
    stats = ratio_stats(batch[B.OLD_LOG_PROBS], batch[B.ROLLOUT_LOG_PROBS],
                        batch[B.RESPONSE_MASK])
    return {(f"rollout/{k}" if k.startswith("log_prob") else f"correction/{k}"): v
            for k, v in stats.items()}


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after ``step`` (a run killed after its last checkpoint redoes them)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(path)


def _plain(cfg: ExperimentConfig) -> dict[str, Any]:
    return to_dict(cfg)


SCHEDULES: dict[str, type[SyncSchedule]] = {
    "sync": SyncSchedule, "pipeline": PipelineSchedule, "async": AsyncSchedule}
"""``trainer.mode`` -> the schedule the trainer composes."""


def schedule_of(trainer: Trainer) -> SyncSchedule:
    """The schedule of ``trainer.mode``."""
    return SCHEDULES[trainer.cfg.trainer.mode](trainer)
