"""The experiment's ``rollout:`` section is the rollout worker's own `RolloutConfig` (and
``rollout.engine`` the engine's `EngineConfig`): no twin classes, no field-by-field copy."""

from __future__ import annotations

import pytest

from toolrl.rollout.engine import EngineConfig
from toolrl.rollout.episode import EpisodeRunner
from toolrl.rollout.worker import RolloutConfig, resolve_runner
from toolrl.trainer.config import ConfigError, load_config
from toolrl.trainer.trainer import Trainer


def test_the_section_is_the_workers_config_and_the_trainer_fills_its_part(tmp_path):
    cfg = load_config("configs/quickstart.yaml", [
        f"trainer.output_dir={tmp_path}", "rollout.engine.block_size=64",
        "rollout.runner=toolrl.rollout.episode:EpisodeRunner", "env.kwargs={style: plain}"])
    assert type(cfg.rollout) is RolloutConfig and type(cfg.rollout.engine) is EngineConfig
    assert cfg.rollout.max_prompt_len + cfg.rollout.max_response_len == 384
    trainer = Trainer(cfg)
    trainer.model_path = "some/checkpoint"
    worker = trainer.rollout_config()
    assert worker.engine.model == "some/checkpoint" and worker.engine.seed == cfg.seed
    assert worker.env_id == cfg.env.id and worker.env_kwargs == {"style": "plain"}
    assert worker.seed == cfg.seed and worker.engine.block_size == 64  # any engine key works
    assert worker.sampling.max_tokens == 40 and worker.sampling.temperature == 1.0
    assert resolve_runner(worker.runner) is EpisodeRunner
    assert cfg.rollout.engine.model == ""  # the config itself is left as written


@pytest.mark.parametrize("override,source", [
    ("rollout.env_id=toolrl/Bank-v0", "env.id"), ("rollout.seed=3", "seed"),
    ("rollout.engine.model=elsewhere", "model.path"), ("rollout.env_kwargs={a: 1}", "env.kwargs"),
    ("actor.total_steps=50", "trainer.total_steps"), ("actor.updates_per_step=2", "ppo_epochs"),
    ("critic.model_path=elsewhere", "model.path"), ("actor.seed=3", "seed"),
    ("actor.temperature=0.5", "rollout.temperature"),
])
def test_keys_the_trainer_fills_are_errors_not_silent_no_ops(override, source):
    with pytest.raises(ConfigError, match=f"set by the trainer from {source}"):
        load_config("configs/quickstart.yaml", [override])


def test_budgets_and_backend_are_checked_with_the_keys_named():
    with pytest.raises(ConfigError, match=r"max_total_tokens \(4096\) exceeds "
                                          r"engine.max_model_len \(512\)"):
        load_config("configs/quickstart.yaml", ["rollout.max_total_tokens=4096"])
    with pytest.raises(ConfigError,
                       match=r"rollout.engine.backend='tpu' is not valid; choose one of "
                             r"\['cpu', 'gpu'\]"):
        load_config("configs/quickstart.yaml", ["rollout.engine.backend=tpu"])
    with pytest.raises(ConfigError, match=r"rollout\.concurrency: must be >= 1"):
        load_config("configs/quickstart.yaml", ["rollout.concurrency=0"])
