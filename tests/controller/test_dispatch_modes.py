"""Scatter/gather of every dispatch mode, in one process (no Ray)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from toolrl.batch import get_non_tensor, set_meta, set_non_tensor
from toolrl.controller import (
    Dispatch,
    DispatchError,
    DpLayout,
    Execute,
    MeshCoordinate,
    Sharded,
    Worker,
    remote,
)
from toolrl.controller.dispatch import gather, scatter


class W(Worker):
    @remote(Dispatch.DP_SPLIT)
    def split(self, batch: TensorDict, tag: str = "") -> TensorDict:
        return batch

    @remote(Dispatch.DP_SPLIT_RAW, batch_arg="batch")
    def raw(self, step: int, batch: TensorDict) -> dict:
        return {}

    @remote(Dispatch.ONE_TO_ALL)
    def bcast(self, a: int, b: int = 0) -> int:
        return a

    @remote(Dispatch.ALL_TO_ALL)
    def each(self, a: int, b: int = 0) -> int:
        return a

    @remote(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO)
    def once(self, a: int) -> int:
        return a


SPEC = W.__remote__


def make_batch(n: int, width: int = 3) -> TensorDict:
    td = TensorDict({"x": torch.arange(n * width).reshape(n, width),
                     "row": torch.arange(n)}, batch_size=[n])
    set_non_tensor(td, "rows", [{"id": i, "msg": [{"role": "user", "content": f"q{i}"}]}
                                for i in range(n)])
    set_meta(td, "step", 7)
    return td


def run_identity(spec, batch, layout, **kwargs):
    """Scatter, let each worker return what it got (tagged with its rank), gather."""
    plan = scatter(spec, (batch,), kwargs, layout)
    outputs = []
    for rank, (args, _kw) in zip(plan.ranks, plan.calls, strict=True):
        shard = args[0].clone()
        shard["worker"] = torch.full((shard.batch_size[0],), rank)
        outputs.append(shard)
    return plan, gather(spec, outputs, plan, layout)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 23), world=st.integers(1, 5))
def test_dp_split_round_trip_keeps_order_size_and_objects(n, world):
    batch = make_batch(n)
    plan, out = run_identity(SPEC["split"], batch, DpLayout.identity(world))
    assert plan.pad == (-n) % world
    assert out.batch_size == torch.Size([n])
    assert torch.equal(out["x"], batch["x"]) and torch.equal(out["row"], batch["row"])
    assert get_non_tensor(out, "rows") == get_non_tensor(batch, "rows")
    assert out.get_non_tensor("step") == 7
    # Shards are contiguous and balanced: worker ids never decrease along the rows.
    assert out["worker"].tolist() == sorted(out["worker"].tolist())


def test_dp_split_shards_are_equal_and_padding_is_trimmed():
    plan = scatter(SPEC["split"], (make_batch(5),), {"tag": "t"}, DpLayout.identity(4))
    sizes = [args[0].batch_size[0] for args, _ in plan.calls]
    assert sizes == [2, 2, 2, 2] and plan.pad == 3 and plan.padded_size == 8
    assert all(kw == {"tag": "t"} for _, kw in plan.calls)  # other arguments broadcast


def test_dp_split_batch_passed_by_keyword_and_raw_mode():
    layout = DpLayout.identity(3)
    plan = scatter(SPEC["raw"], (5,), {"batch": make_batch(7)}, layout)
    assert [a for a, _ in plan.calls] == [(5,)] * 3
    assert [kw["batch"].batch_size[0] for _, kw in plan.calls] == [3, 3, 3]
    outputs = [{"rank": r} for r in plan.ranks]
    assert gather(SPEC["raw"], outputs, plan, layout) == [{"rank": 0}, {"rank": 1}, {"rank": 2}]


def test_mesh_layout_sends_replicas_the_same_shard_and_collects_sources_only():
    # 4 workers, tp=2 x dp=2: ranks 0,1 are dp 0; ranks 2,3 are dp 1; tp rank 0 collects.
    layout = DpLayout.from_coordinates(
        "actor", [MeshCoordinate(r // 2, r % 2 == 0) for r in range(4)])
    assert layout.dp_size == 2 and layout.sources() == [0, 2]
    batch = make_batch(5)
    plan, out = run_identity(SPEC["split"], batch, layout)
    shards = [args[0]["row"].tolist() for args, _ in plan.calls]
    assert shards[0] == shards[1] == [0, 1, 2] and shards[2] == shards[3] == [3, 4, 0]
    assert out["row"].tolist() == [0, 1, 2, 3, 4]
    assert out["worker"].tolist() == [0, 0, 0, 2, 2]


def test_mesh_layout_errors_are_clear():
    with pytest.raises(DispatchError, match=r"ranks \[1\] did not register mesh 'actor'"):
        DpLayout.from_coordinates("actor", [MeshCoordinate(0), None])
    with pytest.raises(DispatchError, match="dp rank 0 needs exactly one collect source"):
        DpLayout.from_coordinates("actor", [MeshCoordinate(0, True), MeshCoordinate(0, True)])
    with pytest.raises(DispatchError, match=r"dp ranks \[1\] have no worker"):
        DpLayout.from_coordinates("actor", [MeshCoordinate(0), MeshCoordinate(2)])


def test_pre_sharded_batch_goes_through_untouched():
    layout = DpLayout.identity(2)
    plan = scatter(SPEC["split"], (Sharded(("ref0", "ref1"), pad=1),), {}, layout)
    assert [a[0] for a, _ in plan.calls] == ["ref0", "ref1"] and plan.pad == 1
    with pytest.raises(DispatchError, match="got 3 shards for 2 dp ranks"):
        scatter(SPEC["split"], (Sharded(("a", "b", "c")),), {}, layout)


def test_one_to_all_all_to_all_and_rank_zero():
    layout = DpLayout.identity(3)
    plan = scatter(SPEC["bcast"], (1,), {"b": 2}, layout)
    assert plan.calls == (((1,), {"b": 2}),) * 3
    assert gather(SPEC["bcast"], [1, 1, 1], plan, layout) == [1, 1, 1]
    plan = scatter(SPEC["each"], ([1, 2, 3],), {"b": [4, 5, 6]}, layout)
    assert plan.calls == (((1,), {"b": 4}), ((2,), {"b": 5}), ((3,), {"b": 6}))
    plan = scatter(SPEC["once"], (9,), {}, layout)
    assert plan.ranks == (0,) and gather(SPEC["once"], [9], plan, layout) == 9


def test_bad_arguments_fail_on_the_driver():
    layout = DpLayout.identity(2)
    with pytest.raises(DispatchError, match=r"ALL_TO_ALL: argument 0 must be a list with one "
                                            r"item per worker \(2\), got a list of length 3"):
        scatter(SPEC["each"], ([1, 2, 3],), {}, layout)
    with pytest.raises(DispatchError, match="argument 'batch' must be a TensorDict, got dict"):
        scatter(SPEC["split"], ({"x": 1},), {}, layout)
    with pytest.raises(DispatchError, match="cannot split an empty batch"):
        scatter(SPEC["split"], (make_batch(0),), {}, layout)
    with pytest.raises(TypeError, match=r"bad arguments for W\.bcast"):
        scatter(SPEC["bcast"], (1, 2, 3), {}, layout)
    with pytest.raises(TypeError, match=r"bad arguments for W\.split"):
        scatter(SPEC["split"], (), {"tag": "x"}, layout)


def test_dp_split_output_errors():
    layout = DpLayout.identity(2)
    plan = scatter(SPEC["split"], (make_batch(3),), {}, layout)
    with pytest.raises(DispatchError, match=r"must return a TensorDict .* DP_SPLIT_RAW"):
        gather(SPEC["split"], [{"a": 1}, {"a": 2}], plan, layout)
    with pytest.raises(DispatchError, match="one row per input row"):
        gather(SPEC["split"], [make_batch(1), make_batch(1)], plan, layout)
    assert gather(SPEC["split"], [None, None], plan, layout) is None
