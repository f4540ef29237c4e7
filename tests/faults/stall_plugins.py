"""Stalls injected into a run (``rollout.runner`` / ``rollout.agent`` by module path): each
starts once the engine has the first pushed weights (policy version >= 1), so step 1 runs and
sets the watchdog's bound, and a later step never finishes."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from toolrl.rollout.episode import EpisodeRunner

CALLS = {"agent": 0}


class NeverReturningRunner(EpisodeRunner):
    """An engine request that never returns: the episode awaits forever (cancellable)."""

    async def run(self, env, row=None, **kwargs):
        if self.engine.weight_version >= 1:
            await asyncio.Event().wait()
        return await super().run(env, row, **kwargs)


def first_time(what: str) -> bool:
    """True once per Ray job (the driver run): a marker file keyed on the node and job id
    (job ids repeat across clusters), so a worker that the retry path started anew does not
    stall again."""
    import ray

    ctx = ray.get_runtime_context()
    marker = Path(tempfile.gettempdir()) / f"toolrl-stall-{what}-{ctx.get_node_id()[:16]}-" \
                                           f"{ctx.get_job_id()}"
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


class StallsOnceRunner(EpisodeRunner):
    """`NeverReturningRunner`, but only in the first rollout worker of the run: the one
    ``trainer.on_rollout_failure: retry`` restarts episodes normally."""

    async def run(self, env, row=None, **kwargs):
        if self.engine.weight_version >= 1 and first_time("once"):
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
