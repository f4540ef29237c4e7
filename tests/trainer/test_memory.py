"""The pre-flight memory plan: estimates that follow the config, and a config that cannot fit
refused before anything is built or started."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from toolrl.models.tiny import REAL_SHAPES, shape_config, tiny_config
from toolrl.trainer.config import ConfigError, load_config, worker_rollout_config
from toolrl.trainer.memory import (
    GiB,
    MemoryBudgetError,
    ModelShape,
    check_memory,
    episode_lengths,
    micro_batch_tokens,
    plan_memory,
)

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
SCALE = ROOT / "configs" / "scale_0p5b_cpu.yaml"


@pytest.fixture(scope="module")
def half_b() -> ModelShape:
    return ModelShape.from_hf_config(shape_config("qwen2.5-0.5b"))


def _worker(plan):
    return next(p for p in plan.processes if p.name.startswith("worker: actor"))


def test_shape_counts_parameters_exactly(half_b):
    assert half_b.params == 494_032_768  # Qwen2.5-0.5B
    assert (half_b.vocab, half_b.hidden, half_b.layers, half_b.heads, half_b.kv_heads) == \
        (151936, 896, 24, 14, 2)
    assert half_b.tied and half_b.largest_layer_params == 151936 * 896
    tiny = ModelShape.from_hf_config(tiny_config())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config())
    assert tiny.params == sum(p.numel() for p in model.parameters())
    qwen3 = ModelShape.from_hf_config(shape_config("qwen3-0.6b"))
    assert qwen3.head_dim == 128 and qwen3.params == 596_049_920


def test_micro_batch_tokens_follow_the_layout():
    cfg = load_config(SCALE)  # 2 tasks x 4 samples, 384 tokens (192 prompt + 192 response)
    assert not cfg.actor.micro_batch_size and cfg.actor.gradient_checkpointing
    assert micro_batch_tokens(cfg) == (8, 8 * 384)  # checkpointing: every row runs whole
    assert micro_batch_tokens(cfg, forward_only=True) == (8, 2 * 192 + 8 * 192)
    shared = load_config(SCALE, ["actor.gradient_checkpointing=false"])
    assert micro_batch_tokens(shared) == (8, 2 * 192 + 8 * 192)  # one prompt per group
    four = load_config(SCALE, ["actor.gradient_checkpointing=false", "actor.micro_batch_size=4"])
    assert micro_batch_tokens(four) == (4, 192 + 4 * 192)
    three = load_config(SCALE, ["actor.gradient_checkpointing=false", "actor.micro_batch_size=3"])
    assert micro_batch_tokens(three) == (3, 2 * 192 + 3 * 192)  # may straddle two groups
    budget = load_config(SCALE, ["actor.max_tokens_per_micro_batch=1000"])
    assert micro_batch_tokens(budget)[1] == 1000



def test_episode_lengths_follow_the_prompt_budget_and_one_turns_cap(half_b):
    """The plan's longest episode: the first prompt at its budget (explicit or the rollout
    worker's default), then the rest of the episode, or one turn's tokens when there is one
    turn (after a 1,536-token tool-schema prompt each row adds at most its 160-token turn);
    the warm start's batch (different tasks) runs every row whole."""
    assert episode_lengths(load_config(SCALE)) == (192, 192)  # 3 turns: the rest of 384
    single = ["rollout.max_turns=1", "rollout.max_prompt_tokens=1536",
              "rollout.max_total_tokens=1700", "rollout.max_tokens_per_turn=160",
              "rollout.engine.max_model_len=1792",
              "actor.gradient_checkpointing=false", "actor.micro_batch_size=4"]
    cfg = load_config(SCALE, single)
    assert episode_lengths(cfg) == (1536, 160)
    assert micro_batch_tokens(cfg) == (4, 1536 + 4 * 160)  # one group's prompt once
    multi = load_config(SCALE, [s for s in single if "max_turns" not in s])
    assert episode_lengths(multi) == (1536, 164)  # turns and observations: the rest
    warm = plan_memory(load_config(SCALE, [*single, "warm_start.enabled=true",
                                           "warm_start.batch_size=4"]), half_b)
    driver = next(p for p in warm.processes if p.name == "driver")
    assert driver.phases["warm start"]["SFT activations"] == \
        half_b.train_activation_bytes(4 * (1536 + 160), 4, False)

def test_micro_batch_tokens_count_every_row_whole_on_the_varlen_route():
    """On CUDA in half precision ``auto`` packs the rows (torch's varlen kernel): no prompt is
    shared, checkpointing or not, forward only or not; in float32 the prompt runs once."""
    cuda = ["actor.gradient_checkpointing=false", "resources.device=cuda",
            "rollout.engine.backend=gpu"]
    for half in (["actor.dtype=bfloat16"], ["actor.param_dtype=float16"]):
        cfg = load_config(SCALE, [*cuda, *half])
        assert micro_batch_tokens(cfg) == (8, 8 * 384)
        assert micro_batch_tokens(cfg, forward_only=True) == (8, 8 * 384)
    fp32 = load_config(SCALE, cuda)
    assert micro_batch_tokens(fp32) == (8, 2 * 192 + 8 * 192)


def test_plan_follows_the_config(half_b):
    base = load_config(SCALE, ["actor.gradient_checkpointing=false"])
    plan = plan_memory(base, half_b, 22 * GiB)
    worker = _worker(plan)
    assert worker.resident["actor weights"] == pytest.approx(half_b.params * 4)
    assert worker.resident["actor AdamW state"] == pytest.approx(2 * half_b.params * 4)
    core = next(p for p in plan.processes if p.name == "vLLM engine core")
    assert core.resident["weights"] == pytest.approx(half_b.params * 2)  # bfloat16 engine
    assert core.resident["KV cache"] == pytest.approx(0.25 * GiB)
    assert plan.peak()[1] == "update"
    # checkpointing and smaller micro-batches shrink the update; a bigger KV cache grows the core
    ckpt = plan_memory(load_config(SCALE), half_b, 22 * GiB)
    assert _worker(ckpt).phases["update"]["activations"] < \
        worker.phases["update"]["activations"] / 2
    two = plan_memory(load_config(SCALE, ["actor.gradient_checkpointing=false",
                                          "actor.micro_batch_size=2"]), half_b, 22 * GiB)
    assert _worker(two).phases["update"]["activations"] < worker.phases["update"]["activations"]
    kv = plan_memory(load_config(SCALE, ["rollout.engine.kv_cache_gib=4"]), half_b, 22 * GiB)
    assert kv.host_total == pytest.approx(ckpt.host_total + 3.75 * GiB)
    # two FSDP ranks on a node: each holds half the actor state
    two_ranks = plan_memory(load_config(SCALE, ["resources.processes_per_node=2"]), half_b)
    assert _worker(two_ranks).resident["actor AdamW state"] == \
        pytest.approx(_worker(ckpt).resident["actor AdamW state"] / 2)
    assert _worker(two_ranks).count == 2


def test_gpu_plan_knows_sleep_mode(half_b):
    gpu = ["resources.device=cuda", "rollout.engine.backend=gpu", "resources.gpu_memory_gib=24"]
    awake = plan_memory(load_config(SCALE, [*gpu, "rollout.engine.sleep_level=0"]), half_b,
                        None, 24 * GiB)
    asleep = plan_memory(load_config(SCALE, gpu), half_b, None, 24 * GiB)  # default: level 2
    assert worker_rollout_config(load_config(SCALE, gpu)).engine.sleep_level == 2
    assert asleep.gpu_total < awake.gpu_total
    # during the update the engine's share of the GPU (0.5 by default) is free
    update_gap = awake.phase_total("update", gpu=True) - asleep.phase_total("update", gpu=True)
    assert update_gap == pytest.approx(0.5 * 24 * GiB)
    assert asleep.phase_total("rollout", gpu=True) == awake.phase_total("rollout", gpu=True)
    # level 2 (full pushes) drops the engine's weights; level 1 keeps them in host memory
    core = next(p for p in asleep.processes if p.name == "vLLM engine core")
    assert "offloaded engine weights" not in core.phases.get("update", {})
    level1 = plan_memory(load_config(SCALE, [*gpu, "rollout.engine.sleep_level=1"]), half_b,
                         None, 24 * GiB)
    core = next(p for p in level1.processes if p.name == "vLLM engine core")
    assert core.phases["update"]["offloaded engine weights"] == pytest.approx(half_b.params * 2)


def test_too_large_config_is_refused_before_any_worker_starts(tmp_path, monkeypatch):
    """A 7B shape on a 24 GiB machine: one line naming the fix, before the model is built, the
    run dir written or Ray started."""
    from toolrl.trainer import run
    from toolrl.trainer import trainer as trainer_module

    def no_ray(*args, **kwargs):
        raise AssertionError("init_ray was called")

    monkeypatch.setattr(trainer_module, "init_ray", no_ray)
    model = tmp_path / "qwen7b"
    out = tmp_path / "run"
    cfg = load_config(SCALE, [f"model.path={model}", "model.tiny_size=qwen2.5-7b",
                              f"trainer.output_dir={out}", "resources.host_memory_gib=24"])
    with pytest.raises(MemoryBudgetError) as err:
        run.run_training(cfg)
    message = str(err.value)
    assert "\n" not in message and "GiB of host memory per node" in message
    assert "actor weights" in message or "AdamW" in message
    assert "resources.memory_check=warn" in message
    assert isinstance(err.value, ConfigError)  # `toolrl train` prints it as one line, exit 2
    assert not model.exists() and not out.exists()

    # the same through the command line
    from toolrl.cli import main

    assert main(["train", "--config", str(SCALE), f"model.path={model}",
                 "model.tiny_size=qwen2.5-7b", f"trainer.output_dir={out}",
                 "resources.host_memory_gib=24"]) == 2
    assert not model.exists()


def test_refusal_names_the_micro_batch_when_activations_dominate(half_b):
    cfg = load_config(SCALE, ["actor.gradient_checkpointing=false",
                              "rollout.max_total_tokens=4096", "rollout.engine.max_model_len=4096",
                              "data.batch_size=8", "resources.host_memory_gib=48"])
    with pytest.raises(MemoryBudgetError, match=r"actor\.micro_batch_size.*gradient_checkpoint"):
        check_memory(cfg, half_b)
    warn = load_config(SCALE, ["actor.gradient_checkpointing=false",
                               "rollout.max_total_tokens=4096",
                               "rollout.engine.max_model_len=4096", "data.batch_size=8",
                               "resources.host_memory_gib=48", "resources.memory_check=warn"])
    with pytest.warns(UserWarning, match="micro_batch_size"):
        assert check_memory(warn, half_b) is not None
    off = load_config(SCALE, ["resources.memory_check=skip", "resources.host_memory_gib=1"])
    assert check_memory(off, half_b) is None


def test_shipped_configs_fit_this_machine(tiny_model_dir):
    for config in (QUICKSTART, SCALE):
        plan = check_memory(load_config(config, [f"model.path={tiny_model_dir}"]))
        assert plan is not None and plan.fits()
    plan = check_memory(load_config(SCALE))  # the 0.5B shape it builds (not built here)
    assert plan is not None and plan.fits() and plan.host_total > 8 * GiB


def test_every_real_shape_has_a_plan():
    for size in REAL_SHAPES:
        shape = ModelShape.from_hf_config(shape_config(size))
        plan = plan_memory(load_config(SCALE), shape, 24 * GiB)
        assert plan.host_total > shape.params * 4 * 3  # weights, AdamW, the engine at least


def test_gpu_pools_are_planned_apart_and_a_small_gpu_is_refused(half_b):
    gpu = ["resources.device=cuda", "rollout.engine.backend=gpu",
           "rollout.engine.kv_cache_gib=null"]
    pipe = load_config(ROOT / "configs" / "quickstart_pipeline.yaml", gpu)
    plan = plan_memory(pipe, half_b, None, 80 * GiB)
    # split pools: the engine has a GPU of its own, the actor's GPU does not hold it
    engine = plan.phase_total("rollout", gpu=True, pool="rollout")
    assert engine == pytest.approx(0.6 * GiB + 0.5 * 80 * GiB)  # context + its share
    assert plan.gpu_total == max(plan.peak(True)[0], engine)
    cfg = load_config(SCALE, [*gpu, "resources.gpu_memory_gib=8", "resources.host_memory_gib=512",
                              "model.tiny_size=qwen2.5-7b", "model.path=/nonexistent/7b"])
    with pytest.raises(MemoryBudgetError, match="per GPU"):
        check_memory(cfg)


def test_the_warm_start_is_planned_while_it_runs_and_after_it_only_without_trim(half_b,
                                                                               monkeypatch):
    """The driver hands the SFT model back (`release_memory`) where glibc can trim, so the plan
    counts it in the warm-start phase only; elsewhere its weights and AdamW state stay."""
    import toolrl.trainer.memory as memory

    cfg = load_config(SCALE, ["warm_start.enabled=true"])
    trimmed = plan_memory(cfg, half_b)
    monkeypatch.setattr(memory, "can_trim", lambda: False)
    kept = plan_memory(cfg, half_b)
    driver = next(p for p in kept.processes if p.name == "driver")
    extra = driver.resident["kept after the warm start (no malloc_trim)"]
    assert extra == 3 * half_b.params * 4  # fp32 weights + AdamW's two moments
    for phase in ("rollout", "update", "weight push"):
        assert kept.phase_total(phase) == pytest.approx(trimmed.phase_total(phase) + extra)
    assert any("cannot hand freed memory back" in n for n in kept.notes)
    assert not any("cannot hand" in n for n in trimmed.notes)
    assert "kept after" not in str(next(p for p in trimmed.processes if p.name == "driver"))
