"""The data contract: every batch that crosses a process boundary is a `TensorDict`.

Key names live here, each documented once. Tensors are what trains; `NonTensorStack` holds
per-sample Python objects (task rows, group ids, the episodes' `Trajectory` records);
`NonTensorData` holds batch-wide values. Layout of a rollout batch of B samples:

    prompts         [B, P]    left-padded prompt ids
    responses       [B, R]    right-padded response ids (model tokens and tool observations)
    input_ids       [B, P+R]  prompts ++ responses
    attention_mask  [B, P+R]  1 on real tokens
    position_ids    [B, P+R]  0-based positions over real tokens
    response_mask   [B, R]    1 exactly on tokens the policy sampled (the loss mask)

The helpers keep batch sizes plain ``int`` and preserve order, values and non-tensor entries
through pad / split / concat round trips.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

# --- key names ------------------------------------------------------------------------------
PROMPTS = "prompts"  # [B, P] left-padded prompt token ids
RESPONSES = "responses"  # [B, R] right-padded response token ids (sampled + observation tokens)
INPUT_IDS = "input_ids"  # [B, P+R] prompts followed by responses
ATTENTION_MASK = "attention_mask"  # [B, P+R] 1 on real tokens, 0 on padding
POSITION_IDS = "position_ids"  # [B, P+R] position of each real token, 0 on left padding
RESPONSE_MASK = "response_mask"  # [B, R] 1 on tokens the policy sampled: the loss mask
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # [B, R] log-probs the inference engine reported
# [B, R] the weight version that sampled each response token (-1 where the policy sampled
# nothing: observations, padding); a push inside a request splits it (toolrl/rollout/engine.py)
TOKEN_VERSIONS = "token_versions"
OLD_LOG_PROBS = "old_log_probs"  # [B, R] log-probs of the training actor before the update
REF_LOG_PROBS = "ref_log_probs"  # [B, R] log-probs of the frozen reference policy
VALUES = "values"  # [B, R] critic values
TOKEN_LEVEL_SCORES = "token_level_scores"  # [B, R] reward placed on tokens (before KL)
TOKEN_LEVEL_REWARDS = "token_level_rewards"  # [B, R] reward after any in-reward KL penalty
ADVANTAGES = "advantages"  # [B, R] advantage per response token
RETURNS = "returns"  # [B, R] returns (targets of the critic)
UID = "uid"  # per-sample group id (NonTensorStack of str): samples of one task share it
POLICY_VERSION = "policy_version"  # [B] version of the weights that generated each sample
# [B] the row of each row's episode lead, set only when episodes span several rows (the
# per_turn history policy, a gateway agent's rewritten history): its rows share a mini-batch
EPISODE = "episode"
ROWS = "rows"  # per-sample task rows (NonTensorStack of dict)
TRAJECTORIES = "trajectories"  # per-sample `toolrl.core.trajectory.Trajectory` (NonTensorStack)


# --- padding ---------------------------------------------------------------------------------
def left_pad(seqs: Sequence[Sequence[int]], pad_value: int, length: int | None = None,
             dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack variable-length sequences right-aligned. Returns (values, mask)."""
    return _pad(seqs, pad_value, length, dtype, left=True)


def right_pad(seqs: Sequence[Sequence[int | float]], pad_value: float, length: int | None = None,
              dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack variable-length sequences left-aligned. Returns (values, mask)."""
    return _pad(seqs, pad_value, length, dtype, left=False)


def _pad(seqs: Sequence[Sequence[int | float]], pad_value: float, length: int | None,
         dtype: torch.dtype, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    length = max((len(s) for s in seqs), default=0) if length is None else length
    out = torch.full((len(seqs), length), pad_value, dtype=dtype)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"sequence {i} has length {len(s)} > pad length {length}")
        if len(s):
            cols = slice(length - len(s), length) if left else slice(0, len(s))
            out[i, cols] = torch.as_tensor(s, dtype=dtype)
            mask[i, cols] = 1
    return out, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0-based positions over real tokens; padding gets 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0) * attention_mask.long()


# --- builders --------------------------------------------------------------------------------
def build_rollout_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    response_masks: Sequence[Sequence[int]],
    pad_token_id: int,
    rollout_log_probs: Sequence[Sequence[float]] | None = None,
    non_tensor: Mapping[str, Sequence[Any]] | None = None,
    token_versions: Sequence[Sequence[int]] | None = None,
    max_prompt_len: int | None = None,
    max_response_len: int | None = None,
) -> TensorDict:
    """Build the rollout layout above from per-sample token lists.

    ``non_tensor`` maps keys to per-sample Python objects (stored as NonTensorStack).
    """
    n = len(prompts)
    if not (len(responses) == len(response_masks) == n):
        raise ValueError("prompts, responses and response_masks must have the same length")
    for i, (r, m) in enumerate(zip(responses, response_masks, strict=True)):
        if len(r) != len(m):
            raise ValueError(f"sample {i}: response has {len(r)} tokens but mask has {len(m)}")
    p_ids, p_mask = left_pad(prompts, pad_token_id, max_prompt_len)
    r_ids, r_attn = right_pad(responses, pad_token_id, max_response_len)
    r_mask, _ = right_pad(response_masks, 0, r_ids.shape[1])
    attention_mask = torch.cat([p_mask, r_attn], dim=1)
    data: dict[str, Any] = {
        PROMPTS: p_ids,
        RESPONSES: r_ids,
        INPUT_IDS: torch.cat([p_ids, r_ids], dim=1),
        ATTENTION_MASK: attention_mask,
        POSITION_IDS: position_ids_from_mask(attention_mask),
        RESPONSE_MASK: r_mask,
    }
    if rollout_log_probs is not None:
        width = r_ids.shape[1]
        data[ROLLOUT_LOG_PROBS], _ = right_pad(rollout_log_probs, 0.0, width, torch.float32)
    if token_versions is not None:
        data[TOKEN_VERSIONS], _ = right_pad(token_versions, -1, r_ids.shape[1])
    td = TensorDict(data, batch_size=[n])
    for key, values in (non_tensor or {}).items():
        set_non_tensor(td, key, values)
    return td


def set_non_tensor(td: TensorDict, key: str, values: Sequence[Any]) -> None:
    """Store one Python object per sample under ``key``."""
    if len(values) != td.batch_size[0]:
        raise ValueError(f"{key}: {len(values)} values for a batch of {td.batch_size[0]}")
    td.set(key, NonTensorStack.from_list(list(values)))


def get_non_tensor(td: TensorDict, key: str) -> list[Any]:
    """Per-sample Python objects under ``key`` as a plain list."""
    value = td.get(key)
    if isinstance(value, NonTensorStack):
        return list(value.tolist())
    if isinstance(value, NonTensorData):
        return [value.data] * td.batch_size[0]
    return list(value)


def trajectories(td: TensorDict) -> list[Any]:
    """The batch's `toolrl.core.trajectory.Trajectory` records, one per sample, in order."""
    return get_non_tensor(td, TRAJECTORIES)


def set_meta(td: TensorDict, key: str, value: Any) -> None:
    """Store one batch-wide value (NonTensorData)."""
    td.set_non_tensor(key, value)


# --- shape helpers ---------------------------------------------------------------------------
def batch_len(td: TensorDict) -> int:
    return int(td.batch_size[0])


def select_rows(td: TensorDict, index: Any) -> TensorDict:
    """Index rows with a slice, a list, a numpy array or a tensor; batch size stays plain ints."""
    if isinstance(index, np.ndarray):
        index = torch.from_numpy(index)
    elif isinstance(index, list):
        index = torch.as_tensor(index, dtype=torch.bool if index and isinstance(index[0], bool)
                                else torch.long)
    out = td[index]
    out.batch_size = torch.Size([int(s) for s in out.batch_size])
    return out


def pad_to_divisor(td: TensorDict, divisor: int) -> tuple[TensorDict, int]:
    """Append copies of the first rows until the batch divides by ``divisor``.

    Returns (padded batch, number of padding rows); `unpad` drops them again.
    """
    if divisor < 1:
        raise ValueError(f"divisor must be >= 1, got {divisor}")
    n = batch_len(td)
    if n == 0:
        raise ValueError("cannot pad an empty batch")
    pad = (-n) % divisor
    if pad == 0:
        return td, 0
    idx = torch.arange(pad) % n
    extra = select_rows(td, idx)
    out = concat([td, extra])
    return out, pad


def unpad(td: TensorDict, pad: int) -> TensorDict:
    """Drop the last ``pad`` rows added by `pad_to_divisor`."""
    return td if pad == 0 else select_rows(td, slice(0, batch_len(td) - pad))


def split(td: TensorDict, n: int) -> list[TensorDict]:
    """Split into exactly ``n`` contiguous shards of equal size (the batch must divide by n).

    `td.chunk` can return fewer pieces than asked, so sizes are explicit here.
    """
    size = batch_len(td)
    if size % n:
        raise ValueError(f"batch of {size} does not split evenly into {n}; pad_to_divisor first")
    step = size // n
    return [select_rows(td, slice(i * step, (i + 1) * step)) for i in range(n)]


def split_sizes(td: TensorDict, sizes: Sequence[int]) -> list[TensorDict]:
    """Split into contiguous shards of the given sizes."""
    if sum(sizes) != batch_len(td):
        raise ValueError(f"sizes {list(sizes)} do not add up to the batch of {batch_len(td)}")
    out, start = [], 0
    for s in sizes:
        out.append(select_rows(td, slice(start, start + s)))
        start += s
    return out


def concat(tds: Sequence[TensorDict]) -> TensorDict:
    """Concatenate along the batch dimension, keeping NonTensorStack entries and their order.

    Batch-wide NonTensorData must agree across parts (it is kept once). Tensors must have the
    same trailing shape; padding parts to a common width is the caller's job.
    """
    if not tds:
        raise ValueError("nothing to concatenate")
    if len(tds) == 1:
        return tds[0]
    keys = _check_same_keys(tds)
    tensors = {k: torch.cat([t.get(k) for t in tds], dim=0)
               for k in keys if isinstance(tds[0].get(k), torch.Tensor)}
    out = TensorDict(tensors, batch_size=[sum(batch_len(t) for t in tds)])
    for k in keys:
        first = tds[0].get(k)
        if isinstance(first, torch.Tensor):
            continue
        if isinstance(first, NonTensorStack):
            values: list[Any] = []
            for t in tds:
                values.extend(get_non_tensor(t, k))
            set_non_tensor(out, k, values)
        elif isinstance(first, NonTensorData):
            vals = [t.get_non_tensor(k) for t in tds]
            if any(v != vals[0] for v in vals[1:]):
                raise ValueError(f"batch-wide value {k!r} differs between parts: {vals}")
            set_meta(out, k, vals[0])
        elif isinstance(first, TensorDict):
            out.set(k, concat([t.get(k) for t in tds]))
        else:
            raise TypeError(f"cannot concatenate entry {k!r} of type {type(first).__name__}")
    return out


def _check_same_keys(tds: Sequence[TensorDict]) -> list[str]:
    keys = list(tds[0].keys())
    for i, t in enumerate(tds[1:], start=1):
        if set(t.keys()) != set(keys):
            raise ValueError(f"part {i} has keys {sorted(t.keys())}, part 0 has {sorted(keys)}")
    return keys


def repeat_interleave(td: TensorDict, n: int, uids: Sequence[str] | None = None) -> TensorDict:
    """Repeat each row ``n`` times in place (a GRPO group); rows of one group share a ``UID``.

    ``uids`` gives one id per input row; by default the input's ``UID`` entry or row indices.
    """
    size = batch_len(td)
    if uids is None:
        uids = get_non_tensor(td, UID) if UID in td else [str(i) for i in range(size)]
    idx = torch.arange(size).repeat_interleave(n)
    out = select_rows(td, idx)
    set_non_tensor(out, UID, [uids[i] for i in idx.tolist()])
    return out


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)
