"""Off-policy corrections (`toolrl.algo.corrections`): tis, mis and icepop weights against
hand-computed values on fixed ratios, their composition, shares and errors."""

from __future__ import annotations

import math

import pytest
import torch

from toolrl.algo import LossAggregator, PolicyLossConfig
from toolrl.algo.corrections import (
    CORRECTIONS,
    CorrectionConfig,
    apply_corrections,
    ratio_stats,
    register_correction,
    resolve,
)
from toolrl.algo.loss import ppo_clip_loss

T = torch.tensor

# pi_old / pi_rollout per token; the last token of A is padding (its ratio must not count).
#   A: geometric mean of [1, 1.5, 0.4, 3, 20]  = 36 ** (1/5)    = 2.048 (above 2)
#   B: geometric mean of [1.2, 0.8, 1, 1, 1, 1] = 0.96 ** (1/6) = 0.993
#   C: geometric mean of [0.1, 0.1, 1, 1, 1, 1] = 0.01 ** (1/6) = 0.464 (below 0.5)
RATIOS = T([[1.0, 1.5, 0.4, 3.0, 20.0, 100.0],
            [1.2, 0.8, 1.0, 1.0, 1.0, 1.0],
            [0.1, 0.1, 1.0, 1.0, 1.0, 1.0]])
MASK = T([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
VALID = 17
OLD = torch.zeros(3, 6)
ROLLOUT = OLD - RATIOS.log()


def weights(*specs: dict) -> tuple[torch.Tensor, dict[str, float]]:
    w, stats = apply_corrections(OLD, ROLLOUT, MASK, [CorrectionConfig(**s) for s in specs])
    return w * MASK, {k: float(v) for k, v in stats.items()}


def expect(rows: list[list[float]]) -> torch.Tensor:
    return T([*rows]) * MASK


def test_tis_caps_the_ratio():
    w, s = weights({"name": "tis", "cap": 2.0})
    torch.testing.assert_close(w, expect([[1, 1.5, 0.4, 2, 2, 0], [1.2, 0.8, 1, 1, 1, 1],
                                          [0.1, 0.1, 1, 1, 1, 1]]))
    assert s["tis_capped"] == pytest.approx(2 / VALID)  # 3.0 and 20.0; not the padding's 100
    assert s["is_weight_mean"] == pytest.approx(float(w.sum()) / VALID)


def test_mis_masks_tokens_outside_the_band_and_keeps_the_ratio_inside():
    w, s = weights({"name": "mis", "low": 0.5, "high": 2.0})
    torch.testing.assert_close(w, expect([[1, 1.5, 0, 0, 0, 0], [1.2, 0.8, 1, 1, 1, 1],
                                          [0, 0, 1, 1, 1, 1]]))
    assert s["mis_masked"] == pytest.approx(5 / VALID)


def test_mis_at_the_sequence_level_masks_whole_sequences_by_their_geometric_mean():
    w, s = weights({"name": "mis", "low": 0.5, "high": 2.0, "level": "sequence"})
    torch.testing.assert_close(w, expect([[0] * 6, [1.2, 0.8, 1, 1, 1, 1], [0] * 6]))
    assert s["mis_masked"] == pytest.approx(11 / VALID)


def test_icepop_masks_at_the_token_and_at_the_sequence_level():
    w, s = weights({"name": "icepop"})  # alpha 0.5, beta 5
    # A: 0.4 and 20 leave [0.5, 5], its mean 2.05 stays; C: mean 0.46 leaves it, all of C
    torch.testing.assert_close(w, expect([[1, 1.5, 0, 3, 0, 0], [1.2, 0.8, 1, 1, 1, 1],
                                          [0] * 6]))
    assert s["icepop_masked"] == pytest.approx(8 / VALID)
    assert s["icepop_seq_masked"] == pytest.approx(6 / VALID)
    w, s = weights({"name": "icepop", "low": 0.05, "high": 2.0})  # A's mean now leaves it
    torch.testing.assert_close(w, expect([[0] * 6, [1.2, 0.8, 1, 1, 1, 1],
                                          [0.1, 0.1, 1, 1, 1, 1]]))
    assert s["icepop_seq_masked"] == pytest.approx(5 / VALID)


def test_corrections_compose_in_any_order():
    capped_pop = expect([[1, 1.5, 0, 2, 0, 0], [1.2, 0.8, 1, 1, 1, 1], [0] * 6])
    for order in ([{"name": "tis"}, {"name": "icepop"}], [{"name": "icepop"}, {"name": "tis"}]):
        w, s = weights(*order)
        torch.testing.assert_close(w, capped_pop)
        assert s["tis_capped"] == pytest.approx(2 / VALID)  # judged on the raw ratio
        assert s["icepop_masked"] == pytest.approx(8 / VALID)


def test_the_weights_multiply_the_policy_loss():
    # ppo_clip on the loss test's tokens: raw weights [1, 1.5, 0.5, 3, 1, (7: padding)];
    # mis [0.5, 2] keeps 0.5 (the band is closed) and drops 3 -> [1, 1.5, 0.5, 0, 1]
    ratio = T([[1.1, 1.5, 0.5, 4.0, 1.0, 10.0]])
    adv = T([[1.0, 1.0, -1.0, -1.0, -2.0, 5.0]])
    mask = T([[1, 1, 1, 1, 1, 0]])
    old = torch.zeros(1, 6)
    rollout = old - T([[1.0, 1.5, 0.5, 3.0, 1.0, 7.0]]).log()
    config = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                              corrections=[{"name": "mis"}])
    lp = ratio.log().requires_grad_(True)
    loss, m = ppo_clip_loss(lp, old, adv, mask, config=config, agg=LossAggregator("token-mean"),
                            rollout_log_probs=rollout)
    # (-1.1 * 1 - 1.28 * 1.5 + 0.8 * 0.5 + 3 * 0 + 2 * 1) / 5
    assert loss.item() == pytest.approx(-0.62 / 5)
    assert m["mis_masked"] == pytest.approx(0.2)
    (grad,) = torch.autograd.grad(loss, lp)  # constant weights: -A r w / 5 where unclipped
    torch.testing.assert_close(grad, T([[-0.22, 0.0, 0.0, 0.0, 0.4, 0.0]]))


def test_ratio_stats_describe_the_valid_tokens():
    s = ratio_stats(OLD, ROLLOUT, MASK)
    valid = RATIOS[MASK.bool()]
    assert s["ratio_max"] == pytest.approx(20.0) and s["ratio_min"] == pytest.approx(0.1)
    assert s["ratio_mean"] == pytest.approx(float(valid.mean()))
    assert s["ratio_p99"] == pytest.approx(float(torch.quantile(valid, 0.99)))
    assert s["log_prob_diff_abs_max"] == pytest.approx(math.log(20.0))
    assert s["log_prob_diff_abs_mean"] == pytest.approx(float(valid.log().abs().mean()))
    assert ratio_stats(OLD, ROLLOUT, torch.zeros_like(MASK)) == {}


@pytest.mark.parametrize(("spec", "match"), [
    ({"name": "tis", "low": 0.5}, "correction 'tis' takes cap; low would do nothing"),
    ({"name": "icepop", "level": "sequence"}, "takes high, low; level would do nothing"),
    ({"name": "mis", "low": 2.0, "high": 1.0}, "0 <= low < high"),
    ({"name": "mis", "level": "batch"}, "level must be one of"),
    ({"name": "tis", "cap": -1.0}, "cap must be > 0"),
    ({"name": "dppo"}, "unknown correction 'dppo'; choose one of"),
])
def test_bad_corrections_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        resolve(CorrectionConfig(**spec))
    with pytest.raises(ValueError, match=match):
        PolicyLossConfig(corrections=[spec])


def test_a_registered_correction_composes_with_the_built_ins():
    @register_correction("test_floor", low=0.5)
    def floor(weight, inputs, *, low):
        return weight.clamp(min=low), {"test_floor_raised": inputs.share(inputs.ratio < low)}

    try:
        w, s = weights({"name": "test_floor"}, {"name": "tis", "cap": 2.0})
        torch.testing.assert_close(w, expect([[1, 1.5, 0.5, 2, 2, 0], [1.2, 0.8, 1, 1, 1, 1],
                                              [0.5, 0.5, 1, 1, 1, 1]]))
        assert s["test_floor_raised"] == pytest.approx(3 / VALID)
    finally:
        CORRECTIONS.unregister("test_floor")
    with pytest.raises(ValueError, match="parameters must be among"):
        register_correction("test_bad", alpha=1.0)
