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
``RolloutConfig(runner=TwoStageRunner)`` (or ``runner="two_stage:TwoStageRunner"`` when this
file is importable), or run this file to see a few episodes of the tiny model::

    .venv/bin/python examples/two_stage_rollout/two_stage.py --episodes 2
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

from toolrl.rollout.engine import SamplingConfig
from toolrl.rollout.episode import EpisodeRunner, EpisodeState, TurnOutput


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
    from toolrl.envs.calculator import CalculatorEnv

    from toolrl.batch import EPISODES, RESPONSE_MASK, RESPONSES, get_non_tensor
    from toolrl.models.tiny import build_tiny_model
    from toolrl.rollout import EngineConfig, RolloutConfig, RolloutWorker, make_rollout_input

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model directory (default: build the tiny model)")
    parser.add_argument("--episodes", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = args.model or str(build_tiny_model(os.path.join(tempfile.gettempdir(),
                                                            "toolrl-tiny-two-stage")))
    config = RolloutConfig(
        engine=EngineConfig(model=model, max_model_len=2048, kv_cache_gib=0.25,
                            multiprocessing=False),
        sampling=SamplingConfig(max_tokens=64), max_prompt_len=1024, max_response_len=512,
        env_id="toolrl/Calculator-v0", env_kwargs={"max_turns": 3}, runner=TwoStageRunner)
    worker = RolloutWorker(config)
    try:
        rows = CalculatorEnv.make_tasks(args.episodes, seed=0)
        out = worker.rollout(make_rollout_input(rows))
        tok = worker.engine.tokenizer
        for i, record in enumerate(get_non_tensor(out, EPISODES)):
            n = record["response_len"]
            ids = out[RESPONSES][i, :n].tolist()
            mask = out[RESPONSE_MASK][i, :n].tolist()
            print(f"episode {i}: {record['num_turns']} turns, finish={record['finish_reason']}")
            for turn in record["turns"]:
                pieces, start = [], turn["start"]
                for j in range(turn["start"], turn["end"] + 1):
                    if j == turn["end"] or mask[j] != mask[start]:
                        tag = "sampled" if mask[start] else "inserted"
                        pieces.append(f"[{tag}] {tok.decode(ids[start:j])!r}")
                        start = j
                print("  turn", turn["index"], " ".join(pieces))
    finally:
        worker.shutdown()


if __name__ == "__main__":
    main()
