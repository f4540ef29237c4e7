"""A RolloutWorker inside a Ray worker group: split, rollout, weight push, clean shutdown."""

from __future__ import annotations

import psutil
import pytest
import torch
from toolrl.envs.calculator import CalculatorEnv
from transformers import AutoModelForCausalLM

from toolrl import batch as B
from toolrl.controller import RayResourcePool, RayWorkerGroup
from toolrl.rollout.engine import EngineConfig
from toolrl.rollout.worker import RolloutConfig, RolloutWorker, make_rollout_input

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_rollout_worker_in_a_ray_group(ray_cluster, tiny_model_dir):
    config = RolloutConfig(
        engine=EngineConfig(model=str(tiny_model_dir), max_model_len=768, kv_cache_gib=0.25,
                            multiprocessing=False),
        max_tokens_per_turn=16, max_prompt_tokens=512, max_total_tokens=768, max_turns=32,
        env_id="toolrl/Calculator-v0", concurrency=8)
    pool = RayResourcePool([1], name="rollout-test", cpus_per_process=0.5)
    group = RayWorkerGroup(pool, RolloutWorker, config, call_timeout_s=600,
                           ready_timeout_s=600)
    pids: list[int] = []
    try:
        [pids] = group.call(RolloutWorker.engine_pids)
        assert pids and all(psutil.pid_exists(p) for p in pids)
        rows = CalculatorEnv.make_tasks(3, seed=0)
        td = group.call(RolloutWorker.rollout, make_rollout_input(rows, n=2))
        assert td.batch_size == torch.Size([6])
        assert td[B.RESPONSES].shape == (6, 256) and td[B.PROMPTS].shape == (6, 512)
        assert B.get_non_tensor(td, B.UID) == [r["id"] for r in rows for _ in range(2)]
        records = B.trajectories(td)
        assert [r.id for r in records] == [r["id"] for r in rows for _ in range(2)]
        assert all(r.sampled_tokens == int(m.sum())
                   for r, m in zip(records, td[B.RESPONSE_MASK], strict=True))

        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        assert group.call(RolloutWorker.load_weights, model.state_dict()) == [1]
        td = group.call(RolloutWorker.rollout, make_rollout_input(rows[:1]))
        assert td[B.POLICY_VERSION].tolist() == [1]
        assert group.call(RolloutWorker.check_health) == [True]
        group.call(RolloutWorker.shutdown)
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"engine processes left running: {alive}"
    finally:
        group.shutdown()
        pool.release()
        # a failed call above must not leave an orphaned engine behind
        for p in pids:
            if psutil.pid_exists(p):
                psutil.Process(p).kill()
