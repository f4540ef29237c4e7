"""The sizes `toolrl.models.tiny.build_tiny_model` builds: the tiny family (`SIZES`) and the
shapes of released models (`REAL_SHAPES`). Plain data, no torch: ``toolrl --help`` lists them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["REAL_SHAPES", "SIZES", "TinySpec", "size_names"]


@dataclass(frozen=True)
class TinySpec:
    """Architecture of one size of the tiny family (its fields are `transformers.Qwen2Config`'s)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


SIZES: dict[str, TinySpec] = {
    "small": TinySpec(128, 4, 4, 2, 384),
    "medium": TinySpec(256, 4, 8, 2, 768),
    "large": TinySpec(384, 6, 12, 4, 1152),
}


def _qwen2(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int = 151936,
           tied: bool = True) -> dict[str, Any]:
    return {"model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "intermediate_size": mlp, "vocab_size": vocab, "tie_word_embeddings": tied,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "use_sliding_window": False}


def _qwen3(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int = 151936,
           tied: bool = True) -> dict[str, Any]:
    return {**_qwen2(hidden, layers, heads, kv_heads, mlp, vocab, tied), "model_type": "qwen3",
            "head_dim": 128, "max_position_embeddings": 40960, "attention_bias": False}


# Shapes of released checkpoints (their config.json): random weights, real sizes.
REAL_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": _qwen2(896, 24, 14, 2, 4864),
    "qwen2.5-1.5b": _qwen2(1536, 28, 12, 2, 8960),
    "qwen2.5-3b": _qwen2(2048, 36, 16, 2, 11008),
    "qwen2.5-7b": _qwen2(3584, 28, 28, 4, 18944, vocab=152064, tied=False),
    "qwen3-0.6b": _qwen3(1024, 28, 16, 8, 3072),
    "qwen3-1.7b": _qwen3(2048, 28, 16, 8, 6144),
    "qwen3-4b": _qwen3(2560, 36, 32, 8, 9728),
    "qwen3-8b": _qwen3(4096, 36, 32, 8, 12288, tied=False),
}


def size_names() -> list[str]:
    """Every ``size`` `build_tiny_model` accepts: the tiny family, then the real shapes."""
    return [*SIZES, *REAL_SHAPES]
