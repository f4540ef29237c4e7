"""A two-stage generate (think, then call) as an `EpisodeRunner` subclass.

OpenOneRec overrides verl's vLLM rollout so each answer is generated in two stages: a chain of
thought sampled until ``</think>``, then the prompt + thought + a fixed transition prefix, from
which the item ids are generated. Here the same idea drives tool calls, and only one method of
the episode loop is overridden (`EpisodeRunner.generate_turn`); the env steps, observation
deltas, budgets and the batch layout stay toolrl's:

1. insert ``<think>`` (a fixed token: mask 0), then sample the reasoning until ``</think>``
   (its own token budget and temperature); close it with ``</think>`` if the budget ran out;
2. insert the transition prefix ``\\n<tool_call>`` (mask 0), then sample the call until
   ``</tool_call>`` with the call-stage sampling (e.g. cooler).

Inserted tokens condition the model but are not trained on: they carry mask 0 and log-prob 0,
exactly like tool results. Use it from a rollout config with
``toolrl.RolloutConfig(runner=TwoStageRunner)`` (or ``rollout.runner: two_stage:TwoStageRunner``
in an experiment config, when this file is importable), or run this file to see a few episodes
of the tiny model::

    .venv/bin/python examples/two_stage_rollout/two_stage.py --episodes 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from typing import Any

import toolrl
from toolrl import EpisodeRunner, EpisodeState, SamplingConfig, TurnOutput


class TwoStageRunner(EpisodeRunner):
    """Each model turn: think (sampled until ``</think>``), then call (after a fixed prefix).

    Attributes (class-level defaults; override in a subclass or on the instance):
        think_max_tokens / think_temperature: budget and temperature of the reasoning stage.
        call_min_tokens: tokens of the turn's budget kept for the call stage.
        call_temperature / call_stop: temperature and stop strings of the call stage.
        think_open / think_close / transition: the fixed texts inserted around the stages.
    """

    think_max_tokens: int = 24
    think_temperature: float = 1.0
    call_min_tokens: int = 32
    call_temperature: float = 0.7
    call_stop: tuple[str, ...] = ("</tool_call>",)
    think_open: str = "<think>"
    think_close: str = "</think>"
    transition: str = "\n<tool_call>"

    async def generate_turn(self, state: EpisodeState) -> TurnOutput:
        turn = TurnOutput()
        turn.extend(self.renderer.encode(self.think_open), sampled=False)

        # stage 1: reasoning, stopped by the closing tag (kept in the output)
        think = self.stage_sampling(state, turn, reserve=self.call_min_tokens,
                                    max_tokens=self.think_max_tokens,
                                    temperature=self.think_temperature,
                                    stop=(self.think_close,))
        if think.max_tokens > 0:
            [thought] = await self.engine.generate(state.token_ids + turn.token_ids, think)
            turn.add(thought)
        if not self.renderer.tokenizer.decode(turn.token_ids).rstrip().endswith(
                self.think_close):
            turn.extend(self.renderer.encode(self.think_close), sampled=False)

        # stage 2: the call, after a fixed transition prefix
        turn.extend(self.renderer.encode(self.transition), sampled=False)
        call = self.stage_sampling(state, turn, temperature=self.call_temperature,
                                   stop=self.call_stop)
        if call.max_tokens > 0:
            [answer] = await self.engine.generate(state.token_ids + turn.token_ids, call)
            turn.add(answer)
        else:
            turn.finish_reason = "length"
        return turn

    def stage_sampling(self, state: EpisodeState, turn: TurnOutput, reserve: int = 0,
                       **changes: Any) -> SamplingConfig:
        """A stage's sampling: bounded by what is left of the turn (the per-turn
        ``max_tokens`` and the episode budget), keeping ``reserve`` tokens for later stages."""
        left = min(self.config.sampling.max_tokens, state.room) - len(turn.token_ids) - reserve
        changes["max_tokens"] = max(0, min(changes.get("max_tokens", left), left))
        return self.turn_sampling(state, offset=len(turn.token_ids), **changes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model directory (default: build the tiny model)")
    parser.add_argument("--episodes", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = args.model or os.path.join(tempfile.gettempdir(), "toolrl-tiny-two-stage")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([sys.executable, "-m", "toolrl.cli", "make-tiny-model", "--out", model],
                       check=True)
    config = toolrl.RolloutConfig(
        engine=toolrl.EngineConfig(model=model, max_model_len=2048, kv_cache_gib=0.25,
                                   multiprocessing=False),
        max_tokens_per_turn=64, max_prompt_tokens=1024, max_total_tokens=1536,
        env_id="toolrl/Calculator-v0", env_kwargs={"max_turns": 3}, runner=TwoStageRunner)
    worker = toolrl.RolloutWorker(config)
    try:
        env = toolrl.make_env("toolrl/Calculator-v0")
        rows = env.unwrapped.make_tasks(args.episodes, seed=0)
        env.close()
        trajs = asyncio.run(worker.run_episodes(rows, seeds=list(range(len(rows)))))
        tok = worker.engine.tokenizer
        for i, traj in enumerate(trajs):
            ids, mask = traj.tokens.response_ids, traj.tokens.response_mask
            print(f"episode {i}: {traj.num_turns} turns, finish={traj.finish_reason}")
            for k, turn in enumerate(traj.turns):
                start, end = turn.action_span
                pieces, first = [], start
                for j in range(start, end + 1):
                    if j == end or mask[j] != mask[first]:
                        tag = "sampled" if mask[first] else "inserted"
                        pieces.append(f"[{tag}] {tok.decode(ids[first:j])!r}")
                        first = j
                print("  turn", k, " ".join(pieces))
    finally:
        worker.shutdown()


if __name__ == "__main__":
    main()
