"""The history-policy and family keys of an experiment config: bad values are one-line errors."""

from __future__ import annotations

import pytest

from toolrl.rollout.history import HISTORY_POLICIES
from toolrl.trainer.config import CHOICES, ConfigError, load_config


def test_the_choices_are_the_rollouts():
    assert CHOICES["rollout.history_policy"] == HISTORY_POLICIES


@pytest.mark.parametrize("override,match", [
    ("rollout.history_policy=sometimes", "history_policy='sometimes'; choose one of auto"),
    ("model.tiny_vocab=half", "model.tiny_vocab='half' is not valid"),
    ("model.tiny_tokenizer=llama9", "model.tiny_tokenizer='llama9' is not a model family"),
    ("rollout.family=llama9", "not a known model family"),
])
def test_bad_values_are_refused(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config("configs/quickstart.yaml", [override])


def test_per_turn_needs_an_outcome_advantage():
    with pytest.raises(ConfigError, match="per_turn makes each model turn a sample"):
        load_config("configs/calculator_think.yaml", ["algorithm.advantage=gae",
                                                       "algorithm.name=ppo"])
    cfg = load_config("configs/calculator_think.yaml")
    assert cfg.rollout.history_policy == "per_turn" and cfg.model.tiny_vocab == "task"


def test_the_preflight_names_the_policy_and_refuses_refill_under_per_turn(family_tokenizers):
    from toolrl.trainer.preflight import check_history

    cfg = load_config("configs/calculator_think.yaml")
    decision = check_history(family_tokenizers["deepseek-r1-distill"], cfg)
    assert decision.per_turn and decision.line().startswith("history policy: per_turn")
    auto = load_config("configs/calculator_think.yaml", ["rollout.history_policy=auto",
                                                         "trainer.infra_failures.rule=refill"])
    with pytest.raises(ConfigError, match="refill cannot put such an episode"):
        check_history(family_tokenizers["deepseek-r1-distill"], auto)  # auto: per_turn here
    assert not check_history(family_tokenizers["qwen2.5"], auto).per_turn  # deltas: fine
