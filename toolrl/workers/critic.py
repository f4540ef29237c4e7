"""The PPO value model: the policy's backbone with a scalar head, sharded with FSDP2.

`FSDPCritic` loads ``AutoModelForTokenClassification(num_labels=1)`` from a causal-LM
checkpoint (the backbone's weights; the head starts from a seeded random init) and predicts,
for every response token, the value of the state before it: the output at the position that
predicts the token, as for log-probs. `update_critic` minimizes the clipped value loss
(`toolrl.algo.loss.value_loss`) with the same mini/micro-batching and exact gradient
accumulation as the actor. `CriticWorker` wraps it for the single controller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import transformers
from tensordict import TensorDict

from toolrl.algo.loss import AGG_MODES, AggMode, LossAggregator, value_loss
from toolrl.batch import RESPONSE_MASK, RETURNS, VALUES
from toolrl.controller.worker import Dispatch, Worker, remote
from toolrl.workers.base import FSDPConfig, FSDPModel, LossTotals
from toolrl.workers.forward import micro_inputs


@dataclass(frozen=True)
class CriticConfig(FSDPConfig):
    """The critic: `FSDPConfig` plus the value loss.

    Attributes:
        cliprange_value: clip of the new values around the old ones (None: plain squared
            error).
        loss_agg_mode: aggregation of the per-token value loss (see `toolrl.algo.loss`).
        max_response_length: the response budget for ``seq-mean-token-sum-norm`` (in an
            experiment the trainer sets it from ``rollout.max_total_tokens``).
    """

    lr: float = 1e-5
    cliprange_value: float | None = 0.5
    loss_agg_mode: AggMode = "token-mean"
    max_response_length: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(f"unknown loss_agg_mode {self.loss_agg_mode!r}; choose one of "
                             f"{list(AGG_MODES)}")


class FSDPCritic(FSDPModel):
    """Token-level value model: `compute_values` and `update_critic`."""

    metric_prefix = "critic"
    config: CriticConfig

    def __init__(self, config: CriticConfig, model_kwargs: dict[str, Any] | None = None
                 ) -> None:
        hf_config = transformers.AutoConfig.from_pretrained(config.model_path, num_labels=1)
        hf_config.classifier_dropout = 0.0  # deterministic values
        torch.manual_seed(config.seed)  # the new value head is initialized alike on every rank
        super().__init__(config, trainable=True,
                         auto_cls=transformers.AutoModelForTokenClassification,
                         model_kwargs={"config": hf_config, **(model_kwargs or {})})

    def _values(self, td: TensorDict) -> torch.Tensor:
        mi = micro_inputs(td, self.config.use_remove_padding)
        out = self.model(**mi.inputs, use_cache=False)
        return mi.scatter(mi.flat(out.logits).squeeze(-1).float())

    def compute_values(self, td: TensorDict) -> TensorDict:
        """``values [B, R]``: the value of the state before each response token (0 on
        padding)."""
        return self.forward_batches(td, lambda micro: {VALUES: self._values(micro)})

    def _micro_loss(self, micro: TensorDict, totals: LossTotals
                    ) -> tuple[torch.Tensor, dict[str, float]]:
        agg = LossAggregator(self.config.loss_agg_mode, total_tokens=totals.tokens,
                             total_seqs=totals.seqs, max_len=self.config.max_response_length)
        return value_loss(self._values(micro), micro.get(VALUES), micro.get(RETURNS),
                          micro.get(RESPONSE_MASK), self.config.cliprange_value, agg)

    def _check(self, td: TensorDict) -> None:
        missing = [k for k in (VALUES, RETURNS, RESPONSE_MASK) if k not in td]
        if missing:
            raise KeyError(f"update_critic needs {missing} in the batch "
                           f"(keys: {sorted(td.keys())})")

    def update_critic(self, td: TensorDict) -> dict[str, float]:
        """PPO epochs of clipped value regression on ``returns``; ``critic/...`` metrics."""
        self._check(td)
        return self.train_batch(td, self._micro_loss)

    def compute_gradients(self, td: TensorDict) -> dict[str, float]:
        """All of ``td`` as one mini-batch, no optimizer step (gradients stay in ``.grad``)."""
        self._check(td)
        return self.accumulate(td, self._micro_loss)


class CriticWorker(Worker):
    """One rank of the critic group."""

    def __init__(self, config: CriticConfig) -> None:
        self.init_process_group()
        self.critic = FSDPCritic(config)

    @remote(Dispatch.DP_SPLIT)
    def compute_values(self, batch: TensorDict) -> TensorDict:
        return self.critic.compute_values(batch)

    @remote(Dispatch.DP_SPLIT_RAW)
    def update_critic(self, batch: TensorDict) -> dict[str, float]:
        """Metrics are reduced over ranks already: every rank returns the same dict."""
        return self.critic.update_critic(batch)

    @remote(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.critic.save_checkpoint(path)

    @remote(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.critic.load_checkpoint(path)


__all__ = ["CriticConfig", "CriticWorker", "FSDPCritic"]
