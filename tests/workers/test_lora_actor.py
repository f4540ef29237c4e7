"""LoRA actors (PEFT under FSDP2): what trains, the reference, checkpoints, exports."""

from __future__ import annotations

import pytest
import torch
from fsdp_harness import hf_log_probs, make_batch, run_ranks, with_policy_inputs

from toolrl.batch import OLD_LOG_PROBS, REF_LOG_PROBS, RESPONSE_MASK, split
from toolrl.workers.actor import ActorConfig, FSDPActor
from toolrl.workers.fsdp import full_state_dict
from toolrl.workers.lora import LoraConfig, is_adapter_name

LORA = LoraConfig(rank=8, alpha=16.0, target_modules=("q_proj", "v_proj", "up_proj"))


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    return with_policy_inputs(tiny_model_dir, make_batch(8, seed=3, group_size=2), seed=3)


def _cfg(model_dir, lora=LORA, **kw) -> ActorConfig:
    kw = {"lr": 1e-2, "micro_batch_size": 2, **kw}
    return ActorConfig(model_path=str(model_dir), lora=lora, **kw)


def test_lora_config_is_validated():
    assert not LoraConfig().enabled
    with pytest.raises(ValueError, match=r"lora\.sync"):
        LoraConfig(rank=4, sync="broadcast")
    with pytest.raises(ValueError, match=r"lora\.rank"):
        LoraConfig(rank=-1)
    with pytest.raises(ValueError, match=r"actor\.lora\.alpha is set but actor\.lora\.rank is 0"):
        LoraConfig(alpha=8.0)
    with pytest.raises(ValueError, match="dropout"):
        LoraConfig(rank=4, dropout=1.0)
    assert LoraConfig(rank=4).engine_rank == 8 and LoraConfig(rank=16).engine_rank == 16
    assert ActorConfig(model_path="x", lora={"rank": 4}).lora == LoraConfig(rank=4)


def _build_error(rank, cfg):
    try:
        FSDPActor(cfg)
    except ValueError as e:
        return str(e)
    return None


def test_unknown_or_non_linear_targets_are_clear_errors(tiny_model_dir):
    # in a forked rank: an actor built here would leave a process group in the test process
    nope = run_ranks(_build_error, 1, _cfg(tiny_model_dir, lora=LoraConfig(
        rank=4, target_modules=("nope",))))[0]
    assert nope is not None and "actor.lora.target_modules" in nope
    embed = run_ranks(_build_error, 1, _cfg(tiny_model_dir, lora=LoraConfig(
        rank=4, target_modules=("embed_tokens",))))[0]
    assert embed is not None and "only linear layers" in embed


def _snapshot(model):
    return {k: v.clone() for k, v in full_state_dict(model).items()}  # copies, not views


def _update(rank, cfg, shards, steps):
    actor = FSDPActor(cfg)
    before = _snapshot(actor.model)
    optimized = sum(p.numel() for g in actor.optimizer.param_groups for p in g["params"])
    trainable = {n for n, p in actor.model.named_parameters() if p.requires_grad}
    ref_before = actor.compute_ref_log_prob(shards[rank])[REF_LOG_PROBS]
    lp_before = actor.compute_log_prob(shards[rank])[OLD_LOG_PROBS]
    for _ in range(steps):
        actor.update(shards[rank])
    after = _snapshot(actor.model)
    ref_after = actor.compute_ref_log_prob(shards[rank])[REF_LOG_PROBS]
    lp_after = actor.compute_log_prob(shards[rank])[OLD_LOG_PROBS]
    return (before, after, optimized, trainable, ref_before, ref_after, lp_before, lp_after)


@pytest.mark.parametrize("world", [1, 2])
def test_update_changes_only_adapter_and_ref_is_the_base_model(tiny_model_dir, batch, world):
    shards = split(batch, world)
    (before, after, optimized, trainable, ref_before, ref_after, lp_before,
     lp_after) = run_ranks(_update, world, _cfg(tiny_model_dir), shards, 2)[0]
    adapter = {n for n in before if is_adapter_name(n)}
    assert adapter and trainable == adapter  # q, v, up of 4 layers: A and B each
    assert len(adapter) == 3 * 4 * 2
    # the optimizer holds exactly the adapter parameters (their full size, not the model's)
    assert optimized == sum(before[n].numel() for n in adapter)
    assert optimized < sum(t.numel() for t in before.values()) / 10
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= adapter  # base weights bit-identical after the updates
    assert {n for n in adapter if ".lora_B." in n} <= changed  # B starts at 0 and moves
    # reference = base model: equal to transformers on the checkpoint, before and after
    mask = shards[0][RESPONSE_MASK].bool()
    base = hf_log_probs(tiny_model_dir, shards[0])
    torch.testing.assert_close(ref_before[mask], base[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ref_after[mask], base[mask], atol=1e-5, rtol=0)
    # B = 0 at the start: the LoRA actor starts as the base model, then leaves it
    torch.testing.assert_close(lp_before[mask], base[mask], atol=1e-5, rtol=0)
    assert (lp_after[mask] - base[mask]).abs().max() > 1e-3


def _ckpt_cfg(model_dir) -> ActorConfig:
    return _cfg(model_dir, lr=3e-3, warmup_steps=2, lr_schedule="cosine", total_steps=10,
                ppo_mini_batch_size=4)


def _save_then_continue(rank, cfg, first, second, path):
    actor = FSDPActor(cfg)
    actor.update(first[rank])
    actor.save_checkpoint(path)
    return actor.update(second[rank]), _snapshot(actor.model)


def _load_then_continue(rank, cfg, second, path):
    actor = FSDPActor(cfg)
    if path is not None:
        actor.load_checkpoint(path)
    return actor.update(second[rank]), _snapshot(actor.model)


def test_checkpoint_holds_the_adapter_and_optimizer_and_resume_continues_identically(
        tiny_model_dir, tmp_path):
    import torch.distributed.checkpoint as dcp

    cfg = _ckpt_cfg(tiny_model_dir)
    batches = [with_policy_inputs(tiny_model_dir, make_batch(8, seed=s), seed=s) for s in (5, 6)]
    first, second = (split(b, 2) for b in batches)
    path = str(tmp_path / "ckpt")
    (metrics, state), _ = run_ranks(_save_then_continue, 2, cfg, first, second, path)
    (resumed, resumed_state), _ = run_ranks(_load_then_continue, 2, cfg, second, path)
    assert resumed == metrics  # adapter, Adam moments, schedule and step counter came back
    assert resumed["actor/num_updates"] == 4.0
    assert all(torch.equal(state[n], resumed_state[n]) for n in state)
    # the checkpoint holds the adapter (and its optimizer state), not the frozen base weights
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    models = {k.removeprefix("model.") for k in saved if k.startswith("model.")}
    assert models == {n for n in state if is_adapter_name(n)}
    assert any(k.startswith("optim.") for k in saved)
    # a fresh LoRA actor without the checkpoint takes a different step
    (fresh, _), _ = run_ranks(_load_then_continue, 2, cfg, second, None)
    assert fresh["actor/pg_loss"] != pytest.approx(metrics["actor/pg_loss"], rel=1e-4)


def _train_and_export(rank, cfg, shards, path):
    actor = FSDPActor(cfg)
    actor.update(shards[rank])
    adapter = actor.export_hf(f"{path}/adapter")
    merged = actor.export_hf(f"{path}/merged", merged=True)
    return adapter, merged, actor.compute_log_prob(shards[rank])[OLD_LOG_PROBS]


def test_export_writes_a_peft_adapter_and_the_merged_model(tiny_model_dir, batch, tmp_path):
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    shards = split(batch, 2)
    results = run_ranks(_train_and_export, 2, _cfg(tiny_model_dir), shards, str(tmp_path))
    assert results[1][:2] == (None, None)  # rank 0 writes
    adapter_dir, merged_dir = results[0][0], results[0][1]
    trained = torch.cat([r[2] for r in results])
    mask = batch[RESPONSE_MASK].bool()
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert len(names) == 3 * 4 * 2 and all(".lora_" in n for n in names)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with_adapter = PeftModel.from_pretrained(base, str(adapter_dir))
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    with safe_open(str(merged_dir / "model.safetensors"), "pt") as f:
        assert not any("lora" in n or "base_layer" in n for n in f.keys())  # noqa: SIM118 (safe_open has no __iter__)
    for model in (with_adapter, merged):
        model.eval()
        r = batch["responses"].shape[1]
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"]).logits[:, -r - 1:-1]
        lp = torch.log_softmax(logits, -1).gather(-1, batch["responses"][..., None])[..., 0]
        torch.testing.assert_close(lp[mask], trained[mask], atol=1e-4, rtol=0)


def test_merged_stream_equals_peft_merge_in_checkpoint_order(tiny_model_dir):
    import copy

    from transformers import AutoModelForCausalLM

    from toolrl.workers.lora import LoraAdapter

    lora = LoraAdapter(LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "down_proj")))
    model = lora.apply(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    merged = list(lora.merged(state.items()))
    meta = [(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in state.items()]
    assert [(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in merged] == \
        lora.merged_metadata(meta)  # the broadcast route relies on this order
    expected = copy.deepcopy(lora.peft).merge_and_unload().state_dict()
    assert all(torch.allclose(t, expected[n], atol=1e-6) for n, t in merged)
    assert all(torch.equal(state[n], model.state_dict()[n]) for n in state)  # nothing mutated
    with pytest.raises(RuntimeError, match="ended before"):
        list(lora.merged((n, t) for n, t in state.items() if ".lora_B." not in n))


def test_the_adapters_are_drawn_from_the_seed_not_the_process(tiny_model_dir):
    """A LoRA run is repeatable: the adapters' A matrices depend on the run's seed, not on what
    the process drew before (the roles of a worker process start in no fixed order), and the
    process's random stream goes on as if they had not been drawn."""
    from transformers import AutoModelForCausalLM

    from toolrl.workers.lora import LoraAdapter

    def adapters(seed: int, draws: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        torch.manual_seed(123)
        torch.rand(draws)  # what the process drew before: differs
        model = LoraAdapter(LoraConfig(rank=4), seed=seed).apply(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir))
        after = torch.rand(1)
        return {n: p.detach().clone() for n, p in model.named_parameters()
                if ".lora_A." in n}, after

    a, after_a = adapters(0, 1)
    b, after_b = adapters(0, 1000)
    c, _ = adapters(1, 1)
    assert a and a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)  # another seed, other adapters
    torch.manual_seed(123)
    torch.rand(1)
    assert torch.equal(after_a, torch.rand(1))  # the process's stream is left where it was
    assert not torch.equal(after_a, after_b)


def _reference_first_then_update(rank, cfg, td):
    actor = FSDPActor(cfg)
    ref = actor.compute_ref_log_prob(td)[REF_LOG_PROBS]  # the first forward: adapter off
    metrics = actor.update(td)
    trainable = {n for n, p in actor.model.named_parameters() if p.requires_grad}
    return ref, metrics, trainable


def test_a_bf16_lora_actor_trains_after_a_reference_pass_comes_first(tiny_model_dir, batch):
    """bf16 compute with float32 gradient reduction (the GPU default): a reference pass as the
    first forward made FSDP2 fix the adapter groups' gradient dtype while PEFT had switched
    their requires_grad off, and the first update raised "attempting to assign a gradient
    with dtype BFloat16 ..." (found by the GPU check's dry mode)."""
    cfg = _cfg(tiny_model_dir, param_dtype="bfloat16", reduce_dtype="float32")
    ref, metrics, trainable = run_ranks(_reference_first_then_update, 1, cfg, batch)[0]
    assert metrics["actor/grad_norm"] > 0
    assert trainable and all(is_adapter_name(n) for n in trainable)
    mask = batch[RESPONSE_MASK].bool()
    base = hf_log_probs(tiny_model_dir, batch)
    assert (ref[mask] - base[mask]).abs().mean() < 0.05  # bf16 compute of the base model
