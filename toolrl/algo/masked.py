"""Masked reductions shared by the estimators and losses.

A mask is any tensor whose non-zero entries mark valid positions (bool, int or float 0/1).
Every reduction is defined on an empty mask (it returns 0, never NaN), so a micro-batch of
padding rows cannot poison a step.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over valid positions (all of them, or along ``dim``)."""
    m = mask.to(x.dtype)
    return (x * m).sum() if dim is None else (x * m).sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over valid positions; 0 where nothing is valid."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over all valid positions (Bessel-corrected when ``unbiased``).

    Fewer than two valid positions (one for the population variance) give 0.
    """
    m = mask.to(x.dtype)
    n = m.sum()
    mean = masked_mean(x, mask)
    sq = ((x - mean) ** 2 * m).sum()
    denom = n - 1 if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6, unbiased: bool = True) -> Tensor:
    """``(x - mean) / (std + eps)`` over all valid positions of the batch; 0 outside the mask."""
    m = mask.to(x.dtype)
    mean = masked_mean(x, mask)
    std = masked_var(x, mask, unbiased=unbiased).sqrt()
    return (x - mean) / (std + eps) * m
