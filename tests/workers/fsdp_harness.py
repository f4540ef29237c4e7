"""Test helpers: run a function on N fork-started ranks (gloo), and realistic rollout batches."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict

from toolrl.batch import (
    ADVANTAGES,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    ROLLOUT_LOG_PROBS,
    build_rollout_batch,
    set_meta,
)
from toolrl.controller.network import free_port


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, out_dir: str,
           init: bool, device: str, args: tuple[Any, ...]) -> None:
    # the device is the test's choice, not the machine's: CPU tests stay on gloo on a GPU box
    os.environ["TOOLRL_DEVICE"] = device
    # one thread: 2 ranks on 2 shared cores, and a forked child must not grow the OpenMP pool
    # its parent already used (libgomp deadlocks after fork)
    torch.set_num_threads(1)
    if init:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world_size))
        from toolrl.workers.fsdp import init_distributed

        init_distributed(timeout_s=120)
    try:
        result = fn(rank, *args)
        torch.save(result, Path(out_dir) / f"{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, init: bool = True,
              timeout_s: float = 180.0, start_method: str | None = None,
              device: str = "cpu") -> list[Any]:
    """Run ``fn(rank, *args)`` on ``world_size`` processes sharing a process group (gloo on
    ``device="cpu"``, the default even where a GPU is visible; ``cpu:gloo,cuda:nccl`` on
    ``"cuda"``; none when ``init=False``: ``fn`` sets up its own); return each rank's result
    (rank order). A rank that raises fails the call with its traceback. Ranks are forked on the
    CPU and spawned on CUDA (a forked child cannot use it), and spawned on any machine with a
    GPU: the parent's first backward starts autograd's threads for every device there, and a
    forked child's backward then refuses to run (seen on an H100 box)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    gpu_box = torch.cuda.is_available()
    start_method = start_method or ("spawn" if device == "cuda" or gpu_box else "fork")
    out_dir = tempfile.mkdtemp(prefix="fsdp-test-")
    ctx = mp.start_processes(_entry, args=(fn, world_size, free_port(), out_dir, init, device,
                                           args),
                             nprocs=world_size, join=False, start_method=start_method)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not finish within {timeout_s} s")
        return [torch.load(Path(out_dir) / f"{r}.pt", weights_only=False)
                for r in range(world_size)]
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
        shutil.rmtree(out_dir, ignore_errors=True)


def make_batch(n: int, seed: int = 0, vocab: int = 4096, pad: int = 0,
               holes: bool = True, group_size: int = 1) -> TensorDict:
    """A rollout batch with varied prompt/response lengths and (optionally) loss-mask holes
    where tool-observation tokens sit inside the response; consecutive rows share a prompt
    in groups of ``group_size`` (as a GRPO group does)."""
    g = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi, (1,), generator=g))

    prompts, responses, masks = [], [], []
    for i in range(n):
        if i % group_size == 0:
            prompt = torch.randint(3, vocab, (randint(3, 14),), generator=g).tolist()
        prompts.append(prompt)
        length = randint(2, 18)
        responses.append(torch.randint(3, vocab, (length,), generator=g).tolist())
        mask = [1] * length
        if holes and length >= 8 and i % 2 == 0:
            start = randint(2, length - 4)
            for j in range(start, start + 3):  # a tool observation: not the policy's tokens
                mask[j] = 0
        masks.append(mask)
    td = build_rollout_batch(prompts, responses, masks, pad_token_id=pad,
                             non_tensor={"rows": [{"task": i} for i in range(n)]})
    set_meta(td, "note", "per-batch values ride along")
    r = td[RESPONSE_MASK].shape[1]
    rm = td[RESPONSE_MASK].float()
    td[ADVANTAGES] = torch.randn(n, 1, generator=g).expand(n, r) * rm
    td[ROLLOUT_LOG_PROBS] = -torch.rand(n, r, generator=g) * 5 * rm
    return td


def hf_log_probs(model_dir: str | Path, td: TensorDict, temperature: float = 1.0
                 ) -> torch.Tensor:
    """Reference log-probs of the response tokens from a plain transformers forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    r = td["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=td["input_ids"], attention_mask=td["attention_mask"],
                       position_ids=td["position_ids"]).logits[:, -r - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, -1)
    out = logp.gather(-1, td["responses"].unsqueeze(-1)).squeeze(-1)
    return out * td["attention_mask"][:, -r:]


def with_policy_inputs(model_dir: str | Path, td: TensorDict, seed: int = 1,
                       noise: float = 0.3) -> TensorDict:
    """Add old/ref log-probs near the model's own (so PPO ratios are realistic, some clipped)."""
    g = torch.Generator().manual_seed(seed)
    lp = hf_log_probs(model_dir, td)
    mask = td[RESPONSE_MASK].float()
    td[OLD_LOG_PROBS] = (lp + noise * torch.randn(lp.shape, generator=g)) * mask
    td[REF_LOG_PROBS] = (lp + noise * torch.randn(lp.shape, generator=g)) * mask
    return td
