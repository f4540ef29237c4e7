"""Stalls injected into a run (``rollout.runner`` / ``rollout.agent`` by module path): each
starts once the engine has the first pushed weights (policy version >= 1), so step 1 runs and
sets the watchdog's bound, and a later step never finishes."""

from __future__ import annotations

import asyncio
import time

from toolrl.rollout.episode import EpisodeRunner

CALLS = {"agent": 0}


class NeverReturningRunner(EpisodeRunner):
    """An engine request that never returns: the episode awaits forever (cancellable)."""

    async def run(self, env, row=None, **kwargs):
        if self.engine.weight_version >= 1:
            await asyncio.Event().wait()
        return await super().run(env, row, **kwargs)


class UnansweringRunner(EpisodeRunner):
    """A worker that stops answering: the episode blocks the engine's event loop thread."""

    async def run(self, env, row=None, **kwargs):
        if self.engine.weight_version >= 1:
            time.sleep(3600)
        return await super().run(env, row, **kwargs)


async def hangs_after_step_1(client, row):
    """A gateway agent whose episodes never end from its 13th on (4 validation episodes and
    step 1's 2 x 4 come first)."""
    CALLS["agent"] += 1
    if CALLS["agent"] > 12:
        await asyncio.Event().wait()
    r = await client.chat.completions.create(model="policy", messages=[
        {"role": "user", "content": str(row.get("question", "hi"))}], max_tokens=4)
    return {"text": r.choices[0].message.content}
