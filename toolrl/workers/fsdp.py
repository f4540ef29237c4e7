"""FSDP2 building blocks shared by the actor, reference and critic.

- `init_distributed`: the default process group (``env://`` inside a worker group; a world of
  one when a class is used on its own), gloo on CPU and NCCL on GPU.
- `build_model`: a Hugging Face model from a checkpoint, optionally with gradient checkpointing.
- `shard_model`: ``fully_shard`` on every decoder layer, then on the root (FSDP2), with a
  mixed-precision policy.
- `build_sharded_model`: both, with the checkpoint read once: rank 0 loads it, the other ranks
  build the architecture on the meta device, and rank 0's weights are broadcast into every
  rank's shards (one full copy per run in host memory, not one per rank).
- `full_state_dict`: the unsharded weights on rank 0 (CPU), through the
  ``torch.distributed.checkpoint`` state-dict API; other ranks get an empty dict.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import transformers
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from toolrl.workers.host_memory import release_memory

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def torch_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """``"bfloat16"`` -> ``torch.bfloat16`` (None stays None)."""
    if name is None or isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}") from None


DEVICE_ENV = "TOOLRL_DEVICE"  # "cpu" keeps a process on the CPU although a GPU is visible
MIXED_BACKEND = "cpu:gloo,cuda:nccl"  # CUDA tensors over NCCL, CPU tensors (metrics) over gloo


def default_device() -> torch.device:
    """``cuda:<LOCAL_RANK>`` when a GPU is visible, else ``cpu``; ``TOOLRL_DEVICE=cpu`` keeps
    the process on the CPU anyway (CPU tests on a GPU box: two ranks on one GPU are refused
    by NCCL, and a forked child cannot use CUDA)."""
    forced = os.environ.get(DEVICE_ENV, "").strip().lower()
    if forced not in ("", "cpu", "cuda"):
        raise ValueError(f"{DEVICE_ENV}={forced!r}: choose cpu or cuda")
    if forced == "cpu":
        return torch.device("cpu")
    if forced == "cuda" or torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
        return torch.device("cuda", local)
    return torch.device("cpu")


def init_distributed(backend: str | None = None, timeout_s: float = 600.0) -> None:
    """Make sure a default process group exists.

    Inside a worker group (``MASTER_PORT`` set) this joins it with ``env://``; otherwise it
    creates a world of one, so the same classes run in a plain process. The backend defaults
    to `default_backend` of `default_device`.
    """
    if dist.is_initialized():
        return
    device = default_device()
    backend = backend or default_backend(device)
    kwargs: dict[str, Any] = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    if "MASTER_PORT" in os.environ:
        dist.init_process_group(init_method="env://", rank=int(os.environ.get("RANK", 0)),
                                world_size=int(os.environ.get("WORLD_SIZE", 1)), **kwargs)
    else:
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **kwargs)


def default_backend(device: torch.device) -> str:
    """gloo on CPU; on GPU NCCL for CUDA tensors and gloo for CPU ones (metrics all-reduced
    from the host, checkpoint barriers), as verl does: an NCCL-only group refuses CPU tensors."""
    return MIXED_BACKEND if device.type == "cuda" else "gloo"


def device_mesh(device: torch.device | None = None) -> DeviceMesh:
    """A 1-D data-parallel mesh over the default group."""
    device = device or default_device()
    return init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))


def build_model(path: str, auto_cls: Any = None, dtype: str | torch.dtype = "float32",
                gradient_checkpointing: bool = False, **kwargs: Any) -> nn.Module:
    """Load a Hugging Face model on CPU (``auto_cls`` defaults to AutoModelForCausalLM)."""
    if auto_cls is None:
        auto_cls = transformers.AutoModelForCausalLM
    model = auto_cls.from_pretrained(path, dtype=torch_dtype(dtype), **kwargs)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one (HF's ``_no_split_modules`` classes)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__}: it declares "
                         f"no _no_split_modules classes that occur in the model")
    return layers


def mixed_precision(param_dtype: str | torch.dtype | None = None,
                    reduce_dtype: str | torch.dtype | None = None) -> MixedPrecisionPolicy:
    """FSDP2 mixed precision: compute in ``param_dtype``, reduce gradients in ``reduce_dtype``
    (None keeps the parameters' own dtype, e.g. fp32 on CPU)."""
    return MixedPrecisionPolicy(param_dtype=torch_dtype(param_dtype),
                                reduce_dtype=torch_dtype(reduce_dtype))


def shard_model(model: nn.Module, mesh: DeviceMesh,
                mp_policy: MixedPrecisionPolicy | None = None,
                reshard_after_forward: bool = True) -> nn.Module:
    """``fully_shard`` every decoder layer, then the root (parameters move to the mesh's device)."""
    mp_policy = mp_policy or MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy,
                    reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    return model


def build_sharded_model(path: str, mesh: DeviceMesh, auto_cls: Any = None,
                        dtype: str | torch.dtype = "float32", gradient_checkpointing: bool = False,
                        mp_policy: MixedPrecisionPolicy | None = None,
                        reshard_after_forward: bool = True, freeze: bool = False,
                        prepare: Callable[[nn.Module], nn.Module] | None = None,
                        **kwargs: Any) -> nn.Module:
    """`build_model` + `shard_model` with the checkpoint read by rank 0 only.

    The other ranks build the same architecture on the meta device (no memory), shard it,
    allocate their shards (``to_empty``) and receive them from rank 0
    (``set_model_state_dict(..., broadcast_from_rank0=True)``); buffers the state dict does not
    hold (rotary frequencies) are broadcast too. Every rank must call it. A world of one loads
    directly. ``freeze`` turns gradients off (a reference model). ``prepare`` transforms the
    unsharded model on every rank before it is sharded (e.g. `toolrl.workers.lora` injects
    adapters; rank 0's adapter initialization is the one broadcast).
    """
    if auto_cls is None:
        auto_cls = transformers.AutoModelForCausalLM
    full: dict[str, torch.Tensor] = {}
    if world_size() == 1 or rank() == 0:
        model = build_model(path, auto_cls, dtype, gradient_checkpointing, **kwargs)
        if prepare is not None:
            model = prepare(model)
        if world_size() > 1:
            full = model.state_dict()  # the full tensors sharding replaces, kept to broadcast
    else:
        config = kwargs.pop("config", None) or transformers.AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            model = auto_cls.from_config(config, dtype=torch_dtype(dtype), **kwargs)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        if prepare is not None:
            model = prepare(model)
    if freeze:
        model.requires_grad_(False)
    model = shard_model(model, mesh, mp_policy, reshard_after_forward)
    if world_size() == 1:
        return model
    if rank() != 0:
        model.to_empty(device=mesh.device_type)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True,
                                                               broadcast_from_rank0=True))
    del full
    for _, buf in sorted(model.named_buffers(), key=lambda kv: kv[0]):
        dist.broadcast(buf, src=0)
    if rank() == 0:  # the unsharded copy is gone: hand its memory back (`release_memory`)
        release_memory()
    return model


def ties_embeddings(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", lambda: config)()
    return bool(getattr(text, "tie_word_embeddings", False))


def full_state_dict(model: nn.Module, skip_tied: bool = False) -> dict[str, torch.Tensor]:
    """Every rank must call this: rank 0 gets the unsharded weights on CPU, others ``{}``.

    ``skip_tied`` drops ``lm_head.weight`` when the embeddings are tied (HF checkpoints and
    vLLM do not have it).
    """
    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if skip_tied and ties_embeddings(model):
        state.pop("lm_head.weight", None)
    return state


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded gradients by parameter name, on every rank (a collective; for tests and
    debugging)."""
    out = {}
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        grad = param.grad
        out[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().cpu()
    return out


def all_reduce(values: torch.Tensor, op: Callable[..., Any] | Any = None) -> torch.Tensor:
    """All-reduce a small tensor (sum by default) on the default group's device; returns it."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    device = default_device() if dist.get_backend() == "nccl" else torch.device("cpu")
    buf = values.to(device)
    dist.all_reduce(buf, op=op or dist.ReduceOp.SUM)
    return buf.to(values.device)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


__all__ = [
    "all_reduce",
    "build_model",
    "build_sharded_model",
    "decoder_layers",
    "default_backend",
    "default_device",
    "device_mesh",
    "full_gradients",
    "full_state_dict",
    "init_distributed",
    "mixed_precision",
    "rank",
    "shard_model",
    "ties_embeddings",
    "torch_dtype",
    "world_size",
]
