"""The `remote` table: recorded as frozen class data, validated when the class is created."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tensordict import TensorDict

from toolrl.controller import (
    Dispatch,
    Execute,
    RemoteSpec,
    RemoteSpecError,
    Worker,
    WorkerContext,
    remote,
)


class Base(Worker):
    @remote(Dispatch.DP_SPLIT)
    def score(self, batch: TensorDict, scale: float = 1.0) -> TensorDict:
        batch["score"] = batch["x"] * scale
        return batch

    @remote()
    def save_checkpoint(self, path: str) -> str:
        return f"base:{path}"

    def helper(self) -> int:
        return 1


class Child(Base):
    def score(self, batch: TensorDict, scale: float = 1.0) -> TensorDict:  # no decorator
        batch["score"] = batch["x"] * scale * 10
        return batch

    @remote(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO)
    def save_checkpoint(self, path: str) -> str:
        return f"child:{path}"

    @remote(Dispatch.DP_SPLIT_RAW, batch_arg="data")
    def metrics(self, step: int, data: TensorDict) -> dict:
        return {"step": step, "n": data.batch_size[0]}


def _messages(exc: BaseException) -> str:
    """All messages along an exception's cause chain (3.11 wraps __set_name__ errors)."""
    out = []
    while exc is not None:
        out.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return " | ".join(out)


def test_table_is_class_data_with_frozen_specs():
    spec = Base.__remote__["score"]
    assert spec == RemoteSpec(name="score", dispatch=Dispatch.DP_SPLIT, execute=Execute.ALL,
                              batch_arg="batch", mesh=None, owner="Base")
    assert set(Base.__remote__) == {"score", "save_checkpoint"}
    assert "helper" not in Base.__remote__
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.dispatch = Dispatch.ONE_TO_ALL  # type: ignore[misc]
    with pytest.raises(TypeError):
        Base.__remote__["helper"] = spec  # type: ignore[index]
    # The method stays the plain function: go-to-definition and local calls work.
    assert Base.score.__qualname__ == "Base.score"
    assert Worker.__remote__ == {}


def test_subclass_inherits_and_overrides_specs():
    assert Child.__remote__["score"] is Base.__remote__["score"]  # inherited through override
    assert Child.__remote__["save_checkpoint"].execute is Execute.RANK_ZERO
    assert Child.__remote__["save_checkpoint"].owner == "Child"
    assert Base.__remote__["save_checkpoint"].execute is Execute.ALL  # parent untouched
    assert Child.__remote__["metrics"].batch_arg == "data"
    assert "metrics" not in Base.__remote__


def test_worker_runs_in_one_process_as_rank_zero_of_one(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    worker = Child()
    assert (worker.rank, worker.world_size, worker.local_rank) == (0, 1, 0)
    assert worker.device == torch.device("cpu") or worker.device.type == "cuda"
    out = worker.score(TensorDict({"x": torch.arange(3)}, batch_size=[3]), scale=2.0)
    assert out["score"].tolist() == [0, 20, 40]
    assert worker.save_checkpoint("p") == "child:p"


def test_context_reads_the_distributed_environment():
    ctx = WorkerContext.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                  "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
                                  "MASTER_PORT": "1234"})
    assert ctx == WorkerContext(3, 4, 1, 2, "10.0.0.1", 1234)
    assert WorkerContext.from_env(ctx.env()) == ctx


def test_unknown_mode_fails_at_class_creation():
    with pytest.raises(RemoteSpecError, match=r"unknown dispatch mode 'DP_SPLT'.*DP_SPLIT"):
        class Bad(Worker):
            @remote("DP_SPLT")
            def f(self, batch): ...

    with pytest.raises(RemoteSpecError, match=r"unknown execute mode 'RANK_0'"):
        class Bad2(Worker):
            @remote(Dispatch.ONE_TO_ALL, "RANK_0")
            def f(self): ...

    with pytest.raises(AttributeError, match="DP_SPLT"):
        class Bad3(Worker):
            @remote(Dispatch.DP_SPLT)  # type: ignore[attr-defined]
            def f(self, batch): ...


def test_mode_names_are_accepted_as_strings():
    class FromConfig(Worker):
        @remote("DP_SPLIT", "ALL")
        def f(self, batch): ...

    assert FromConfig.__remote__["f"].dispatch is Dispatch.DP_SPLIT


@pytest.mark.parametrize("mode", [Dispatch.DP_SPLIT, Dispatch.DP_SPLIT_RAW])
def test_split_mode_needs_a_batch_argument(mode):
    with pytest.raises(RemoteSpecError, match=r"Bad\.f: .* has no batch argument"):
        class Bad(Worker):
            @remote(mode)
            def f(self): ...

    with pytest.raises(RemoteSpecError, match=r"batch_arg='data' is not a parameter"):
        class Bad2(Worker):
            @remote(mode, batch_arg="data")
            def f(self, batch): ...

    with pytest.raises(RemoteSpecError, match="no batch argument"):
        class Bad3(Worker):
            @remote(mode)
            def f(self, *args, **kwargs): ...


def test_inconsistent_options_fail_at_class_creation():
    with pytest.raises(RemoteSpecError, match="RANK_ZERO runs one worker"):
        class Bad(Worker):
            @remote(Dispatch.DP_SPLIT, Execute.RANK_ZERO)
            def f(self, batch): ...

    with pytest.raises(RemoteSpecError, match="mesh only applies to DP_SPLIT"):
        class Bad2(Worker):
            @remote(Dispatch.ONE_TO_ALL, mesh="actor")
            def f(self): ...

    with pytest.raises(RemoteSpecError, match="batch_arg only applies"):
        class Bad3(Worker):
            @remote(Dispatch.ALL_TO_ALL, batch_arg="x")
            def f(self, x): ...


def test_spec_on_a_non_method_fails():
    with pytest.raises(RemoteSpecError, match="not a staticmethod"):
        class Bad(Worker):
            @remote()
            @staticmethod
            def f(): ...

    with pytest.raises(RemoteSpecError, match="not a property"):
        class Bad2(Worker):
            @remote()
            @property
            def f(self): ...

    with pytest.raises(RemoteSpecError, match="not on a free function"):
        @remote()
        def free(self): ...

    with pytest.raises(RemoteSpecError, match="takes self"):
        class Bad3(Worker):
            @remote()
            def f(*args): ...


def test_spec_outside_a_worker_class_fails():
    with pytest.raises((RemoteSpecError, RuntimeError)) as info:
        class NotAWorker:
            @remote()
            def f(self): ...
    assert "NotAWorker is not a subclass of toolrl.controller.Worker" in _messages(info.value)


def test_overriding_a_remote_method_with_a_non_method_fails():
    with pytest.raises(RemoteSpecError, match=r"overrides a @remote method .* non-method \(int\)"):
        class Bad(Base):
            score = 3
