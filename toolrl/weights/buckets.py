"""Buckets and checksums: how a push cuts the weights, and how either end proves what it holds.

A push streams the full weights bucket by bucket (``weight_bucket_mb``), so at most about one
bucket is in flight beyond the two models' own weights. `iter_buckets` cuts a stream of named
tensors, `meta_buckets` the same buckets from names, dtypes and shapes alone (both ends of a
broadcast cut them alike); `flatten_bucket` / `unflatten_bucket` turn one bucket into one flat
byte buffer and back. `Checksum` / `weights_checksum` hash a set of named tensors in any order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch

Named = tuple[str, torch.Tensor]
Meta = tuple[str, str, tuple[int, ...]]  # name, dtype name, shape
DEFAULT_BUCKET_MB = 256.0


def iter_buckets(named: Iterable[Named], bucket_mb: float = DEFAULT_BUCKET_MB
                 ) -> Iterator[list[Named]]:
    """Group tensors in order into buckets of at most ``bucket_mb`` MiB (a larger tensor gets a
    bucket of its own). Works on meta tensors (only shapes and dtypes are read)."""
    if bucket_mb <= 0:
        raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
    limit = int(bucket_mb * (1 << 20))
    bucket: list[Named] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


class Checksum:
    """SHA-256 of a set of named tensors, fed one tensor at a time in any order (so a stream
    can be hashed without keeping it): the digest of the sorted (name, tensor digest) pairs,
    each tensor digest covering its dtype, shape and bytes."""

    def __init__(self) -> None:
        self._parts: dict[str, str] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        t = tensor.detach().to("cpu").contiguous()
        digest = hashlib.sha256(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        self._parts[name] = digest.hexdigest()

    def hexdigest(self) -> str:
        total = hashlib.sha256()
        for name in sorted(self._parts):
            total.update(f"{name}={self._parts[name]};".encode())
        return total.hexdigest()


def weights_checksum(named: Iterable[Named] | Mapping[str, torch.Tensor]) -> str:
    """`Checksum` of ``named``: equal checksums mean exactly the same weights under the same
    names (order does not matter)."""
    acc = Checksum()
    for name, tensor in (named.items() if isinstance(named, Mapping) else named):
        acc.add(name, tensor)
    return acc.hexdigest()


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def layout_bytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()


def meta_buckets(meta: Sequence[Meta], bucket_mb: float) -> list[list[Meta]]:
    """`iter_buckets` over metadata alone (both ends of a broadcast cut the same buckets)."""
    probes = [(i, torch.empty(m[2], dtype=torch_dtype(m[1]), device="meta"))
              for i, m in enumerate(meta)]
    return [[meta[int(i)] for i, _ in bucket]
            for bucket in iter_buckets(((str(i), t) for i, t in probes), bucket_mb)]


def flatten_bucket(bucket: Sequence[Named], device: torch.device) -> torch.Tensor:
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in bucket]
    return torch.cat(parts).to(device) if parts else torch.empty(0, dtype=torch.uint8)


def unflatten_bucket(buf: torch.Tensor, layout: Sequence[Meta]) -> list[Named]:
    out, offset = [], 0
    for name, dtype, shape in layout:
        nbytes = layout_bytes(shape, torch_dtype(dtype))
        out.append((name, buf[offset:offset + nbytes].view(torch_dtype(dtype)).reshape(shape)))
        offset += nbytes
    if offset != buf.numel():
        raise RuntimeError(f"weight bucket holds {buf.numel()} bytes, layout says {offset}")
    return out


__all__ = [
    "DEFAULT_BUCKET_MB",
    "Checksum",
    "Meta",
    "Named",
    "flatten_bucket",
    "iter_buckets",
    "layout_bytes",
    "meta_buckets",
    "torch_dtype",
    "unflatten_bucket",
    "weights_checksum",
]
