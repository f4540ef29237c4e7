"""Staleness counted per trained token (`toolrl.trainer.staleness`) and the warning for
grammar-constrained gateway samples without a correction, on hand-made batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from toolrl import batch as B
from toolrl.trainer.config import load_config
from toolrl.trainer.staleness import (
    check_bound,
    oldest_version,
    token_lags,
    token_staleness_metrics,
)
from toolrl.trainer.trainer import uncorrected_warning

ROOT = Path(__file__).resolve().parents[2]


def batch(versions: list[list[int]], mask: list[list[int]]) -> TensorDict:
    return TensorDict({B.TOKEN_VERSIONS: torch.tensor(versions),
                       B.RESPONSE_MASK: torch.tensor(mask)}, batch_size=[len(versions)])


# row 0: a partial rollout, 3 tokens by version 4 then (observation) 2 by version 5;
# row 1: 2 tokens by version 5; -1 where nothing was sampled
TD = batch([[4, 4, 4, -1, 5, 5], [5, 5, -1, -1, -1, -1]],
           [[1, 1, 1, 0, 1, 1], [1, 1, 0, 0, 0, 0]])


def test_lags_and_metrics_count_the_trained_tokens():
    lags = token_lags(TD, 6)
    assert sorted(lags.tolist()) == [1, 1, 1, 1, 2, 2, 2]  # 7 trained tokens, by version
    m = token_staleness_metrics(lags, 2, "async")
    assert m == {"async/token_staleness_mean": pytest.approx(10 / 7),
                 "async/token_staleness_max": 2.0, "async/token_lag_0": 0.0,
                 "async/token_lag_1": pytest.approx(4 / 7),
                 "async/token_lag_2": pytest.approx(3 / 7)}
    assert oldest_version(TD, default=99) == 4  # the partial rollout's old part


def test_the_bound_holds_on_every_token():
    check_bound(token_lags(TD, 6), 2, "async staleness")
    with pytest.raises(RuntimeError, match=r"trained tokens are \[1, 2\] versions stale, "
                                           r"outside \[0, 1\]"):
        check_bound(token_lags(TD, 6), 1, "async staleness")
    with pytest.raises(RuntimeError, match="outside"):  # trained by older weights: a bug
        check_bound(token_lags(TD, 4), 2, "async staleness")


def test_batches_without_versions_or_trained_tokens():
    nothing = batch([[3, 3]], [[0, 0]])
    assert token_lags(nothing, 5).numel() == 0 and oldest_version(nothing, 7) == 7
    assert token_staleness_metrics(token_lags(nothing, 5), 1, "p")["p/token_lag_0"] == 0.0
    plain = TensorDict({B.RESPONSE_MASK: torch.ones(1, 2)}, batch_size=[1])
    assert token_lags(plain, 5).numel() == 0 and oldest_version(plain, 2) == 2


def test_grammar_constrained_samples_without_a_correction_are_warned_about():
    sync = load_config(ROOT / "configs" / "quickstart.yaml")  # no correction
    constrained = {"rollout/gateway_constrained_calls": 3.0}
    message = uncorrected_warning(constrained, sync)
    assert message is not None and "3 of this step's agent calls" in message
    assert "actor.loss.corrections" in message and "allow_uncorrected" in message
    assert uncorrected_warning({"rollout/gateway_constrained_calls": 0.0}, sync) is None
    assert uncorrected_warning({}, sync) is None
    corrected = load_config(ROOT / "configs" / "quickstart.yaml",
                            ["actor.loss.corrections=[{name: icepop}]"])
    assert uncorrected_warning(constrained, corrected) is None
    on_purpose = load_config(ROOT / "configs" / "quickstart.yaml",
                             ["trainer.allow_uncorrected=true"])
    assert uncorrected_warning(constrained, on_purpose) is None
