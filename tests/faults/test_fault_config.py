"""Fault table, bad configs: an unknown key, a wrong type, a missing model path, a pool larger
than the machine.

Expected: one clear message (one line, naming the key or the shortfall) before any worker
starts: `load_config` raises `ConfigError`; ``toolrl train --config X`` prints
``toolrl train: <message>`` on stderr, exits with 2 and starts nothing. The pool check runs
against the session's real Ray cluster and must leave no placement group or actor behind.
"""

from __future__ import annotations

import time

import pytest

from toolrl import cli
from toolrl.trainer.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(120)

BAD = {
    "unknown_key": ("rollout:\n  temprature: 0.7\n",
                    "unknown config key 'rollout.temprature'", "temperature"),
    "unknown_top_key": ("trainr:\n  total_steps: 3\n", "unknown config key 'trainr'",
                        "trainer"),
    "wrong_type": ("data:\n  batch_size: many\n", "invalid value for 'data.batch_size'",
                   "many"),
    "wrong_choice": ("algorithm:\n  name: dpo\n", "algorithm.name='dpo' is not valid",
                     "grpo"),
    "missing_model_path": ("model:\n  path: {missing}\n  build_tiny_if_missing: false\n",
                           "does not exist", "model.path"),
    "schedule_shorter_than_warmup": (
        "actor:\n  lr_schedule: cosine\n  warmup_steps: 40\ntrainer:\n  total_steps: 10\n",
        "actor.lr_schedule=cosine needs more optimizer steps (10 in this run)", "warmup_steps"),
    "unknown_reward_key": ("reward:\n  rewards: [{{name: success}}]\n  scal: 2\n",
                           "unknown config key 'reward.scal'", "scale"),
    "reward_component_type": ("reward:\n  rewards:\n    - {{name: success}}\n"
                              "    - {{name: format, weight: heavy}}\n",
                              "invalid value for 'reward.rewards[1].weight'", "heavy"),
    "reward_component_rule": ("reward:\n  rewards:\n    - {{name: success}}\n"
                              "    - {{name: format, gate: {{reward: nope}}}}\n",
                              "reward.rewards[1].gate.reward='nope'", "success"),
    "negative_stop_grace": ("trainer:\n  stop_grace_s: -1\n  output_dir: {missing}\n",
                            "trainer.stop_grace_s must be >= 0", "stop_grace_s"),
}


def write_config(tmp_path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    run_dir = tmp_path / "run"
    path.write_text(text.format(missing=tmp_path / "no-such-model") +
                    f"trainer:\n  output_dir: {run_dir}\n" * ("trainer:" not in text))
    return str(path)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["train", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(BAD))
def test_load_config_names_the_problem(tmp_path, case):
    text, message, hint = BAD[case]
    with pytest.raises(ConfigError) as info:
        load_config(write_config(tmp_path, text))
    text = str(info.value)
    assert message in text and hint in text and "\n" not in text, text


@pytest.mark.parametrize("case", sorted(BAD))
def test_toolrl_train_prints_one_line_and_starts_nothing(tmp_path, capsys, case):
    text, message, _ = BAD[case]
    code, err = run_cli(capsys, "--config", write_config(tmp_path, text))
    assert code == 2
    assert err.startswith("toolrl train: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()  # the trainer never began


def test_a_missing_config_file_or_bad_override(tmp_path, capsys):
    code, err = run_cli(capsys, "--config", str(tmp_path / "nope.yaml"))
    assert code == 2 and "does not exist" in err and err.count("\n") == 1
    good = tmp_path / "good.yaml"
    good.write_text("seed: 1\n")
    code, err = run_cli(capsys, "--config", str(good), "actor.lr=fast")
    assert code == 2 and "actor.lr" in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_a_pool_larger_than_the_machine(tmp_path, capsys, ray_cluster, tiny_model_dir):
    """64 processes x 1 CPU on a cluster of 8 CPUs: refused by the placement check before
    any placement group or actor exists."""
    ray = ray_cluster

    def live_groups() -> set[str]:  # (removed groups of earlier tests leave the table lazily)
        return {pg for pg, info in ray.util.placement_group_table().items()
                if info.get("state") != "REMOVED"}

    groups_before = live_groups()
    free_before = ray.available_resources().get("CPU")
    config = tmp_path / "big.yaml"
    # (the pre-flight memory plan would refuse 64 engines first: skipped, this is the pool check)
    config.write_text(f"model:\n  path: {tiny_model_dir}\n  build_tiny_if_missing: false\n"
                      f"resources:\n  processes_per_node: 64\n  memory_check: skip\n"
                      f"trainer:\n  output_dir: {tmp_path / 'run'}\n  trackers: [jsonl]\n"
                      f"data:\n  train_size: 16\n  val_size: 4\n")
    code, err = run_cli(capsys, "--config", str(config))
    assert code == 2, err
    assert err.startswith("toolrl train: ") and err.count("\n") == 1, err
    assert "64 x {CPU: 1}" in err and "must fit on ONE node" in err and "short by" in err
    assert live_groups() == groups_before
    # (resources an earlier test's killed actors hold come back asynchronously: wait, bounded)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU") != free_before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU") == free_before


def test_a_cosine_schedule_spans_every_optimizer_step_of_the_run():
    """The schedule is set in the file without total_steps: the trainer derives its length
    (steps x PPO epochs x mini-batches), so a config file can ask for it."""
    from toolrl.trainer.config import optimizer_steps

    cfg = load_config(None, ["actor.lr_schedule=cosine", "actor.warmup_steps=3",
                             "trainer.total_steps=10", "data.batch_size=4",
                             "algorithm.group_size=4", "actor.ppo_epochs=2",
                             "actor.ppo_mini_batch_size=8"])
    assert optimizer_steps(cfg, cfg.actor) == 10 * 2 * 2


def test_a_suggestion_ends_its_sentence_once():
    """OmegaConf's "Did you mean ...?" is not followed by a stray period."""
    for override, suggestion in (("rollout.temprature=0.7", "Did you mean one of: "),
                                 ("rollout.engine.backnd=cpu", "Did you mean: 'backend'")):
        with pytest.raises(ConfigError) as info:
            load_config(None, [override])
        text = str(info.value)
        assert suggestion in text and "?. " not in text and "?  " not in text, text
        assert "? Valid keys under" in text, text
    with pytest.raises(ConfigError) as info:  # a message without a suggestion gets its period
        load_config(None, ["rollout.zzzzzz=1"])
    assert ". Valid keys under 'rollout'" in str(info.value) and ".." not in str(info.value)
