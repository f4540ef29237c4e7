"""Log-probs and entropy of response tokens with as little work and memory as possible.

`score_responses(model, td)` returns ``[b, R]`` log-probs (and entropies) of a micro-batch's
response tokens in the rollout layout (`toolrl.batch`). Two things make it lean:

- **The LM head runs only where it is needed, a chunk at a time.** The trunk's hidden states
  are taken at the positions that predict a real response token (padding never reaches the
  head), and the head, the log-softmax and the entropy run on ``chunk_size`` positions at a
  time. With several chunks each one is recomputed in backward instead of kept, so the
  ``[positions x vocab]`` float32 logits never exist whole (151,936 columns for Qwen).
- **A prompt shared by several rows runs once** (``shared_prefix``; a GRPO group is the same
  prompt ``group_size`` times, and tool schemas make prompts long). The unique prompts run
  first and fill a KV cache; the cache is indexed out to every row of a group and only the
  responses run on top of it. The gradient flows through the cache into the prompt forward,
  so the result is the padded computation, with each prompt's share done once per group.
  The responses run in runs of similar length (`length_buckets`), so a few long ones do not
  pad the rest.

Layouts of the trunk (`LAYOUTS`): ``padded`` (rows run whole with the attention mask, in
runs of similar length each cropped to its own longest row: `length_buckets`), ``packed``
(real tokens of all rows in one row, position ids restarting per sample), ``shared_prefix``
(above), and ``auto``: ``packed`` where the packed row would attend by varlen (below), with or
without gradient checkpointing, as on torch's varlen kernel it measured fastest (bf16
forward+backward on an H100 at the Qwen2.5-0.5B shape: 140 ms against 228 padded and 277
shared-prefix, benchmarks/gpu_check.md); else ``shared_prefix`` when some rows share a prompt
and the cache can carry gradients, i.e. no gradient checkpointing while training (the fastest
in float32 and on the CPU); else ``padded``. ``auto`` decides inside the forward, from the
input embeddings' weight: FSDP2's mixed precision has gathered it in the compute dtype there.

The packed row attends in one of two ways (``packed_attention``, `toolrl.workers.varlen`):
``varlen``, torch's own variable-length FlashAttention kernel given each sample's cumulative
length (what ``packed_attention="auto"`` takes on CUDA in float16/bfloat16 for an sdpa model
with full-attention layers; the model then stays on ``toolrl_varlen``, which is sdpa for every
other call), or ``mask``, the model's own attention with the block-diagonal mask transformers
builds from the position ids (CPU, float32, other attention implementations). The route is
logged once.

Everything runs inside the model's own ``__call__`` (`enable_scoring` routes a keyword to it),
so FSDP2's hooks on the root module gather and free its parameters exactly as for a normal
forward.
"""

from __future__ import annotations

import math
import types
from typing import Any, NamedTuple

import torch
from tensordict import TensorDict
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from toolrl.algo.loss import log_probs_and_entropy, log_probs_from_logits
from toolrl.batch import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, PROMPTS, RESPONSES
from toolrl.workers import varlen

LAYOUTS = ("auto", "padded", "packed", "shared_prefix")
LOGITS_CHUNK_BYTES = 256 * 2**20  # float32 logits per chunk when chunk_size is not given
BUCKET_OVERHEAD_TOKENS = 1024  # what one more trunk call costs, in padded token positions
_KWARG = "toolrl_scoring"


def enable_scoring(model: nn.Module) -> nn.Module:
    """Let ``model(toolrl_scoring=job)`` run ``job(model)`` in place of the forward.

    The call still goes through ``model.__call__``, so module hooks (FSDP2's unshard/reshard of
    the root parameters, mixed-precision casts) wrap it as they wrap a forward. Idempotent.
    """
    if getattr(model, "_toolrl_scoring", False):
        return model
    original = model.forward

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        job = kwargs.pop(_KWARG, None)
        return original(*args, **kwargs) if job is None else job(self)

    model.forward = types.MethodType(forward, model)
    model._toolrl_scoring = True
    return model


def prompt_groups(td: TensorDict) -> Tensor:
    """``[b]`` group id of each row: rows with identical (padded) prompts share one id,
    numbered in order of first appearance."""
    prompts = td.get(PROMPTS)
    _, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    first: dict[int, int] = {}
    return torch.tensor([first.setdefault(int(g), len(first)) for g in inverse.tolist()],
                        dtype=torch.long, device=prompts.device)


def resolve_layout(layout: str, td: TensorDict, cache_ok: bool, varlen_ok: bool = False
                   ) -> str:
    """The concrete layout for ``td`` (see the module docstring for ``auto``). ``cache_ok``: the
    KV cache can carry gradients (no gradient checkpointing while training); ``varlen_ok``: a
    packed forward would attend by torch's varlen kernel (`varlen.packed_route`)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown forward layout {layout!r}; choose one of {list(LAYOUTS)}")
    if layout == "shared_prefix" and not cache_ok:
        raise ValueError("forward layout shared_prefix needs the KV cache to carry gradients: "
                         "turn gradient_checkpointing off (or use padded / packed)")
    if layout != "auto":
        return layout
    if varlen_ok:
        return "packed"
    if not cache_ok:
        return "padded"
    groups = prompt_groups(td)
    return "shared_prefix" if int(groups.max()) + 1 < len(groups) else "padded"


def score_responses(model: nn.Module, td: TensorDict, *, temperature: float = 1.0,
                    with_entropy: bool = False, entropy_grad: bool = False,
                    layout: str = "auto", chunk_size: int | None = None,
                    packed_attention: str = "auto") -> tuple[Tensor, Tensor | None]:
    """``[b, R]`` log-probs of ``td``'s response tokens (0 on padding) and, with
    ``with_entropy``, the policy's entropy at each of them (detached unless
    ``entropy_grad``). Logits are divided by ``temperature`` first, so they match the
    distribution a rollout sampled from. ``packed_attention`` (``auto``, ``varlen``, ``mask``)
    is how the packed layout attends (module docstring). ``model`` must have gone through
    `enable_scoring`."""
    if packed_attention not in varlen.CHOICES:
        raise ValueError(f"unknown packed attention {packed_attention!r}; choose one of "
                         f"{list(varlen.CHOICES)}")
    cache_ok = not (model.training and getattr(model, "is_gradient_checkpointing", False))
    if layout != "auto":  # auto needs the compute device and dtype: the job resolves it
        layout = resolve_layout(layout, td, cache_ok)
    job = _ScoringJob(td, layout, temperature, with_entropy, entropy_grad, chunk_size,
                      packed_attention, cache_ok)
    flat_lp, flat_ent = model(**{_KWARG: job})
    return job.scatter(flat_lp), (job.scatter(flat_ent) if flat_ent is not None else None)


def length_buckets(lengths: list[int], overhead: int = BUCKET_OVERHEAD_TOKENS
                   ) -> list[list[int]]:
    """Rows grouped into runs of similar length, each run padded only to its own longest row.

    Minimizes ``sum(rows * longest) + overhead * runs`` over splits of the rows sorted by
    length (an exact dynamic program); one long outlier no longer pads a whole batch. Each
    run's indices ascend.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    # runs only ever start where the length changes: the program runs over those points
    points = [i for i in range(len(order)) if i == 0 or
              lengths[order[i]] != lengths[order[i - 1]]] + [len(order)]
    best = [0.0] + [math.inf] * (len(points) - 1)  # best[j]: cost of the rows before points[j]
    cut = [0] * len(points)
    for j in range(1, len(points)):
        for i in range(j):
            cost = best[i] + (points[j] - points[i]) * lengths[order[points[i]]] + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], len(points) - 1
    while j > 0:
        runs.append(sorted(order[points[cut[j]]:points[j]]))
        j = cut[j]
    return runs[::-1]


class _Prefix(NamedTuple):
    """The distinct prompts' forward: group id per row, prompt attention mask per row, K/V per
    layer (one row per group), the last position's hidden state per group."""

    groups: Tensor
    attn: Tensor
    kv: list[tuple[Tensor, Tensor]]
    last: Tensor


class _ScoringJob:
    """One micro-batch to score, run by the model's patched forward (not a dataclass on
    purpose: FSDP2 rebuilds dataclass arguments when it casts forward inputs)."""

    def __init__(self, td: TensorDict, layout: str, temperature: float, with_entropy: bool,
                 entropy_grad: bool, chunk_size: int | None, packed_attention: str = "auto",
                 cache_ok: bool = True) -> None:
        self.td, self.layout, self.temperature = td, layout, temperature
        self.packed_attention, self.cache_ok = packed_attention, cache_ok
        self.with_entropy, self.entropy_grad, self.chunk_size = with_entropy, entropy_grad, \
            chunk_size
        responses = td.get(RESPONSES)
        attn = td.get(ATTENTION_MASK).bool()
        self.width = responses.shape[1]
        self.prompt_len = attn.shape[1] - self.width
        self.prompt_real = attn[:, :self.prompt_len].sum(-1)
        self.resp_real = resp_real = attn[:, self.prompt_len:].sum(-1)
        if bool((self.prompt_real == 0).any()):
            raise ValueError("a sample has an empty prompt: nothing predicts its first response "
                             "token")
        self.r_kept = max(int(resp_real.max()), 1)
        self.valid = torch.arange(self.r_kept, device=attn.device)[None, :] < resp_real[:, None]
        self.labels = responses[:, :self.r_kept][self.valid]

    def __call__(self, model: nn.Module) -> tuple[Tensor, Tensor | None]:
        trunk = model.base_model
        layout = self.layout
        if layout == "auto":
            # inside the forward the weight is in the compute dtype (FSDP2 gathers it cast)
            weight = trunk.get_input_embeddings().weight
            route, _ = varlen.packed_route(trunk.config, weight.device, weight.dtype,
                                           self.packed_attention)
            layout = resolve_layout(layout, self.td, self.cache_ok, route == "varlen")
        if layout == "packed":
            hidden = self._packed(trunk)  # logs its route once
        else:
            prefix = self._prefix(trunk) if layout == "shared_prefix" else None
            lengths = self.resp_real if prefix else self.prompt_real + self.resp_real
            # every index lives on the micro-batch's device: a CPU tensor indexed by CUDA
            # indices (``self.valid``) is an error, and CPU indices into CUDA tensors copy
            device = self.valid.device
            flat_index = torch.full(self.valid.shape, -1, dtype=torch.long, device=device)
            flat_index[self.valid] = torch.arange(int(self.valid.sum()), device=device)
            parts, order = [], []
            for rows in length_buckets(lengths.tolist()):
                index = torch.tensor(rows, device=device)
                parts.append(self._suffix(trunk, prefix, index) if prefix
                             else self._padded(trunk, index))
                order.append(flat_index[index][self.valid[index]])
            hidden = torch.cat(parts)[torch.argsort(torch.cat(order)).to(parts[0].device)]
        return self._head(model.get_output_embeddings(), hidden)

    def scatter(self, flat: Tensor) -> Tensor:
        """``[K]`` values in row-major order of the valid positions -> ``[b, R]``."""
        b = self.valid.shape[0]
        out = flat.new_zeros((b, self.width))
        out[:, :self.r_kept][self.valid] = flat
        return out

    # --- trunks: hidden states at the positions predicting each real response token [K, H] ----
    def _padded(self, trunk: nn.Module, rows: Tensor) -> Tensor:
        """Rows ``rows`` run whole, cropped to their longest prompt and response."""
        td = self.td
        cut = self.prompt_len - int(self.prompt_real[rows].max())
        r = max(int(self.resp_real[rows].max()), 1)
        end = self.prompt_len + r
        hidden = trunk(input_ids=td.get(INPUT_IDS)[rows, cut:end],
                       attention_mask=td.get(ATTENTION_MASK)[rows, cut:end].long(),
                       position_ids=td.get(POSITION_IDS)[rows, cut:end],
                       use_cache=False).last_hidden_state
        p = self.prompt_len - cut
        return hidden[:, p - 1:p - 1 + r][self.valid[rows, :r]]

    def _packed(self, trunk: nn.Module) -> Tensor:
        """Every row's real tokens in one row: varlen attention or a block-diagonal mask."""
        td = self.td
        attn = td.get(ATTENTION_MASK).bool()
        lengths = self.prompt_real + self.resp_real
        starts = varlen.cu_seqlens(lengths)[:-1].long()
        keep = (starts + self.prompt_real - 1)[:, None] + torch.arange(self.r_kept,
                                                                       device=attn.device)
        # the embeddings first: their dtype is the one the layers compute in (FSDP2 casts)
        embeds = trunk.get_input_embeddings()(td.get(INPUT_IDS)[attn][None])
        route, why = varlen.packed_route(trunk.config, embeds.device, embeds.dtype,
                                         self.packed_attention)
        varlen.log_route(route, why, embeds.device)
        inputs = dict(inputs_embeds=embeds, position_ids=td.get(POSITION_IDS)[attn][None],
                      use_cache=False)
        if route == "varlen":
            varlen.install(trunk.config)
            with varlen.packed_call():
                hidden = trunk(**inputs, **varlen.packed_kwargs(lengths)).last_hidden_state
        else:
            hidden = trunk(**inputs).last_hidden_state
        return hidden[0, keep[self.valid]]

    def _prefix(self, trunk: nn.Module) -> _Prefix:
        """Run each distinct prompt once; keep its K/V per layer and its last hidden state."""
        td = self.td
        groups = prompt_groups(td)
        first_row: dict[int, int] = {}
        for row, g in enumerate(groups.tolist()):
            first_row.setdefault(g, row)
        first = torch.tensor(list(first_row.values()), device=groups.device)
        cut = self.prompt_len - int(self.prompt_real.max())
        attn = td.get(ATTENTION_MASK)[:, cut:self.prompt_len].long()
        out = trunk(input_ids=td.get(INPUT_IDS)[first, cut:self.prompt_len],
                    attention_mask=attn[first],
                    position_ids=td.get(POSITION_IDS)[first, cut:self.prompt_len],
                    use_cache=True)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return _Prefix(groups, attn, kv, out.last_hidden_state[:, -1])

    def _suffix(self, trunk: nn.Module, prefix: _Prefix, rows: Tensor) -> Tensor:
        """Rows ``rows``' responses on their prompts' K/V (indexed per row: the gradient flows
        back into the one prompt forward)."""
        td = self.td
        groups = prefix.groups[rows].to(prefix.last.device)
        # index_select, not k[groups]: its backward (index_add_) sums a prompt's rows in a fixed
        # order; advanced indexing's (index_put_ with accumulate) does not on several threads
        cache = DynamicCache([(k.index_select(0, groups), v.index_select(0, groups))
                              for k, v in prefix.kv], config=trunk.config)
        r = max(int(self.resp_real[rows].max()), 1)
        end = self.prompt_len + r
        suffix = trunk(input_ids=td.get(INPUT_IDS)[rows, self.prompt_len:end],
                       attention_mask=torch.cat(
                           [prefix.attn[rows],
                            td.get(ATTENTION_MASK)[rows, self.prompt_len:end].long()], 1),
                       position_ids=td.get(POSITION_IDS)[rows, self.prompt_len:end],
                       past_key_values=cache, use_cache=True).last_hidden_state
        # response token 0 is predicted by the prompt's last position, token j by suffix j-1
        hidden = torch.cat([prefix.last.index_select(0, groups)[:, None], suffix[:, :-1]], dim=1)
        return hidden[self.valid[rows, :r]]

    # --- the head, in chunks --------------------------------------------------------------------
    def _head(self, head: nn.Module, hidden: Tensor) -> tuple[Tensor, Tensor | None]:
        k = hidden.shape[0]
        vocab = head.weight.shape[0]
        size = self.chunk_size or max(1, LOGITS_CHUNK_BYTES // (4 * vocab))
        labels = self.labels.to(hidden.device)
        many = k > size and torch.is_grad_enabled()
        lps, ents = [], []
        for start in range(0, max(k, 1), size):
            h, lab = hidden[start:start + size], labels[start:start + size]
            if many:  # keep only the chunk's hidden states; the logits are recomputed in backward
                lp, ent = checkpoint(self._chunk, head, h, lab, use_reentrant=False)
            else:
                lp, ent = self._chunk(head, h, lab)
            lps.append(lp)
            ents.append(ent)
        return torch.cat(lps), (torch.cat(ents) if self.with_entropy else None)

    def _chunk(self, head: nn.Module, h: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        logits = head(h)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        if not self.with_entropy:
            lp = log_probs_from_logits(logits, labels)
            return lp, lp.new_zeros(())
        return log_probs_and_entropy(logits, labels, entropy_grad=self.entropy_grad)


__all__ = ["LAYOUTS", "enable_scoring", "length_buckets", "prompt_groups", "resolve_layout",
           "score_responses"]
