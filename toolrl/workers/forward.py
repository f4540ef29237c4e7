"""Model inputs for one micro-batch and the mapping of outputs back onto response tokens.

A micro-batch in the rollout layout (prompt left-padded to P, response right-padded to R) is
turned into model inputs in one of two ways:

- padded: columns that are padding in every row are cropped (left of the prompts, right of the
  responses), the rest is run with its attention mask;
- packed (``remove_padding``): the real tokens of all rows are concatenated into one row whose
  position ids restart at 0 for each sample; transformers then builds a block-diagonal causal
  mask, so no compute is spent on padding.

Either way the output at the position before each response token predicts that token (for a
sample with prompt length p: positions p-1 .. p+r-2). `MicroInputs.keep` lists those positions,
so the LM head can run on them alone (``logits_to_keep``), and `MicroInputs.scatter` puts
per-position values back into the ``[b, R]`` response layout (zeros on padding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from toolrl.batch import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, RESPONSES


@dataclass
class MicroInputs:
    """Model inputs of one micro-batch and where its response tokens sit in the output.

    Attributes:
        inputs: keyword arguments of the model's forward.
        keep: positions (sequence dimension of the model output) that predict response tokens;
            row-major over the real response tokens when packed, ``R'`` positions per row when
            padded.
        labels: the response token predicted at each kept position, flattened like `flat`.
        valid: ``[b, R']`` bool, the real response tokens (``R'`` = the cropped width).
        width: ``R``, the full response width of the batch.
        packed: whether rows were packed into one.
    """

    inputs: dict[str, torch.Tensor]
    keep: torch.Tensor
    labels: torch.Tensor
    valid: torch.Tensor
    width: int
    packed: bool

    def flat(self, out: torch.Tensor, kept: bool = False) -> torch.Tensor:
        """Model output at the kept positions -> ``[K, ...]`` (one row per label).

        ``out`` is ``[rows, L, ...]`` over the full sequence, or ``[rows, len(keep), ...]``
        when ``kept`` (the model already kept only `keep`, e.g. through ``logits_to_keep``).
        """
        if not kept:
            out = out[:, self.keep]
        if self.packed:
            return out[0]
        return out.reshape(-1, *out.shape[2:])

    def scatter(self, flat: torch.Tensor) -> torch.Tensor:
        """``[K]`` values (as `flat` orders them) -> ``[b, R]``, zero on padding."""
        b, r_kept = self.valid.shape
        out = flat.new_zeros((b, self.width))
        if self.packed:
            out[:, :r_kept][self.valid] = flat
        else:
            out[:, :r_kept] = flat.reshape(b, r_kept) * self.valid
        return out


def micro_inputs(td: TensorDict, remove_padding: bool = False) -> MicroInputs:
    """Build `MicroInputs` for a micro-batch (see the module docstring)."""
    responses = td.get(RESPONSES)
    input_ids, attn = td.get(INPUT_IDS), td.get(ATTENTION_MASK).bool()
    positions = td.get(POSITION_IDS)
    width = responses.shape[1]
    prompt_len = input_ids.shape[1] - width
    prompt_real = attn[:, :prompt_len].sum(-1)
    resp_real = attn[:, prompt_len:].sum(-1)
    if bool((prompt_real == 0).any()):
        raise ValueError("a sample has an empty prompt: nothing predicts its first response "
                         "token")
    r_kept = max(int(resp_real.max()), 1)
    valid = torch.arange(r_kept, device=attn.device)[None, :] < resp_real[:, None]
    labels = responses[:, :r_kept]
    if remove_padding:
        lengths = (prompt_real + resp_real).tolist()
        starts = torch.tensor([0, *lengths[:-1]], device=attn.device).cumsum(0)
        keep = (starts + prompt_real - 1)[:, None] + torch.arange(r_kept, device=attn.device)
        inputs: dict[str, Any] = {
            "input_ids": input_ids[attn][None],
            "position_ids": positions[attn][None],
        }
        return MicroInputs(inputs, keep[valid], labels[valid], valid, width, packed=True)
    cut = prompt_len - int(prompt_real.max())
    end = prompt_len + r_kept
    inputs = {
        "input_ids": input_ids[:, cut:end],
        "attention_mask": attn[:, cut:end].long(),
        "position_ids": positions[:, cut:end],
    }
    p = prompt_len - cut
    keep = torch.arange(p - 1, p - 1 + r_kept, device=attn.device)
    return MicroInputs(inputs, keep, labels.reshape(-1), valid, width, packed=False)


__all__ = ["MicroInputs", "micro_inputs"]
