"""``param_dtype: auto``: the training compute dtype is timed on the model, never assumed."""

from __future__ import annotations

import time

import pytest
import torch
from fsdp_harness import run_ranks
from transformers import AutoModelForCausalLM

from toolrl.weights import canary
from toolrl.workers import base as base_module
from toolrl.workers.actor import ActorConfig, FSDPActor
from toolrl.workers.compute_dtype import DtypeChoice, choose_autocast, timed_choice


def _sleeper(seconds: float):
    return lambda: time.sleep(seconds)


def test_bf16_is_taken_only_when_it_is_faster_by_the_margin():
    fast = timed_choice({"float32": _sleeper(0.04), "bfloat16": _sleeper(0.01)}, what="a step",
                        reps=1)
    assert fast.dtype == "bfloat16" and fast.seconds["bfloat16"] < fast.seconds["float32"]
    slow = timed_choice({"float32": _sleeper(0.01), "bfloat16": _sleeper(0.04)}, what="a step",
                        reps=1)
    assert slow.dtype == "float32" and "under the 1.1x asked" in slow.reason
    tie = timed_choice({"float32": _sleeper(0.02), "bfloat16": _sleeper(0.02)}, what="a step",
                       reps=1, margin=1.5)
    assert tie.dtype == "float32"  # a near tie keeps the exact dtype


def _forward_dtype(actor: FSDPActor) -> torch.dtype:
    """The dtype the first decoder layer's input has in a forward: what it computes in."""
    seen = []
    layer = actor.model.model.layers[0]
    handle = layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    with torch.no_grad():
        actor.model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    handle.remove()
    return seen[0]


def _auto_actor(rank: int, model_dir: str) -> tuple[str, dict, torch.dtype, bool]:
    before = torch.get_rng_state()
    actor = FSDPActor(ActorConfig(model_path=model_dir, param_dtype="auto"))
    rng_kept = torch.equal(before, torch.get_rng_state())
    return (actor.compute_dtype, actor.dtype_choice.seconds, _forward_dtype(actor), rng_kept)


def test_auto_times_the_sharded_model_and_every_rank_computes_as_rank_0_chose(tiny_model_dir):
    results = run_ranks(_auto_actor, 2, str(tiny_model_dir))
    dtypes = {dtype for dtype, _, _, _ in results}
    assert len(dtypes) == 1 and dtypes <= {"float32", "bfloat16"}  # one choice for all ranks
    chosen = dtypes.pop()
    for _, seconds, forward, rng_kept in results:
        assert set(seconds) == {"float32", "bfloat16"} and all(s > 0 for s in seconds.values())
        assert forward == getattr(torch, chosen)  # the policy applied is the one chosen
        assert rng_kept  # timing draws nothing from the run's RNG


def _faked_choice(rank: int, model_dir: str) -> tuple[str, torch.dtype, int, str, torch.dtype]:
    calls = []

    def choice(steps, *, what, **_):
        calls.append(what)
        return DtypeChoice("bfloat16", {"float32": 2.0, "bfloat16": 1.0}, "faked")

    base_module.timed_choice = choice  # this forked rank's copy of the module only
    actor = FSDPActor(ActorConfig(model_path=model_dir, param_dtype="auto"))
    again = FSDPActor(ActorConfig(model_path=model_dir, param_dtype="auto"))  # untimed
    plain = FSDPActor(ActorConfig(model_path=model_dir))
    return (again.compute_dtype, _forward_dtype(actor), len(calls), plain.compute_dtype,
            _forward_dtype(plain))


def test_the_chosen_dtype_is_the_mixed_precision_policy(tiny_model_dir):
    """The wiring alone, with the timing replaced (in a rank process: an actor built in the
    test process would leave it a process group that later forked ranks inherit): bf16
    chosen, bf16 computed; a second model of the same checkpoint in the process (a
    reference) reuses the choice untimed; without auto, fp32."""
    (chosen, forward, calls, plain, plain_forward), = run_ranks(
        _faked_choice, 1, str(tiny_model_dir))
    assert chosen == "bfloat16" and forward == torch.bfloat16 and calls == 1
    assert plain == "float32" and plain_forward == torch.float32


def test_autocast_choice_leaves_the_model_as_it_was(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    choice = choose_autocast(model, tokens=32)
    assert choice.dtype in ("float32", "bfloat16") and set(choice.seconds) == {"float32",
                                                                              "bfloat16"}
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize(("engine", "actor", "rule"), [
    ("float32", "float32", "float32"), (None, None, "float32"),
    ("float32", "bfloat16", "bfloat16"), ("bfloat16", "float32", "bfloat16"),
    ("float16", "float32", "float16")])
def test_the_canary_judges_by_the_less_precise_side(engine, actor, rule):
    assert canary.rule_dtype(engine, actor) == rule
    # an fp32 engine against a bf16 actor: bf16's statistic and bound, a warning by default
    assert canary.statistic(rule) == ("max" if rule == "float32" else "mean")
