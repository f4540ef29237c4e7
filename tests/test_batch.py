"""The TensorDict batch contract: builders, padding, split/concat round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from toolrl import batch as B

token_lists = st.lists(st.lists(st.integers(1, 1000), min_size=0, max_size=6), min_size=1,
                       max_size=12)


def _sample_batch(prompts, seed=0):
    rng = np.random.default_rng(seed)
    responses = [list(rng.integers(1, 1000, size=int(rng.integers(1, 5)))) for _ in prompts]
    masks = [[int(x) for x in rng.integers(0, 2, size=len(r))] for r in responses]
    logps = [[float(-x) for x in rng.random(len(r))] for r in responses]
    rows = [{"id": i, "nested": {"tools": ["t"] * i}} for i in range(len(prompts))]
    return B.build_rollout_batch(prompts, responses, masks, pad_token_id=0,
                                 rollout_log_probs=logps, non_tensor={B.ROWS: rows})


def _assert_same(a: TensorDict, b: TensorDict):
    assert a.batch_size == b.batch_size
    assert set(a.keys()) == set(b.keys())
    for key in a.keys():  # noqa: SIM118 (TensorDict iteration is not over keys)
        va = a.get(key)
        if isinstance(va, torch.Tensor):
            assert torch.equal(va, b.get(key)), key
        else:
            assert B.get_non_tensor(a, key) == B.get_non_tensor(b, key), key


def test_layout_left_prompts_right_responses():
    td = B.build_rollout_batch([[5, 6], [7]], [[8, 9, 10], [11]], [[1, 0, 1], [1]],
                               pad_token_id=0, rollout_log_probs=[[-1, 0, -2], [-3]])
    assert td[B.PROMPTS].tolist() == [[5, 6], [0, 7]]
    assert td[B.RESPONSES].tolist() == [[8, 9, 10], [11, 0, 0]]
    assert td[B.INPUT_IDS].tolist() == [[5, 6, 8, 9, 10], [0, 7, 11, 0, 0]]
    assert td[B.ATTENTION_MASK].tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert td[B.POSITION_IDS].tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 0, 0]]
    assert td[B.RESPONSE_MASK].tolist() == [[1, 0, 1], [1, 0, 0]]
    assert td[B.ROLLOUT_LOG_PROBS].tolist() == [[-1, 0, -2], [-3, 0, 0]]


def test_mismatched_mask_is_rejected():
    with pytest.raises(ValueError, match="mask has 1"):
        B.build_rollout_batch([[1]], [[2, 3]], [[1]], pad_token_id=0)


@settings(max_examples=60, deadline=None)
@given(prompts=token_lists, n=st.integers(1, 8))
def test_pad_split_concat_unpad_round_trip(prompts, n):
    td = _sample_batch(prompts)
    padded, pad = B.pad_to_divisor(td, n)
    assert B.batch_len(padded) % n == 0 and pad < n
    shards = B.split(padded, n)
    assert len(shards) == n
    assert all(B.batch_len(s) == B.batch_len(padded) // n for s in shards)
    _assert_same(B.unpad(B.concat(shards), pad), td)


@settings(max_examples=40, deadline=None)
@given(prompts=token_lists, data=st.data())
def test_split_sizes_round_trip(prompts, data):
    td = _sample_batch(prompts)
    size = B.batch_len(td)
    cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=4)))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, size], strict=True)]
    sizes = [s for s in sizes if s] or [size]
    _assert_same(B.concat(B.split_sizes(td, sizes)), td)


@settings(max_examples=30, deadline=None)
@given(prompts=token_lists, n=st.integers(1, 5))
def test_repeat_interleave_groups_share_uid(prompts, n):
    td = _sample_batch(prompts)
    g = B.repeat_interleave(td, n, uids=[f"task-{i}" for i in range(B.batch_len(td))])
    assert B.batch_len(g) == n * B.batch_len(td)
    uids = B.get_non_tensor(g, B.UID)
    rows = B.get_non_tensor(g, B.ROWS)
    for i in range(B.batch_len(td)):
        group = slice(i * n, (i + 1) * n)
        assert set(uids[group]) == {f"task-{i}"}
        assert rows[group] == [B.get_non_tensor(td, B.ROWS)[i]] * n
        assert torch.equal(g[B.INPUT_IDS][group], td[B.INPUT_IDS][i].expand(n, -1))


def test_numpy_mask_indexing_keeps_plain_int_batch_size():
    td = _sample_batch([[1], [2, 3], [4]])
    sub = B.select_rows(td, np.array([True, False, True]))
    assert sub.batch_size == torch.Size([2])
    assert all(type(s) is int for s in sub.batch_size)
    assert [r["id"] for r in B.get_non_tensor(sub, B.ROWS)] == [0, 2]
    sub = B.select_rows(td, np.array([2, 0]))
    assert [r["id"] for r in B.get_non_tensor(sub, B.ROWS)] == [2, 0]


def test_batch_wide_meta_survives_concat_and_must_agree():
    a, b = _sample_batch([[1]]), _sample_batch([[2]])
    B.set_meta(a, "policy_version", 3)
    B.set_meta(b, "policy_version", 3)
    assert B.concat([a, b]).get_non_tensor("policy_version") == 3
    B.set_meta(b, "policy_version", 4)
    with pytest.raises(ValueError, match="differs"):
        B.concat([a, b])


def test_split_requires_divisible_batch():
    with pytest.raises(ValueError, match="pad_to_divisor"):
        B.split(_sample_batch([[1], [2], [3]]), 2)
