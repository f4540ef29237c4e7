"""Rewards: what a plugin writes (`toolrl.reward.api`) and how a config composes plugins
(`toolrl.reward.compose`). Plugin authors import these names from `toolrl` itself."""

from toolrl.reward.api import (
    REWARDS,
    BatchedRewardFn,
    RewardError,
    RewardFn,
    RewardResult,
    RewardSpec,
    Score,
    get_reward_spec,
    reward,
)
from toolrl.reward.compose import (
    BoundReward,
    ComponentConfig,
    ComposedReward,
    Gate,
    RewardBatch,
    RewardConfig,
    RewardConfigError,
    RewardFailure,
    build_reward,
    make_reward,
    to_result,
)

__all__ = [
    "REWARDS",
    "BatchedRewardFn",
    "BoundReward",
    "ComponentConfig",
    "ComposedReward",
    "Gate",
    "RewardBatch",
    "RewardConfig",
    "RewardConfigError",
    "RewardError",
    "RewardFailure",
    "RewardFn",
    "RewardResult",
    "RewardSpec",
    "Score",
    "build_reward",
    "get_reward_spec",
    "make_reward",
    "reward",
    "to_result",
]
