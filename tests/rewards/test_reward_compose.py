"""Composition from config: weights, gates, clip, scale, fallback, metrics, async, batched,
timeouts, the process pool, YAML through OmegaConf, trajectories as dicts."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle

import pytest
import reward_test_plugins
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from toolrl.core.trajectory import Trajectory, TurnRecord
from toolrl.core.types import ParseError, ParseResult, ToolCall
from toolrl.reward import RewardConfig, RewardConfigError, RewardResult, build_reward


def rows(*values, ids=None):
    ids = ids or [f"s{i}" for i in range(len(values))]
    return [Trajectory(row={"id": i, "values": v}) for i, v in zip(ids, values, strict=True)]


YAML = """
reward:
  rewards:
    - {name: t_value, alias: correct, kwargs: {key: a}}
    - name: t_value
      alias: fmt
      weight: 0.5
      kwargs: {key: b}
      gate: {reward: correct, above: 0.0}   # format pays only when correct > 0
    - {name: t_async, weight: 2.0}
  scale: 0.5
  clip: {min: -2.0, max: 3.0}
"""


def test_yaml_config_weights_gate_scale_clip_and_metrics():
    cfg = OmegaConf.create(YAML)
    fn = build_reward(cfg.reward)
    trajs = rows({"a": 1.0, "b": 1.0}, {"a": 0.0, "b": 1.0}, {"a": -1.0, "b": 4.0},
                 {"a": 5.0, "b": 0.0})
    out = fn.score(trajs)
    # total = clip(0.5 * (a + 0.5*b*[a > 0] + 2*a))
    assert out.scores == pytest.approx([1.75, 0.0, -1.5, 3.0])
    assert out.gate_open["fmt"] == [True, False, False, True]
    assert out.components["correct"] == [1.0, 0.0, -1.0, 5.0]
    assert out.components["fmt"] == [1.0, 1.0, 4.0, 0.0]  # raw, reported even when gated off
    assert out.components["t_async/half"] == [0.5, 0.0, -0.5, 2.5]
    m = out.metrics()
    assert m["reward/total"] == pytest.approx((1.75 + 0 - 1.5 + 3.0) / 4)
    assert m["reward/correct"] == pytest.approx(1.25)
    assert m["reward/fmt"] == pytest.approx(1.5)
    assert m["reward/t_async/half"] == pytest.approx(0.625)
    assert m["reward/gate_open/fmt"] == 0.5
    assert m["reward/errors/correct"] == 0.0 and m["reward/errors/t_async"] == 0.0
    # per-turn: only t_async gives per_turn ([a, -a]), weighted 2 and scaled 0.5
    assert out.per_turn[0] == pytest.approx([1.0, -1.0])


@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5)), min_size=1, max_size=6),
       st.floats(-3, 3), st.floats(-3, 3), st.floats(-2, 2), st.floats(0.1, 3),
       st.one_of(st.none(), st.tuples(st.floats(-5, 0), st.floats(0, 5))))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_total_is_gated_weighted_scaled_clipped_sum(vals, w1, w2, gate_min, scale,
                                                             clip):
    cfg = {"rewards": [{"name": "t_value", "alias": "x", "weight": w1, "kwargs": {"key": "a"}},
                       {"name": "t_value", "alias": "y", "weight": w2, "kwargs": {"key": "b"},
                        "gate": {"reward": "x", "above": gate_min}}],
           "scale": scale, "clip": list(clip) if clip else None}
    out = build_reward(cfg).score(rows(*({"a": a, "b": b} for a, b in vals)))
    for (a, b), total in zip(vals, out.scores, strict=True):
        expected = scale * (w1 * a + (w2 * b if a > gate_min else 0.0))
        if clip:
            expected = min(max(expected, clip[0]), clip[1])
        assert total == pytest.approx(expected)


def test_failing_reward_uses_fallback_is_counted_and_logged_once(caplog):
    fn = build_reward({"rewards": [
        {"name": "t_fail_on", "alias": "flaky", "kwargs": {"ids": ["s1", "s3"]}, "fallback": -1},
        {"name": "t_value", "kwargs": {"key": "a"}}], "fallback": 0.0})
    trajs = rows(*({"a": 1.0} for _ in range(4)))
    with caplog.at_level(logging.ERROR, logger="toolrl.reward.compose"):
        out = fn.score(trajs)
        out2 = fn.score(trajs)
    assert out.components["flaky"] == [1.0, -1.0, 1.0, -1.0]
    assert out.scores == [2.0, 0.0, 2.0, 0.0]
    assert out.errors == {"flaky": 2, "t_value": 0}
    assert out.metrics()["reward/errors/flaky"] == 2.0
    assert [(f.reward, f.sample_id) for f in out.failures] == [("flaky", "s1"), ("flaky", "s3")]
    assert "boom on s1" in out.failures[0].message
    assert out.reasons["flaky"][1].startswith("error: RuntimeError")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # loud once, then counted
    assert "'flaky'" in errors[0].getMessage() and "'s1'" in errors[0].getMessage()
    assert "Traceback" in errors[0].getMessage()
    assert out2.errors["flaky"] == 2


@pytest.mark.parametrize("name,why", [("t_nonfinite", "non-finite"),
                                      ("t_not_a_number", "expected a float"),
                                      ("t_wrong_length", "returned 1 results for 2")])
def test_bad_return_values_are_errors(name, why):
    out = build_reward([{"name": name}]).score(rows({}, {}))
    assert out.errors[name] == 2 and out.scores == [0.0, 0.0]
    assert why in out.failures[0].message


def test_batched_reward_with_per_sample_exceptions():
    fn = build_reward([{"name": "t_batched", "kwargs": {"fail_ids": ["s1"]}, "fallback": 9}])
    out = fn.score(rows({"b": 1.0}, {"b": 2.0}, {"b": 3.0}))
    assert out.components["t_batched"] == [1.0, 9.0, 3.0]
    assert out.errors["t_batched"] == 1


@pytest.mark.parametrize("limit,expected", [(64, 16), (3, 3)])
def test_async_rewards_run_concurrently_up_to_the_limit(limit, expected):
    reward_test_plugins.reset_concurrency()
    fn = build_reward({"rewards": ["t_concurrency"], "max_concurrency": limit})
    out = fn.score(rows(*({} for _ in range(16))))
    assert max(out.scores) == expected and out.errors["t_concurrency"] == 0


def test_async_reward_timeout_is_a_counted_error():
    slow = build_reward([{"name": "t_async", "kwargs": {"delay": 5.0}, "timeout": 0.2}])
    out = slow.score(rows({"a": 1.0}))
    assert out.errors["t_async"] == 1 and "timed out" in out.failures[0].message


def test_ascore_inside_a_running_loop_and_sync_shim_from_a_loop():
    fn = build_reward([{"name": "t_value", "kwargs": {"key": "a"}}])

    async def main():
        a = await fn.ascore(rows({"a": 2.0}))
        b = fn.score(rows({"a": 3.0}))  # sync shim while a loop runs: uses a worker thread
        c = await fn(Trajectory(row={"id": 0, "values": {"a": 4.0}}))
        return a.scores, b.scores, c

    a, b, c = asyncio.run(main())
    assert a == [2.0] and b == [3.0]
    assert isinstance(c, RewardResult) and c.score == 4.0 and c.components == {"t_value": 4.0}


def test_class_reward_keeps_state_and_validates_kwargs():
    fn = build_reward([{"name": "t_counter", "kwargs": {"start": 10, "step": 2}}])
    assert fn.score(rows({}, {})).scores == [12.0, 14.0]
    with pytest.raises(RewardConfigError, match="step must be > 0"):
        build_reward([{"name": "t_counter", "kwargs": {"step": 0}}])


@pytest.mark.parametrize("cfg,match", [
    ({"rewards": [{"name": "t_value"}], "scael": 1}, "unknown key.*'scael'.*valid keys: rewards"),
    ({"rewards": [{"name": "t_value", "wieght": 1}]}, "unknown key.*'wieght'.*valid keys: name"),
    ({"rewards": []}, "non-empty list"),
    ({"rewards": [{"name": "nope"}]}, "unknown reward 'nope'. Known rewards: .*bfcl_ast"),
    ({"rewards": [{"name": "t_value", "kwargs": {"kee": "a"}}]}, "Valid kwargs: key='a'"),
    ({"rewards": [{"name": "t_value"}, {"name": "t_value"}]}, "duplicate metric name"),
    ({"rewards": [{"name": "t_value", "gate": {"reward": "t_value"}}]}, "must name another"),
    ({"rewards": [{"name": "t_value", "gate": {"reward": "zzz"}}, {"name": "format"}]},
     "components: format"),
    ({"rewards": [{"name": "t_value", "gate": {"reward": "x", "min": 1}}]},
     "valid keys: reward, above"),
    ({"rewards": [{"name": "t_value", "gate": {True: "x"}}]}, "YAML read the key 'on' as true"),
    ({"rewards": [{"name": "t_value", "weight": "heavy"}]}, "weight must be a finite number"),
    ({"rewards": [{"name": "t_value"}], "clip": [2, 1]}, "min 2.0 > max 1.0"),
    ({"rewards": [{"name": "t_value"}], "clip": 3}, r"clip must be \[min, max\]"),
    ({"rewards": [{"name": "t_value", "alias": "total"}]}, "not one of total"),
    ({"rewards": [{"name": "t_value", "pool": "sometimes"}]},
     r"rewards\[0\]\.pool must be true or false"),
    ({"rewards": [{"name": "t_value", "timeout": 0}]}, "timeout must be > 0"),
    ({"rewards": [{"name": "t_value"}], "pool_workers": 0}, "pool_workers must be an integer"),
    ("t_value", "must be a mapping or a list"),
])
def test_config_errors_name_the_key_and_the_valid_ones(cfg, match):
    with pytest.raises(RewardConfigError, match=match):
        build_reward(cfg)


def test_config_accepts_a_plain_list_and_string_items():
    cfg = RewardConfig.from_config(["success", {"name": "format", "weight": 0.1}])
    assert [c.alias for c in cfg.components] == ["success", "format"]
    assert cfg.components[1].weight == 0.1 and cfg.scale == 1.0 and cfg.fallback == 0.0


def test_trajectory_dict_round_trip_and_pickle():
    t = Trajectory(messages=[{"role": "user", "content": "hi"}],
                   turns=[TurnRecord(action="<tool_call>x", parse=ParseResult(
                       calls=[ToolCall("f", {"a": [1, {"b": 2}]}, id="c1")], text="t",
                       errors=[ParseError("invalid_json", "m", (0, 3))], repaired=True),
                       errors=[{"type": "timeout", "tool": "f", "message": "slow"}],
                       reward=0.5)],
                   row={"id": 7, "ground_truth": []}, info={"success": True},
                   final_state={"x": 1}, sampled_tokens=12,
                   tools=[{"type": "function", "function": {"name": "f"}}], format="hermes")
    d = t.to_dict()
    assert Trajectory.from_dict(pickle.loads(pickle.dumps(d))) == t
    with pytest.raises(ValueError, match="unknown trajectory key"):
        Trajectory.from_dict({**d, "num_tokens": 12})
    # the composition accepts dicts (as they arrive from a TensorDict NonTensorStack)
    out = build_reward(["success"]).score([d])
    assert out.scores == [1.0]


def test_trajectories_through_a_tensordict_non_tensor_stack():
    from tensordict import NonTensorStack, TensorDict

    trajs = rows({"a": 1.0}, {"a": 2.0}, {"a": 3.0})
    td = TensorDict({"trajectories": NonTensorStack(*trajs)}, batch_size=[3])
    back = list(td[1:]["trajectories"])
    out = build_reward([{"name": "t_value", "kwargs": {"key": "a"}}]).score(back)
    assert out.scores == [2.0, 3.0]


@pytest.fixture
def pooled():
    fn = build_reward({"rewards": [{"name": "t_pid", "pool": True},
                                   {"name": "bfcl_ast", "pool": True, "weight": 10.0}],
                       "pool_workers": 2})
    try:
        yield fn
    finally:
        fn.close()


def test_process_pool_scores_in_other_processes(pooled):
    row = {"category": "simple", "ground_truth": [{"f": {"a": [1]}}]}
    trajs = [Trajectory.from_calls([{"name": "f", "arguments": {"a": a}}], {**row, "id": a},
                                   [{"type": "function", "function": {"name": "f", "parameters": {
                                       "type": "object", "properties": {"a": {"type": "integer"}},
                                       "required": ["a"]}}}]) for a in (1, 2, 1, 1)]
    out = pooled.score(trajs)
    pids = {int(p) for p in out.components["t_pid"]}
    assert os.getpid() not in pids and len(pids) >= 1
    assert out.components["bfcl_ast"] == [1.0, 0.0, 1.0, 1.0]
    assert out.errors == {"t_pid": 0, "bfcl_ast": 0}
    assert pooled.score(trajs).components["bfcl_ast"] == [1.0, 0.0, 1.0, 1.0]  # pool reused


def test_process_pool_crash_is_a_counted_error_and_the_pool_recovers():
    fn = build_reward({"rewards": [{"name": "t_crash_process", "pool": True, "fallback": -5}],
                       "pool_workers": 1})
    try:
        out = fn.score(rows({}, {}))
        assert out.scores == [-5.0, -5.0] and out.errors["t_crash_process"] == 2
    finally:
        fn.close()
    ok = build_reward({"rewards": [{"name": "t_pid", "pool": True}], "pool_workers": 1})
    try:
        assert ok.score(rows({})).errors["t_pid"] == 0
    finally:
        ok.close()


def test_pool_needs_a_picklable_reward():
    from toolrl.reward import REWARDS, reward

    @reward("t_local_only")
    def local(traj):
        return 1.0

    try:
        with pytest.raises(RewardConfigError, match="module-level reward"):
            build_reward([{"name": "t_local_only", "pool": True}])
        assert build_reward(["t_local_only"]).score(rows({})).scores == [1.0]
    finally:
        REWARDS.unregister("t_local_only")
