"""The history-policy and family keys of an experiment config: bad values are one-line errors."""

from __future__ import annotations

import pytest

from toolrl.rollout.history import HISTORY_POLICIES
from toolrl.trainer.config import CHOICES, ConfigError, load_config, validate


def test_the_choices_are_the_rollouts():
    assert CHOICES["rollout.history_policy"] == HISTORY_POLICIES


@pytest.mark.parametrize("override,match", [
    ("rollout.history_policy=sometimes",
     "rollout.history_policy='sometimes' is not valid; choose one of \\['auto'"),
    ("model.tiny_vocab=half", "model.tiny_vocab='half' is not valid"),
    ("model.tiny_tokenizer=llama9", "model.tiny_tokenizer='llama9' is not a model family"),
    ("rollout.family=llama9", "not a known model family"),
])
def test_bad_values_are_refused(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config("configs/quickstart.yaml", [override])


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_every_choice_key_refuses_a_value_outside_its_literal_in_one_line(key):
    """The schema's Literal types are the one list of each key's values: a value outside it is
    a ConfigError naming the key and the values, from the file and from a built config."""
    with pytest.raises(ConfigError, match=f"^{key}='nonsense' is not valid; choose one of"):
        load_config("configs/quickstart.yaml", [f"{key}=nonsense"])
    cfg = load_config("configs/quickstart.yaml")
    section, _, name = key.rpartition(".")
    node = cfg
    for part in section.split("."):
        node = getattr(node, part)
    object.__setattr__(node, name, "nonsense")  # frozen worker configs too
    with pytest.raises(ConfigError, match=f"^{key}='nonsense' is not valid"):
        validate(cfg)


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
