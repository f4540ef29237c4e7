"""The rollout's episode loop with a scripted policy in place of the engine: `ScriptedRunner`.

A scripted policy (an env's oracle, the dry run's bad policies) writes each turn's text; the
runner records it as the tokens a model would have sampled for that text (its tokens, then the
turn's end token; log-probs 0.0), cut where the engine would cut it (the turn's ``max_tokens``
within the budget: finish reason ``length``), and hands the env the text. Everything else is
`EpisodeRunner`'s own loop: the first prompt and its budget, the turn cap, env steps and their
errors and timeouts, observation deltas, ``per_turn`` prompts, finish reasons, the final state.
Nothing is sampled and no process starts; the env gets no `ToolEnv.rollout_model`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from toolrl.rollout.chat import ChatRenderer
from toolrl.rollout.episode import EpisodeConfig, EpisodeRunner, EpisodeState, TurnOutput

__all__ = ["ScriptedPolicy", "ScriptedRunner", "ScriptedTurn"]

ScriptedPolicy = Callable[[Any, list[dict[str, Any]]], str | Awaitable[str]]
"""``policy(env, messages) -> text`` (sync or async), as `toolrl.run_episode` takes it."""


@dataclass
class ScriptedTurn(TurnOutput):
    """A turn the policy wrote: ``text`` goes to the env (None when the budget cut it: the
    env gets the kept tokens' text, as from an engine)."""

    text: str | None = None


class _NoEngine:
    """What the loop reads of an engine when nothing is sampled: the context window."""

    weight_version = 0

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a ScriptedRunner samples nothing: its policy writes every turn")


class ScriptedRunner(EpisodeRunner):
    """`EpisodeRunner` whose turns ``policy`` writes (see the module docstring).

    Args:
        policy: ``policy(env, messages) -> text``; what it raises propagates.
        renderer: the rollout's `ChatRenderer`.
        config: the rollout's budget (`RolloutConfig.episode_config`).
        max_model_len: the engine's context window (``rollout.engine.max_model_len``).
    """

    def __init__(self, policy: ScriptedPolicy, renderer: ChatRenderer,
                 config: EpisodeConfig | None = None, *, max_model_len: int) -> None:
        super().__init__(_NoEngine(max_model_len), renderer, config)  # type: ignore[arg-type]
        self.policy = policy

    async def generate_turn(self, state: EpisodeState) -> TurnOutput:
        text = self.policy(state.env, state.traj.messages)
        if inspect.isawaitable(text):
            text = await text
        # the tokenizer's own pieces (a compact vocabulary's too): a record, never trained on
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.renderer.eos_token_id]
        limit = self.turn_sampling(state).max_tokens
        cut = len(ids) > limit
        out = ScriptedTurn(finish_reason="length" if cut else "stop", text=None if cut else text)
        out.extend(ids[:limit], [0.0] * min(len(ids), limit))
        return out

    def decode(self, state: EpisodeState, turn: TurnOutput) -> str:
        text = turn.text if isinstance(turn, ScriptedTurn) else None
        return text if text is not None else super().decode(state, turn)

    def env_model(self, seed: int | None) -> None:  # type: ignore[override]
        return None
