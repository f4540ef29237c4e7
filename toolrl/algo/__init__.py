"""Pure RL math on tensors: credit assignment, advantage estimators, policy/value losses, KL.

Nothing here knows about Ray, workers or TensorDict: every function takes and returns
``torch.Tensor`` (``[B, R]`` per response token) so it can be unit-tested by hand.
"""

from toolrl.algo.advantage import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    compute_advantage,
    register_advantage,
    uniform_groups,
)
from toolrl.algo.corrections import (
    CORRECTIONS,
    CorrectionConfig,
    apply_corrections,
    ratio_stats,
    register_correction,
)
from toolrl.algo.credit import episode_advantage, place_rewards, share_advantages
from toolrl.algo.kl import KL_KINDS, apply_kl_in_reward, kl_penalty
from toolrl.algo.loss import (
    AGG_MODES,
    POLICY_LOSSES,
    LossAggregator,
    PolicyLoss,
    PolicyLossConfig,
    actor_loss,
    agg_loss,
    batch_totals,
    entropy_from_logits,
    log_probs_and_entropy,
    log_probs_from_logits,
    register_policy_loss,
    value_loss,
)
from toolrl.algo.masked import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "CORRECTIONS",
    "KL_KINDS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "CorrectionConfig",
    "LossAggregator",
    "PolicyLoss",
    "PolicyLossConfig",
    "actor_loss",
    "agg_loss",
    "apply_corrections",
    "apply_kl_in_reward",
    "batch_totals",
    "compute_advantage",
    "entropy_from_logits",
    "episode_advantage",
    "kl_penalty",
    "log_probs_and_entropy",
    "log_probs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "place_rewards",
    "ratio_stats",
    "register_advantage",
    "register_correction",
    "register_policy_loss",
    "share_advantages",
    "uniform_groups",
    "value_loss",
]
