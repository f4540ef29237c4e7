"""Log-probs and entropy from logits: hand values, stability, low-precision path, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from toolrl.algo import entropy_from_logits, log_probs_and_entropy, log_probs_from_logits

T = torch.tensor


def test_log_probs_hand_values():
    logits = T([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    out = log_probs_from_logits(logits, T([2, 1]))
    # row 0: 3 - log(e + e^2 + e^3) = -log(1 + e^-1 + e^-2) = -log(1.5032147) = -0.4076060
    # row 1: uniform over 3 -> -log 3 = -1.0986123
    torch.testing.assert_close(out, T([-0.4076060, -1.0986123]))


def test_entropy_hand_values_and_masked_vocab():
    logits = T([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [0.0, 0.0, -math.inf]])
    # row 0: p = [0.0900306, 0.2447285, 0.6652410], -sum p log p
    #   = 0.0900306 * 2.4076060 + 0.2447285 * 1.4076060 + 0.6652410 * 0.4076060 = 0.8323951
    # row 1: log 3; row 2: a -inf logit is an impossible token -> uniform over 2 -> log 2
    torch.testing.assert_close(entropy_from_logits(logits), T([0.8323951, 1.0986123, 0.6931472]))


def test_large_logits_stay_accurate():
    logits = T([[1.0, 2.0, 3.0]])
    shifted = logits + 1e4  # a naive lse - sum(p * z) loses all digits at this offset
    torch.testing.assert_close(entropy_from_logits(shifted), entropy_from_logits(logits))
    # log-probs are a difference of two numbers of the logits' size: at realistic magnitudes
    # (|z| ~ 50) they stay within float32 rounding
    torch.testing.assert_close(log_probs_from_logits(logits + 50, T([0])),
                               log_probs_from_logits(logits, T([0])))


def test_match_log_softmax_values_and_gradients_on_random_shapes():
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 11, generator=gen) * 4).requires_grad_(True)
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    ours = log_probs_from_logits(logits, labels)
    ref = logits.log_softmax(-1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(ours, ref)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(g_ours, g_ref)

    ent = entropy_from_logits(logits)
    p = logits.softmax(-1)
    ent_ref = -(p * logits.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(ent, ent_ref)
    (g_ours,) = torch.autograd.grad(ent.sum(), logits)
    (g_ref,) = torch.autograd.grad(ent_ref.sum(), logits)
    torch.testing.assert_close(g_ours, g_ref)


def test_bf16_logits_are_computed_in_float32():
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2100, 50, generator=gen) * 3).bfloat16()  # > one chunk of rows
    labels = torch.randint(0, 50, (2100,), generator=gen)
    out = log_probs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    ref = logits.float().log_softmax(-1).gather(-1, labels[:, None]).squeeze(-1)
    torch.testing.assert_close(out, ref)
    assert entropy_from_logits(logits).dtype == torch.float32


def test_label_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="labels"):
        log_probs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_log_probs_and_entropy_share_one_logsumexp(entropy_grad):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 11, generator=g) * 4).requires_grad_()
    labels = torch.randint(0, 11, (3, 5), generator=g)
    masked = logits.detach().clone()
    masked[0, 0, 3] = -torch.inf
    lp, ent = log_probs_and_entropy(logits, labels, entropy_grad=entropy_grad)
    torch.testing.assert_close(lp, log_probs_from_logits(logits, labels))
    torch.testing.assert_close(ent, entropy_from_logits(logits))
    assert ent.requires_grad == entropy_grad
    (lp.sum() + (ent.sum() if entropy_grad else 0)).backward()
    expected = torch.autograd.grad(
        log_probs_from_logits(logits, labels).sum()
        + (entropy_from_logits(logits).sum() if entropy_grad else 0), logits)[0]
    torch.testing.assert_close(logits.grad, expected)
    _, ent_masked = log_probs_and_entropy(masked, labels)
    torch.testing.assert_close(ent_masked, entropy_from_logits(masked))
