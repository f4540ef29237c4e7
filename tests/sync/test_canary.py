"""The weight-sync canary's pure parts: the probe gap, tolerances by dtype, the verdict."""

from __future__ import annotations

import math

import pytest
import torch

from toolrl.sync.canary import TOLERANCE, probe_diff, tolerance, verdict


def test_probe_diff_is_the_largest_gap_on_sampled_tokens_only():
    engine = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    actor = torch.tensor([[-1.0, -2.5, -3.0], [-0.4, -0.5, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the -9 is padding: not compared
    assert probe_diff(engine, actor, mask) == pytest.approx(0.5)
    assert probe_diff(engine, actor, torch.zeros_like(mask)) == 0.0


def test_tolerance_follows_the_dtype_unless_overridden():
    assert tolerance("float32") == TOLERANCE["float32"] < tolerance("bfloat16")
    assert tolerance("torch.bfloat16") == TOLERANCE["bfloat16"]
    assert tolerance(None) == TOLERANCE["float32"]
    assert tolerance("float32", 0.5) == 0.5


def test_verdict_names_the_engines_that_disagree():
    assert verdict([1e-6, 5e-4], 1e-3, 3) is None
    message = verdict([1e-6, 0.2], 1e-3, 3)
    assert "policy version 3" in message and "rollout worker 1: 0.2" in message
    assert "rollout worker 0" not in message and "trainer.sync_canary=warn" in message
    assert verdict([math.nan], 1e-3, 1) is not None  # a NaN gap is a failure, not a pass
