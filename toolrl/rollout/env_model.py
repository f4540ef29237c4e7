"""The rollout's own engine as a `toolrl.core.env.ChatModel` for the env of one episode.

`EpisodeRunner.start` gives every `ToolEnv` an `EngineChatModel` (``env.rollout_model``) before
``reset``, so an env can prompt the policy's engine as another party of the conversation (e.g.
tau2's user simulator, `toolrl.envs.tau2.users.EngineUser`). Its prompts are rendered with the
engine's chat template and sampled by the engine under the policy's current weights; the text
goes back to the env, never into the episode's token stream: whatever the env makes of it
reaches the policy as an observation (mask 0), so none of its tokens train.
"""

from __future__ import annotations

from typing import Any

from toolrl.rollout.chat import ChatRenderer
from toolrl.rollout.engine import SamplingConfig, VLLMEngine

_SEED_MOD = 2**31 - 1


class EngineChatModel:
    """One episode's view of the engine as a chat model.

    Args:
        engine: the rollout's `VLLMEngine`.
        renderer: its `ChatRenderer` (the engine's tokenizer and chat template).
        sampling: the default sampling (the rollout's per-turn sampling; log-probs off).
        seed: the episode's seed: call ``i`` samples with a seed derived from it (None:
            unseeded).

    Attributes:
        calls / prompt_tokens / sampled_tokens: what the episode's env asked of the engine.
    """

    def __init__(self, engine: VLLMEngine, renderer: ChatRenderer, sampling: SamplingConfig,
                 seed: int | None = None) -> None:
        self.engine = engine
        self.renderer = renderer
        self.sampling = sampling.replace(logprobs=False, n=1, ignore_eos=False,
                                         allowed_token_ids=(), structured_outputs=None)
        self.seed = seed
        self.calls = 0
        self.prompt_tokens = 0
        self.sampled_tokens = 0

    async def achat(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None, *,
                    temperature: float | None = None, max_tokens: int | None = None) -> str:
        """The engine's reply to ``messages`` (awaited on any loop)."""
        if not self.engine.on_loop():
            return await self.engine.run_async(self.achat(messages, tools,
                                                          temperature=temperature,
                                                          max_tokens=max_tokens))
        prompt = self.renderer.render_prompt(messages, tools)
        changes: dict[str, Any] = {}
        if temperature is not None:
            changes["temperature"] = float(temperature)
        if max_tokens is not None:
            changes["max_tokens"] = int(max_tokens)
        if self.seed is not None:
            changes["seed"] = self.call_seed(self.calls)
        self.calls += 1
        [out] = await self.engine.generate(prompt, self.sampling.replace(**changes))
        self.prompt_tokens += len(prompt)
        self.sampled_tokens += len(out.token_ids)
        return self.renderer.decode(out.token_ids)

    def call_seed(self, call: int) -> int | None:
        """The sampling seed of call ``call`` (0-based) of this episode (None: unseeded)."""
        if self.seed is None:
            return None
        return (self.seed * 1_000_003 + 104_729 * (call + 1)) % _SEED_MOD

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             *, temperature: float | None = None, max_tokens: int | None = None) -> str:
        """`achat`, blocking: from any thread but the engine's own loop (an env whose step
        calls it declares ``blocking_step = True``, so the runner steps it on a thread)."""
        if self.engine.on_loop():
            raise RuntimeError("ChatModel.chat blocks and was called on the engine's event "
                               "loop: the env must declare blocking_step = True (its reset and "
                               "steps then run on a thread), or await achat")
        return self.engine.run_on_loop(self.achat(messages, tools, temperature=temperature,
                                                  max_tokens=max_tokens))

    def usage(self) -> dict[str, int]:
        """Calls and tokens so far (the cost of the env's model per episode)."""
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens,
                "sampled_tokens": self.sampled_tokens}


__all__ = ["EngineChatModel"]
