"""The conformance matrix on real tokenizers and templates (a smaller count than
benchmarks/bench_templates.py's 1,000 episodes per family): the tokens toolrl trains on equal
the template's own rendering at inference on every turn; training on the sampled stream of a
think-stripping template does not."""

from __future__ import annotations

import random

import pytest

from toolrl.cli import main
from toolrl.core.families import FAMILIES
from toolrl.rollout.chat import ChatRenderer
from toolrl.rollout.conformance import CHECK_TOOLS, episode_mismatches, random_episode

EPISODES = 40


@pytest.fixture(scope="module")
def renderers(family_tokenizers):
    return {n: ChatRenderer(tok) for n, tok in family_tokenizers.items()}


@pytest.mark.parametrize("name", FAMILIES.names())
def test_every_family_trains_on_what_its_template_renders(renderers, name):
    renderer = renderers[name]
    assert renderer.history.exact
    rng = random.Random(name)
    compared = turns = 0
    for i in range(EPISODES):
        check = episode_mismatches(renderer, random_episode(rng, thinking=i % 2 == 0),
                                   CHECK_TOOLS)
        assert check.mismatched == 0, check.first
        assert check.round_trip_failures == 0
        compared += check.compared
        turns += check.turns
    assert compared > 10 * EPISODES and turns > 2 * EPISODES


def test_the_sampled_stream_of_a_think_stripping_template_is_not_what_it_renders(
        renderers, family_tokenizers):
    stream = ChatRenderer(family_tokenizers["deepseek-r1-distill"],
                          history_policy="keep_stream")
    assert not stream.history.exact and stream.history.policy == "keep_stream"
    rng = random.Random(0)
    bad = [episode_mismatches(stream, random_episode(rng, thinking=True), CHECK_TOOLS)
           for _ in range(5)]
    assert all(b.mismatched > 0 for b in bad)  # the check can fail
    assert renderers["deepseek-r1-distill"].per_turn  # and the default avoids it


def test_check_template_prints_the_report(capsys):
    assert main(["check-template", "family:deepseek-r1-distill"]) == 0
    out = capsys.readouterr().out
    for part in ("prefix-preserving: no (message", "tools rendered: yes (written into the "
                 "system prompt", "round trip, several calls (deepseek)", "earlier reasoning "
                 "dropped", "history policy: per_turn", "tokens differ"):
        assert part in out, part
    assert ": 0 of " in out.splitlines()[-1]
    assert main(["check-template", "family:qwen2.5", "--history-policy", "delta"]) == 0
    assert "prefix-preserving: yes" in capsys.readouterr().out
    assert main(["check-template", "family:deepseek-r1-distill", "--history-policy",
                 "delta"]) == 1
    assert "not prefix-preserving" in capsys.readouterr().err
