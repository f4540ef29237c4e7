"""The weight-sync canary at a sampling temperature other than 1.

At a temperature other than 1 the rollout engine reports the log-probs of the distribution it
sampled from (``processed_logprobs``: logits / temperature) and the probe samples at the
rollout's temperature, so the engine and the actor (which divides its logits by the same
temperature) agree on the probe and on the rollout's tokens. With the model's raw log-probs
(what the engine reported before, ``rollout.engine.logprobs_mode=raw_logprobs``) the same run
disagrees by far more than the tolerance: the check can fail.
"""

from __future__ import annotations

import json

import pytest
from trainer_runs import run_training_in_process, small_run_overrides

from toolrl.weights.canary import TOLERANCE

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("logprobs_mode", [None, "raw_logprobs"], ids=["default", "raw"])
def test_the_canary_agrees_at_temperature_0_7(ray_cluster, tiny_model_dir, tmp_path,
                                               logprobs_mode):
    rows = run_training_in_process(small_run_overrides(
        tiny_model_dir, tmp_path / "run", **{
            "trainer.total_steps": 2, "rollout.temperature": 0.7,
            "rollout.engine.logprobs_mode": logprobs_mode,
            "trainer.sync_canary": "stop" if logprobs_mode is None else "warn"}))
    assert [r["step"] for r in rows] == [0, 1, 2]
    probe = [r["sync/probe_max_abs_diff"] for r in rows[1:]]
    mismatch = [r["rollout/log_prob_diff_abs_max"] for r in rows[1:]
                if "rollout/log_prob_diff_abs_max" in r]
    assert mismatch, "no on-policy step logged the rollout's log-prob gap"
    if logprobs_mode is None:  # the default: processed log-probs at this temperature
        assert max(probe) < TOLERANCE["float32"], probe
        assert max(mismatch) < TOLERANCE["float32"], mismatch
    else:  # raw log-probs against the actor's tempered ones: the canary would stop the run
        assert min(probe) > 10 * TOLERANCE["float32"], probe
        assert min(mismatch) > 10 * TOLERANCE["float32"], mismatch


@pytest.mark.timeout(900)
def test_auto_records_the_dtype_it_timed_and_the_canary_reads_its_rule(ray_cluster,
                                                                       tiny_model_dir, tmp_path):
    """``actor.param_dtype: auto`` in a run: the actor times the model in its worker, the run
    directory records the choice and its timings, and the canary judges by its dtype's rule."""
    rows = run_training_in_process(small_run_overrides(
        tiny_model_dir, tmp_path / "run", **{
            "trainer.total_steps": 1, "actor.param_dtype": "auto"}))
    assert [r["step"] for r in rows] == [0, 1]
    chosen = json.loads((tmp_path / "run" / "compute_dtype.json").read_text())
    assert chosen["dtype"] in ("float32", "bfloat16") and "forward and backward" in \
        chosen["reason"]
    assert set(chosen["seconds"]) == {"float32", "bfloat16"}, chosen
    stat = "max" if chosen["dtype"] == "float32" else "mean"
    assert rows[1][f"sync/probe_{stat}_abs_diff"] < TOLERANCE[chosen["dtype"]], rows[1]
