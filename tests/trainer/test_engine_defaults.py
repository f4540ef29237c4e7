"""What the trainer asks of its engines per device: CPU defaults here, GPU defaults there."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolrl.rollout.engine import EngineConfig
from toolrl.trainer.config import ConfigError, load_config
from toolrl.trainer.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
GPU = ["resources.device=cuda", "rollout.engine.backend=gpu",
       "rollout.engine.kv_cache_gib=null"]  # the quickstart sets a CPU KV cache size


@pytest.fixture
def rollout_config(tiny_model_dir, monkeypatch):
    """``(trainer, its rollout config)`` for overrides of a config, on a real model folder
    (vLLM's engine args resolve the model: a path a fresh clone lacks reads as a hub id). GPU
    configs are read on this CPU machine: the pre-flight's device check is left out."""
    from toolrl.trainer import preflight

    monkeypatch.setattr(preflight, "check_devices", lambda cfg: None)

    def make(overrides: list[str], config: Path = QUICKSTART):
        trainer = Trainer(load_config(config, [f"model.path={tiny_model_dir}", *overrides]))
        trainer.model_path = str(tiny_model_dir)
        return trainer, trainer.rollout_config()

    return make


def test_cpu_defaults_are_unchanged(rollout_config):
    trainer, rc = rollout_config([])
    e = rc.engine
    assert (e.backend, e.dtype, e.kv_cache_gib, e.gpu_memory_utilization, e.enforce_eager) == \
        ("cpu", "float32", 1.0, 0.1, True)
    assert not e.enable_sleep_mode and trainer.schedule.sleep_level == 0
    assert rc.seed == 0 and rc.seeded and trainer.seed_of("train") is not None
    assert e.weight_bucket_mb == trainer.cfg.actor.weight_bucket_mb


def test_gpu_defaults_fit_a_gpu(rollout_config):
    trainer, rc = rollout_config(GPU)
    e = rc.engine
    assert (e.backend, e.dtype, e.kv_cache_gib, e.gpu_memory_utilization, e.enforce_eager) == \
        ("gpu", "bfloat16", None, 0.5, False)  # KV cache sized by gpu_memory_utilization
    assert e.weight_transfer == "ipc" and e.enable_sleep_mode and trainer.schedule.sleep_level == 2
    # seeded requests make vLLM's GPU sampler leave its fast kernels: unseeded by default
    assert not rc.seeded and trainer.seed_of("train") is None
    args = e.engine_args()
    assert args.weight_transfer_config.backend == "ipc" and args.enable_sleep_mode
    assert not args.enforce_eager and args.gpu_memory_utilization == 0.5
    assert args.kv_cache_memory_bytes is None

    _, own = rollout_config([*GPU, "rollout.engine.sleep_level=0", "rollout.seed_episodes=true",
                              "rollout.engine.enforce_eager=true", "actor.weight_bucket_mb=64"])
    assert not own.engine.enable_sleep_mode and own.seeded and own.engine.enforce_eager
    assert own.engine.weight_bucket_mb == 64


def test_full_pushes_sleep_at_level_2_adapter_pushes_at_level_1(rollout_config):
    """Every weight is pushed after a wake-up: level 2 drops them (level 1 copied them to host
    and back each step for nothing); a LoRA adapter push needs the base weights kept."""
    assert rollout_config(GPU)[1].engine.sleep_level == 2
    merged = ["actor.lora.rank=8", "actor.lora.sync=merge"]
    assert rollout_config([*GPU, *merged])[1].engine.sleep_level == 2
    adapter = ["actor.lora.rank=8", "actor.lora.sync=adapter"]
    assert rollout_config([*GPU, *adapter])[1].engine.sleep_level == 1
    assert rollout_config([*GPU, "rollout.engine.sleep_level=1"])[1].engine.sleep_level == 1
    assert rollout_config([])[1].engine.sleep_level == 0  # CPU: no sleep mode


def test_sleep_level_2_with_adapter_pushes_is_refused():
    adapter = ["actor.lora.rank=8", "actor.lora.sync=adapter"]
    with pytest.raises(ConfigError, match=r"sleep_level=2 drops the engine's base weights") \
            as info:
        load_config(QUICKSTART, [*GPU, *adapter, "rollout.engine.sleep_level=2"])
    assert "\n" not in str(info.value)
    load_config(QUICKSTART, [*GPU, *adapter, "rollout.engine.sleep_level=1"])  # accepted


def test_pipeline_engines_receive_over_nccl_and_never_sleep(rollout_config):
    trainer, rc = rollout_config(GPU, ROOT / "configs" / "quickstart_pipeline.yaml")
    assert rc.engine.weight_transfer == "nccl" and not rc.engine.enable_sleep_mode
    assert trainer.schedule.sleep_level == 0
    with pytest.raises(ConfigError, match=r"sleep_level > 0 needs trainer\.mode=sync"):
        load_config(ROOT / "configs" / "quickstart_pipeline.yaml",
                    [*GPU, "rollout.engine.sleep_level=1"])
    with pytest.raises(ConfigError, match=r"rollout\.engine\.sleep_level: must be 0, 1 or 2"):
        load_config(QUICKSTART, ["rollout.engine.sleep_level=3"])


def test_engine_config_errors():
    with pytest.raises(ValueError, match="weight_bucket_mb"):
        EngineConfig(model="m", weight_bucket_mb=0)
    with pytest.raises(ValueError, match="weight_transfer"):
        EngineConfig(model="m", weight_transfer="rdma")
    with pytest.raises(ConfigError, match=r"model\.tiny_size"):
        load_config(QUICKSTART, ["model.tiny_size=huge"])


def test_the_engine_reports_the_log_probs_the_actor_recomputes(rollout_config):
    """The actor scores logits / rollout.temperature: raw log-probs match that at 1 only."""
    assert rollout_config([])[1].engine.logprobs_mode == "raw_logprobs"
    tempered = rollout_config(["rollout.temperature=0.7"])[1].engine
    assert tempered.logprobs_mode == "processed_logprobs"
    assert tempered.engine_args().logprobs_mode == "processed_logprobs"
    own = rollout_config(["rollout.temperature=0.7", "rollout.engine.logprobs_mode=raw_logprobs"])
    assert own[1].engine.logprobs_mode == "raw_logprobs"
    assert EngineConfig(model="m").resolved().logprobs_mode == "raw_logprobs"  # standalone
    with pytest.raises(ConfigError, match=r"rollout\.engine\.logprobs_mode: must be one of"):
        load_config(QUICKSTART, ["rollout.engine.logprobs_mode=raw_logits"])
