"""Small end-to-end trainer runs shared by the trainer and fault tests (not a test module)."""

from __future__ import annotations

import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def register_test_rewards() -> None:
    """A dense, varied reward even for a random model: the share of digits in its text."""
    from toolrl.reward import REWARDS, reward

    if "test_even_tasks_flat" in REWARDS:
        return

    @reward("test_digit_fraction")
    def digit_fraction(traj) -> float:
        text = "".join(t.action for t in traj.turns)
        return sum(c.isdigit() for c in text) / max(len(text), 1)

    @reward("test_even_tasks_flat")
    def even_tasks_flat(traj) -> float:
        """1 for every sample of an even-numbered task (a group with nothing to prefer), a
        random value otherwise (samples of a tiny untrained model can be identical)."""
        if int(str(traj.row["id"]).rsplit("-", 1)[-1]) % 2 == 0:
            return 1.0
        return random.random()


def small_run_overrides(model: Path, out: Path, **extra: object) -> list[str]:
    """``key=value`` overrides that make any config a seconds-per-step run on the tiny model."""
    base = {
        "model.path": str(model), "trainer.output_dir": str(out), "warm_start.enabled": False,
        "data.batch_size": 2, "data.val_size": 4, "data.train_size": 64,
        "algorithm.group_size": 4, "rollout.max_tokens_per_turn": 16,
        "rollout.max_total_tokens": 256, "rollout.max_prompt_tokens": 192,
        "rollout.engine.max_model_len": 256,
        # the engine inside the rollout worker: its own process re-imports vLLM and torch,
        # ~8 s of every run's start on 2 cores; the tests of the engine process (signals, a
        # killed driver, tests/rollout/test_engine.py) ask for it
        "rollout.engine.multiprocessing": False,
        # a quarter of the quickstart's 1 GiB: ~250k tokens of the tiny model's KV, and a
        # quarter of the pages every engine start zeroes
        "rollout.engine.kv_cache_gib": 0.25,
        "rollout.max_turns": 2, "trainer.val_every": 1000, "trainer.log_rollouts": 2,
        "resources.ray_num_cpus": 8,
        "reward": "{rewards: [{name: test_digit_fraction}, {name: success}]}",
    }
    base.update(extra)
    return [f"{k}={'null' if v is None else v}" for k, v in base.items()]


def run_training_in_process(overrides: list[str], config: str = "configs/quickstart.yaml"
                            ) -> list[dict]:
    """Train with ``config`` + ``overrides`` in this process; returns metrics.jsonl rows."""
    from toolrl.trainer.config import load_config
    from toolrl.trainer.tracking import read_metrics
    from toolrl.trainer.trainer import Trainer

    register_test_rewards()
    cfg = load_config(ROOT / config, overrides)
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return read_metrics(cfg.run_dir / "metrics.jsonl")


if __name__ == "__main__":  # a training run in a child process (tests that kill it)
    import sys

    run_training_in_process(sys.argv[1:])


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The processes of ``pids`` still alive (zombies count as gone) after up to ``timeout`` s."""
    import time

    import psutil

    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    return alive
