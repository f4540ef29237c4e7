"""Loss aggregation: hand values per mode, and exact micro-batch / data-parallel equivalence."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolrl.algo import AGG_MODES, LossAggregator, agg_loss, batch_totals

T = torch.tensor

# Two real rows and one padding row (mask all 0, garbage loss that must never count).
LOSS = T([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, float("nan"), 9.0]])
MASK = T([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 2.5),  # (1 + 2 + 3 + 4) / 4 tokens
        ("seq-mean-token-sum", 5.0),  # sums 6 and 4 over 2 sequences (padding row excluded)
        ("seq-mean-token-mean", 3.0),  # means 2 and 4 over 2 sequences
        ("seq-mean-token-sum-norm", 0.625),  # (6 + 4) / (2 sequences * max_len 8)
    ],
)
def test_modes_hand_values(mode, expected):
    assert float(agg_loss(LOSS, MASK, mode, max_len=8)) == pytest.approx(expected)
    assert float(LossAggregator(mode, max_len=8)(LOSS, MASK)) == pytest.approx(expected)


def test_explicit_totals_replace_the_local_counts():
    assert float(agg_loss(LOSS, MASK, "token-mean", total_tokens=10)) == pytest.approx(1.0)
    assert float(agg_loss(LOSS, MASK, "seq-mean-token-mean", total_seqs=4)) == pytest.approx(1.5)


def test_batch_totals_skip_padding_rows():
    assert batch_totals(MASK) == (4, 2)


def test_empty_mask_gives_zero_not_nan():
    for mode in AGG_MODES:
        out = agg_loss(LOSS[2:], MASK[2:], mode, max_len=4)
        assert float(out) == 0.0, mode
        out = agg_loss(LOSS[2:], MASK[2:], mode, max_len=4, total_tokens=0, total_seqs=0)
        assert float(out) == 0.0, mode


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "mean"}, "token-mean, seq-mean-token-sum, seq-mean-token-mean"),
        ({"mode": "seq-mean-token-sum-norm"}, "max_len"),
        ({"mode": "token-mean", "total_tokens": -1}, ">= 0"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, match):
    mode = kwargs.pop("mode")
    with pytest.raises(ValueError, match=match):
        agg_loss(LOSS, MASK, mode, **kwargs)
    with pytest.raises(ValueError, match=match):
        LossAggregator(mode, **kwargs)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="same shape"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")


@st.composite
def split_batches(draw):
    b = draw(st.integers(1, 8))
    r = draw(st.integers(1, 6))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=r, max_size=r),
                                      min_size=b, max_size=b)))
    loss = torch.tensor(draw(st.lists(st.lists(st.floats(-10, 10, width=32), min_size=r,
                                               max_size=r), min_size=b, max_size=b)))
    cuts = sorted(draw(st.lists(st.integers(1, max(b - 1, 1)), max_size=3, unique=True)))
    cuts = [c for c in cuts if c < b]
    sizes = [e - s for s, e in zip([0, *cuts], [*cuts, b], strict=True)]
    return loss, mask, sizes


@settings(max_examples=80, deadline=None)
@given(batch=split_batches(), mode=st.sampled_from(AGG_MODES))
def test_micro_batches_with_global_totals_sum_to_the_full_batch(batch, mode):
    loss, mask, sizes = batch
    max_len = loss.shape[1] + 3
    full = agg_loss(loss, mask, mode, max_len=max_len)
    tokens, seqs = batch_totals(mask)
    agg = LossAggregator(mode, total_tokens=tokens, total_seqs=seqs, max_len=max_len)
    parts = [agg(lm, mm) for lm, mm in zip(loss.split(sizes), mask.split(sizes), strict=True)]
    torch.testing.assert_close(sum(parts), full, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_accumulated_gradients_equal_full_batch_gradients(mode):
    # Rows padded to different lengths per micro-batch and one row with nothing valid, as the
    # actor sees them. Two "ranks" of two micro-batches each; FSDP would average over ranks,
    # here the ranks' gradients are summed, which is what loss * world_size then averaging gives.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=gen, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0],
                         [1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    full = agg_loss(x.square(), mask, mode, max_len=5)
    (g_full,) = torch.autograd.grad(full, x)
    tokens, seqs = batch_totals(mask)
    agg = LossAggregator(mode, total_tokens=tokens, total_seqs=seqs, max_len=5)
    g_acc = torch.zeros_like(x)
    for rows in ([0, 1], [2], [3, 4], [5]):
        part = agg(x[rows].square(), mask[rows])
        (g,) = torch.autograd.grad(part, x)
        g_acc += g
    torch.testing.assert_close(g_acc, g_full)
