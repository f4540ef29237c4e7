"""`remote`: POST each trajectory to an HTTP reward service (httpx; timeout, retries)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from toolrl import RewardError, RewardResult, Trajectory, reward


@reward("remote")
class RemoteReward:
    """Score from an HTTP reward service (POST JSON, timeout, retries).

    POST ``Trajectory.to_dict()`` as JSON to ``url``; the answer is a number or an object
    ``{"score": float, "components": {...}, "per_turn": [...], "reason": str}``.

    Connection errors, timeouts and 5xx answers are retried ``retries`` times (exponential
    ``backoff``); a 4xx answer or a malformed body fails at once. A sample that still fails is
    scored with the configured fallback and counted in ``reward/errors/<alias>``.
    """

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 2, backoff: float = 0.1,
                 headers: Mapping[str, str] | None = None, max_concurrency: int = 16) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"remote: url must be an http(s) URL, got {url!r}")
        if timeout <= 0 or retries < 0 or backoff < 0 or max_concurrency < 1:
            raise ValueError("remote: need timeout > 0, retries >= 0, backoff >= 0, "
                             "max_concurrency >= 1")
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.headers = {"content-type": "application/json", **dict(headers or {})}
        self.max_concurrency = max_concurrency

    async def batch(self, trajs: list[Trajectory]) -> list[RewardResult | BaseException]:
        import httpx

        sem = asyncio.Semaphore(self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.timeout, headers=self.headers) as client:

            async def one(traj: Trajectory) -> RewardResult | BaseException:
                async with sem:
                    try:
                        return await self._post(client, traj)
                    except Exception as exc:
                        return exc

            return list(await asyncio.gather(*(one(t) for t in trajs)))

    async def _post(self, client: Any, traj: Trajectory) -> RewardResult:
        import httpx

        body = json.dumps(traj.to_dict(), default=str)
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = await client.post(self.url, content=body)
            except httpx.TransportError as exc:  # connect, read, timeout: retry
                last = exc
                continue
            if response.status_code >= 500:
                last = RewardError(f"{self.url} answered {response.status_code}")
                continue
            if response.status_code >= 400:
                raise RewardError(f"{self.url} answered {response.status_code}: "
                                  f"{response.text[:200]}")
            return _result(response.json())
        raise RewardError(f"{self.url}: failed after {self.retries + 1} attempt(s): "
                          f"{type(last).__name__}: {last}")


def _result(data: Any) -> RewardResult:
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return RewardResult(float(data))
    if isinstance(data, Mapping) and "score" in data:
        return RewardResult(score=float(data["score"]),
                            components={k: float(v) for k, v in
                                        (data.get("components") or {}).items()},
                            per_turn=None if data.get("per_turn") is None else
                            [float(v) for v in data["per_turn"]],
                            reason=str(data.get("reason") or ""))
    raise RewardError(f"reward service answered {data!r}; expected a number or "
                      f"{{'score': ...}}")
