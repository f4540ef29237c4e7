"""Variable-length attention for the ``packed`` scoring layout, with the kernel torch ships.

The packed layout (`toolrl.workers.scoring`) runs a micro-batch's real tokens as one row whose
position ids restart per sample. Through transformers' ``sdpa`` that row gets a ``[T, T]``
block-diagonal mask and a masked kernel over the whole packed length. On CUDA in float16 or
bfloat16 this module runs it with `torch.nn.attention.varlen.varlen_attn` instead (torch's own
FlashAttention-2 varlen kernel, torch >= 2.10; no flash_attn package): each sample attends
causally within itself, given by cumulative sequence lengths, and no mask is built.

How it plugs into transformers, which picks a layer's attention function by the name in
``config._attn_implementation``: `install` switches a model from ``sdpa`` to ``toolrl_varlen``
(`IMPLEMENTATION`), a function that runs the varlen kernel when the forward carries
``cu_seq_lens_q`` (transformers' flash-attention keyword names, `packed_kwargs`) and *is*
``sdpa`` for every other call. So the other layouts are unchanged, and gradient checkpointing,
which replays a layer with the same keywords in backward, recomputes through the same kernel
(a switch only around the forward would recompute with sdpa and no mask: wrong gradients).
Inside `packed_call` the mask function builds no mask; elsewhere it is sdpa's.

`packed_route` says which route a packed forward takes and why; the choice is logged once
(a warning when a CUDA forward falls back to the mask).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

logger = logging.getLogger(__name__)

IMPLEMENTATION = "toolrl_varlen"  # the attention implementation name `install` sets
KERNEL_DTYPES = (torch.float16, torch.bfloat16)  # what FlashAttention takes
CHOICES = ("auto", "varlen", "mask")  # `packed_route`'s ``choice``
_PACKED = contextvars.ContextVar("toolrl_varlen_packed", default=False)
_LOGGED: set[tuple[str, str]] = set()


def torch_varlen_attn() -> Callable[..., Tensor] | None:
    """`torch.nn.attention.varlen.varlen_attn` when the installed torch has it (>= 2.10)."""
    try:  # lazy: torch >= 2.10 only, and its import loads torch._dynamo (custom ops)
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def cu_seqlens(lengths: Tensor) -> Tensor:
    """``[n + 1]`` int32 offsets of ``n`` samples laid end to end (``lengths``: tokens each)."""
    return F.pad(lengths.to(torch.int32).cumsum(0, dtype=torch.int32), (1, 0))


def packed_kwargs(lengths: Tensor) -> dict[str, Any]:
    """The keywords a packed forward passes down to `attention_forward` (transformers'
    flash-attention names): cumulative lengths and the longest sample, for queries and keys."""
    cu = cu_seqlens(lengths)
    longest = int(lengths.max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest,
            "max_length_k": longest}


@functools.cache
def _kernel_params(kernel: Callable[..., Tensor]) -> frozenset[str]:
    return frozenset(inspect.signature(kernel).parameters)


def causal_varlen(query: Tensor, key: Tensor, value: Tensor, cu: Tensor, max_len: int,
                  scale: float | None, kernel: Callable[..., Tensor] | None = None) -> Tensor:
    """Causal attention of samples laid end to end: ``query [T, Hq, D]``, ``key``/``value``
    ``[T, Hkv, D]`` -> ``[T, Hq, D]``, through ``kernel`` (torch's `varlen_attn` by default).

    Speaks each torch's signature: causality is ``window_size=(-1, 0)`` (torch >= 2.11) or
    ``is_causal=True`` (2.10); grouped K/V heads go as they are where the kernel takes
    ``enable_gqa``, else repeated to the query's heads.
    """
    kernel = kernel or torch_varlen_attn()
    if kernel is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch.nn.attention.varlen "
                           f"(torch >= 2.10): use packed_attention='mask'")
    params = _kernel_params(kernel)
    kwargs: dict[str, Any] = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    if "scale" in params:
        kwargs["scale"] = scale
    elif scale is not None and abs(scale - query.shape[-1] ** -0.5) > 1e-12:
        raise ValueError(f"this torch's varlen_attn takes no scale; the model's is {scale}")
    if key.shape[1] != query.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            groups = query.shape[1] // key.shape[1]
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
    return kernel(query.contiguous(), key.contiguous(), value.contiguous(), cu, cu, max_len,
                  max_len, **kwargs)


def reference_varlen_attn(query: Tensor, key: Tensor, value: Tensor, cu_seq_q: Tensor,
                          cu_seq_k: Tensor, max_q: int, max_k: int, *,
                          scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                          enable_gqa: bool = False) -> Tensor:
    """A slow pure-torch stand-in with `varlen_attn`'s signature (full or causal windows only):
    one sdpa call per sample. Runs anywhere; the CPU tests and the GPU check's dry mode run the
    varlen route with it."""
    if tuple(window_size) not in ((-1, -1), (-1, 0)):
        raise ValueError(f"reference_varlen_attn: window_size {window_size} not supported")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError("query and key/value heads differ: pass enable_gqa=True")
    out = torch.empty_like(query)
    bounds = list(zip(cu_seq_q.tolist()[:-1], cu_seq_q.tolist()[1:], cu_seq_k.tolist()[:-1],
                      cu_seq_k.tolist()[1:], strict=True))
    for q0, q1, k0, k1 in bounds:
        out[q0:q1] = F.scaled_dot_product_attention(
            query[q0:q1].transpose(0, 1), key[k0:k1].transpose(0, 1),
            value[k0:k1].transpose(0, 1), is_causal=tuple(window_size) == (-1, 0), scale=scale,
            enable_gqa=enable_gqa).transpose(0, 1)
    return out


def attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Tensor | None, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention interface for ``toolrl_varlen``: the varlen kernel over one
    packed row when the forward carries ``cu_seq_lens_q``, else ``sdpa`` exactly."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask,
                                               dropout=dropout, scaling=scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"varlen attention takes one packed row, got {query.shape[0]}")
    if dropout:
        raise ValueError("varlen attention runs without attention dropout")
    for name in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"varlen attention does not do {name}: use packed_attention='mask'")
    out = causal_varlen(query[0].transpose(0, 1), key[0].transpose(0, 1),
                        value[0].transpose(0, 1), cu, int(kwargs["max_length_q"]), scaling)
    return out[None], None  # [1, T, Hq, D], as sdpa_attention_forward returns


def _mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """No mask for a packed varlen forward; sdpa's for every other one."""
    return None if _PACKED.get() else ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)


AttentionInterface.register(IMPLEMENTATION, attention_forward)
AttentionMaskInterface.register(IMPLEMENTATION, _mask)


@contextlib.contextmanager
def packed_call() -> Iterator[None]:
    """Inside: models on ``toolrl_varlen`` build no attention mask (the packed forward's
    layers attend by `packed_kwargs`)."""
    token = _PACKED.set(True)
    try:
        yield
    finally:
        _PACKED.reset(token)


def unsupported(config: Any) -> str | None:
    """Why a model with ``config`` cannot take the varlen route, or None when it can."""
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ("sdpa", IMPLEMENTATION):
        return f"its attention implementation is {impl!r}, not 'sdpa'"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or getattr(config, "sliding_window", None):
        return "it has sliding-window layers"
    if getattr(config, "attn_logit_softcapping", None):
        return "it soft-caps attention logits"
    return None


def install(config: Any) -> None:
    """Switch a model (by its config) from ``sdpa`` to ``toolrl_varlen``; stays switched."""
    reason = unsupported(config)
    if reason is not None:
        raise ValueError(f"varlen attention cannot run this model: {reason}")
    config._attn_implementation = IMPLEMENTATION


def packed_route(config: Any, device: torch.device, dtype: torch.dtype,
                 choice: str = "auto") -> tuple[str, str]:
    """``("varlen" | "mask", why)`` for a packed forward of a model with ``config`` computing in
    ``dtype`` on ``device``. ``auto`` takes varlen where torch's kernel runs (CUDA, float16 or
    bfloat16, torch >= 2.10) and the model attends with sdpa over full layers; ``varlen`` and
    ``mask`` force a route (``varlen`` raises where the model cannot take it)."""
    if choice not in CHOICES:
        raise ValueError(f"unknown packed attention {choice!r}; choose one of {list(CHOICES)}")
    if choice == "mask":
        return "mask", "asked for"
    reason = unsupported(config)
    if choice == "varlen":
        if reason is not None:
            raise ValueError(f"packed_attention='varlen' cannot run this model: {reason}")
        return "varlen", "asked for"
    if device.type != "cuda":
        return "mask", f"varlen_attn runs on CUDA only, not {device.type}"
    if dtype not in KERNEL_DTYPES:
        return "mask", f"varlen_attn takes float16/bfloat16, the model computes in {dtype}"
    if torch_varlen_attn() is None:
        return "mask", f"torch {torch.__version__} has no torch.nn.attention.varlen"
    if reason is not None:
        return "mask", reason
    return "varlen", "CUDA, " + str(dtype).removeprefix("torch.")


def log_route(route: str, why: str, device: torch.device) -> None:
    """Say once per process which route packed forwards take (a warning for CUDA on masks)."""
    if (route, why) in _LOGGED:
        return
    _LOGGED.add((route, why))
    if route == "varlen":
        logger.info("packed layout: torch.nn.attention.varlen.varlen_attn (%s)", why)
    elif device.type == "cuda":
        logger.warning("packed layout on CUDA: a block-diagonal mask over the packed row "
                       "instead of varlen attention (%s)", why)
    else:
        logger.info("packed layout: block-diagonal mask (%s)", why)


__all__ = ["CHOICES", "IMPLEMENTATION", "KERNEL_DTYPES", "attention_forward", "causal_varlen",
           "cu_seqlens", "install", "log_route", "packed_call", "packed_kwargs", "packed_route",
           "reference_varlen_attn", "torch_varlen_attn", "unsupported"]
