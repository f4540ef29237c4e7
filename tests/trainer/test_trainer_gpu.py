"""The trainer's GPU routes on the real stack: a colocated engine that sleeps while the actor
trains, and split pools whose engines receive the weights over vLLM's NCCL weight transfer.
Skipped without a GPU (the NCCL route needs two)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("ray", reason="the trainer runs on Ray")
pytest.importorskip("vllm", reason="the trainer's engine is vLLM")
from trainer_runs import register_test_rewards, small_run_overrides

from toolrl import batch as B
from toolrl.trainer.config import load_config, worker_rollout_config
from toolrl.trainer.tracking import read_metrics
from toolrl.trainer.trainer import Trainer
from toolrl.workers.actor import ActorWorker

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
DEVICES = 2  # for toolrl test-scheduler: the split-pool test needs two GPUs
ROOT = Path(__file__).resolve().parents[2]
GPU = {"resources.device": "cuda", "rollout.engine.backend": "gpu",
       "rollout.engine.kv_cache_gib": None, "rollout.engine.dtype": "float32",
       "rollout.engine.gpu_memory_utilization": 0.3, "actor.weight_bucket_mb": 1}


def _gap(batch) -> float:
    mask = batch[B.RESPONSE_MASK].bool()
    return float((batch[B.ROLLOUT_LOG_PROBS] - batch[B.OLD_LOG_PROBS])[mask].abs().max())


def test_colocated_engine_sleeps_during_the_update(ray_cluster, tiny_model_dir, tmp_path):
    register_test_rewards()
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", small_run_overrides(
        tiny_model_dir, tmp_path, **GPU, **{"trainer.total_steps": 2, "actor.lr": 1e-3}))
    assert worker_rollout_config(cfg).engine.sleep_level == 2  # full pushes: weights dropped
    trainer = Trainer(cfg)
    try:
        trainer.fit()
        rows = read_metrics(tmp_path / "metrics.jsonl")
        assert [r["policy_version"] for r in rows if r["step"] >= 1] == [1.0, 2.0]
        # after sleeping, waking and the push, the engine samples from the actor's weights
        fresh = trainer.rollout(trainer.val_rows, 2, seed=None)
        fresh.update(trainer.actor.call(ActorWorker.compute_log_prob, fresh))
        assert _gap(fresh) < 1e-3
    finally:
        trainer.close()


def _assert_engine_follows_actor(trainer) -> None:
    """After one more push, the engine samples with the new version and scores like the actor."""
    version = trainer.sync_weights()
    fresh = trainer.rollout(trainer.val_rows, 2, seed=None)
    assert set(fresh[B.POLICY_VERSION].tolist()) == {version}
    fresh.update(trainer.actor.call(ActorWorker.compute_log_prob, fresh))
    assert _gap(fresh) < 1e-3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="split pools need two GPUs")
def test_split_pools_receive_over_nccl_in_vllms_worker(ray_cluster, tiny_model_dir, tmp_path):

    register_test_rewards()
    cfg = load_config(ROOT / "configs" / "quickstart_pipeline.yaml", small_run_overrides(
        tiny_model_dir, tmp_path, **GPU, **{"trainer.total_steps": 2, "actor.lr": 1e-3}))
    trainer = Trainer(cfg)
    try:
        trainer.fit()
        assert trainer.schedule.sync_backend == "nccl" and trainer.schedule.weight_meta
        _assert_engine_follows_actor(trainer)
    finally:
        trainer.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="split pools need two GPUs")
def test_async_mode_pushes_over_nccl_while_the_engine_streams(ray_cluster, tiny_model_dir,
                                                              tmp_path):
    """``trainer.mode=async`` on GPUs: the NCCL push lands while the stream's requests are
    frozen (``keep_inflight``), every step within the staleness bound, engine = actor after."""

    register_test_rewards()
    cfg = load_config(ROOT / "configs" / "quickstart_async.yaml", small_run_overrides(
        tiny_model_dir, tmp_path, **GPU, **{"trainer.total_steps": 3, "actor.lr": 1e-3,
                                            "trainer.max_staleness": 1}))
    trainer = Trainer(cfg)
    try:
        trainer.fit()
        assert trainer.schedule.sync_backend == "nccl" and trainer.schedule.weight_meta
        rows = read_metrics(tmp_path / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1, 2, 3]
        assert all(r["async/staleness_max"] <= 1 and r["async/push_pause_s"] > 0
                   for r in rows[1:])
        _assert_engine_follows_actor(trainer)
    finally:
        trainer.close()
