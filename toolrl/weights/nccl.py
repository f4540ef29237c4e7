"""The GPU split pools' route: vLLM's NCCL weight-transfer engine. The engine's workers join a
broadcast group with the trainer (`nccl_receiver_init_info`) and receive packed buckets
straight into the device (``NCCLWeightTransferEngine``); the trainer's end is
`toolrl.workers.weight_push.WeightSync.push_group`. These are the requests' payloads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def nccl_receiver_init_info(master_address: str, master_port: int, rank_offset: int,
                            world_size: int, buffer_bytes: int) -> dict[str, Any]:
    """``init_info`` of vLLM's NCCL weight-transfer engine for a rollout engine whose workers
    take ranks ``rank_offset..`` of a broadcast group with the trainer (rank 0)."""
    return {"master_address": master_address, "master_port": int(master_port),
            "rank_offset": int(rank_offset), "world_size": int(world_size), "packed": True,
            "packed_buffer_size_bytes": int(buffer_bytes), "packed_num_buffers": 2}


def nccl_update_info(metadata: Iterable[tuple[str, str, tuple[int, ...]]]) -> dict[str, Any]:
    """``update_info`` of one NCCL push: names, dtypes and shapes in the trainer's send order
    (both sides cut the packed buckets from it)."""
    meta = list(metadata)
    return {"names": [m[0] for m in meta], "dtype_names": [m[1] for m in meta],
            "shapes": [list(m[2]) for m in meta]}


__all__ = [
    "nccl_receiver_init_info",
    "nccl_update_info",
]
