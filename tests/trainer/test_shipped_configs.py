"""Every config the repo ships can be solved as configured: its dry run (the env's oracle on
rows of every env of the run, within ``rollout.max_turns`` and the token budget, then the bad
policies) finds no problem. ``configs/toolrl_paper.yaml`` (GPUs, a hub model) has its own
dry-run test with CPU overrides (test_paper_config.py); ``configs/tau2_mock.yaml``'s oracle
fails where tau2's own evaluator fails its gold actions (tests/envs/test_tau2.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolrl.trainer.config import load_config
from toolrl.trainer.dry_run import dry_run

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*ROOT.glob("configs/*.yaml"), ROOT / "examples/openai_agent/config.yaml"])
# toolrl_paper.yaml: GPUs and a hub model; tau2_mock.yaml: tau2 itself scores its own gold
# actions below 1.0 on one mock task (tests/envs/test_tau2.py, benchmarks/results/tau2.md);
# real_fc.yaml: SmolLM2 and converted data files (tests/trainer/test_real_fc_config.py)
OWN_TEST = {"toolrl_paper.yaml", "tau2_mock.yaml", "real_fc.yaml"}
# tau2_airline.yaml: every episode of the 7 policies loads tau2's airline database and replays
# the gold actions to score: a few tasks (the prompt budget still checks every row)
TASKS = {"tau2_airline.yaml": 3, "bfcl_multi_turn.yaml": 4}
# bfcl_multi_turn.yaml: the composite set runs on BFCL's long-context backends, whose outputs
# make some oracle transcripts longer than SmolLM2's window (benchmarks/results/
# bfcl_multi_turn.md): the dry run says so (the rollout's loop cuts the oracle's episode:
# "... runs out of context after N turns ..."), and says nothing else (its reward comparison
# leaves out the oracle's cut episodes, which score 0 however good the reward is)
KNOWN = {"bfcl_multi_turn.yaml": "runs out of context"}


@pytest.mark.parametrize("config", [p for p in SHIPPED if p.name not in OWN_TEST],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_a_shipped_config_passes_its_dry_run(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (models/ and outputs/ of the run are not built there)
    cfg = load_config(config, [f"trainer.output_dir={tmp_path / 'run'}",
                               f"model.path={tmp_path / 'models' / 'tiny'}",
                               "model.build_tiny_if_missing=true"])
    report = dry_run(cfg, tasks=TASKS.get(config.name, 12))
    known = KNOWN.get(config.name)
    problems = [p for p in report.problems if known is None or known not in p]
    assert not problems, problems


@pytest.mark.parametrize("example", ["anthropic_agent", "agents_sdk_agent"])
def test_the_other_agent_examples_train_the_openai_agents_run(example):
    """The anthropic-SDK and Agents-SDK examples load, and differ from the dry-run
    examples/openai_agent config only in their name and the client their agent gets."""
    from omegaconf import OmegaConf

    base = OmegaConf.to_container(OmegaConf.load(ROOT / "examples/openai_agent/config.yaml"))
    other = OmegaConf.to_container(OmegaConf.load(ROOT / f"examples/{example}/config.yaml"))
    assert other.pop("experiment_name") == example
    client = other["rollout"].pop("agent_client", "openai")
    assert client == ("anthropic" if example == "anthropic_agent" else "openai")
    base.pop("experiment_name")
    assert other == base
    cfg = load_config(ROOT / f"examples/{example}/config.yaml", [])
    assert cfg.rollout.agent_client == client
