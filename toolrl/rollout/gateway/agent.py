"""`AgentRunner`: your own agent, against the gateway, one episode per task row.

``rollout.agent: "pkg.mod:solve"`` names an async callable ``solve(client, row)`` (or a class
whose instances have that method; it is built once per worker with no arguments). For every
task row it gets a client whose base URL is that episode's gateway route, and talks to the
policy as to any hosted model: its own tools, its own loop (that client's requests go to the
gateway's app in-process; the URL serves any other client). ``rollout.agent_client`` says
which client: ``openai`` (an ``openai.AsyncOpenAI``: Chat Completions or the Responses API,
e.g. the OpenAI Agents SDK's default model) or ``anthropic`` (an ``anthropic.AsyncAnthropic``:
the Messages API). What it returns (None, or a mapping such as ``{"success": True}``) becomes
the trajectory's ``info``; reward plugins then score the `Trajectory` the gateway captured
(its turns, the calls parsed in the configured format, the tool results the agent sent back).

An agent whose conversation outgrows the token budget (``rollout.max_prompt_tokens`` for a
sample's first prompt, ``max_total_tokens`` for a sample) gets the API's 400
(``context_length_exceeded``); if it raises on it, the episode ends with ``context`` (as the
env loop does) and trains on what was sampled. An episode runs at most
``rollout.agent_timeout_s`` seconds, and at most
``rollout.concurrency`` run at once per worker. An agent that raises (``agent_crash``), runs
past its deadline (``agent_timeout``) or never calls the model (``agent_crash``) gives an
infrastructure-failed episode (`Trajectory.infra_failure`): the trainer keeps it out of the
loss (`toolrl.trainer.failures`).

The route samples at the rollout's temperature, top_p and top_k (greedy on validation), each
call at most ``rollout.max_tokens_per_turn`` tokens, and seeds the calls
from the episode's seed, whatever the agent's requests say: the update recomputes the
log-probs at that temperature, and a seeded run repeats.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx

from toolrl.core.trajectory import TokenStream, Trajectory, plain
from toolrl.registry import import_object
from toolrl.rollout.gateway import CLIENTS
from toolrl.rollout.gateway.app import Gateway
from toolrl.rollout.gateway.capture import Sample
from toolrl.rollout.gateway.server import GatewayServer
from toolrl.rollout.samples import episode_leads, episode_rows, is_episode_lead, one_per_episode

logger = logging.getLogger(__name__)

__all__ = ["AgentRunner", "episode_leads", "episode_rows", "gateway_metrics", "is_episode_lead",
           "one_per_episode", "resolve_agent"]

Agent = Callable[[Any, Mapping[str, Any]], Awaitable[Any]]


def resolve_agent(spec: Any) -> Agent:
    """The ``solve(client, row)`` coroutine function of ``"module:name"`` (a function, or a
    class with a ``solve`` method, instantiated here), or of the object itself."""
    obj = import_object(spec, "rollout.agent") if isinstance(spec, str) else spec
    if isinstance(obj, type):
        obj = obj()
    fn = obj if inspect.isfunction(obj) or inspect.ismethod(obj) else getattr(obj, "solve", None)
    if not (callable(fn) and inspect.iscoroutinefunction(fn)):
        raise TypeError(f"rollout.agent must be an async function solve(client, row) or a "
                        f"class with an async solve method, got {spec!r}")
    return fn


class AgentRunner:
    """Runs a user's agent against a gateway on ``engine`` (served on loopback).

    Args:
        engine / renderer: the worker's engine and chat renderer.
        agent: what `resolve_agent` takes.
        model: the model name the agent's client sends.
        format: the tool-call format replies are parsed with.
        timeout_s: each episode's deadline; concurrency: episodes at once.
        max_tokens / max_prompt_tokens / max_response_tokens: see `Gateway`.
        transport: how the agent's own client reaches the gateway, ``"inprocess"`` or
            ``"http"`` (`client`); the gateway is served on loopback either way.
        client: the SDK the agent gets, ``"openai"`` or ``"anthropic"`` (`client`).
    """

    def __init__(self, engine: Any, renderer: Any, agent: Any, *, model: str = "policy",
                 format: str = "hermes", timeout_s: float = 120.0, concurrency: int = 64,
                 max_tokens: int | None = None, max_prompt_tokens: int | None = None,
                 max_response_tokens: int | None = None,
                 transport: str = "inprocess", client: str = "openai") -> None:
        if transport not in ("inprocess", "http"):
            raise ValueError(f"transport must be 'inprocess' or 'http', got {transport!r}")
        if client not in CLIENTS:
            raise ValueError(f"rollout.agent_client must be one of {CLIENTS}, got {client!r}")
        if importlib.util.find_spec(client) is None:  # fail here, not in every episode
            raise ImportError(f"rollout.agent_client={client!r} needs the {client!r} package "
                              f"(pip install {client})")
        self.agent = resolve_agent(agent)
        self.transport, self.client_kind = transport, client
        self.renderer = renderer
        self.timeout_s, self.concurrency = float(timeout_s), int(concurrency)
        self.gateway = Gateway(engine, renderer, model=model, format=format,
                               max_tokens=max_tokens, max_prompt_tokens=max_prompt_tokens,
                               max_response_tokens=max_response_tokens)
        self.server = GatewayServer(self.gateway, keep_alive_s=self.timeout_s + 60).start()
        self._tls: dict[str, Any] = {}  # module name: its TLS context

    def close(self) -> None:
        self.server.stop()

    def client(self, episode_id: str) -> tuple[Any, Any]:
        """The client of one episode's route (``openai.AsyncOpenAI``, or
        ``anthropic.AsyncAnthropic`` when ``client="anthropic"``), and the HTTP client it owns.

        Its ``base_url`` is the route on the served gateway, usable by any HTTP client. Its
        own requests go by ``transport``: ``"inprocess"`` hands them to the gateway on the
        agent's event loop (`Gateway.transport`: the same requests, routes and replies,
        without a socket, HTTP parsing on both ends, or a hop to the server's thread);
        ``"http"`` sends them over loopback, on a connection pool of the episode's own
        (httpx scans every connection of a pool on each request and response, so one pool
        shared by all episodes in flight costs O(episodes) per call).
        """
        if self.client_kind == "anthropic":  # the anthropic SDK speaks httpx2
            # lazy: the agent SDKs are optional (dev extras) and heavy (~1-2 s each)
            import anthropic
            import httpx2

            http: Any = httpx2.AsyncClient(transport=self._transport(httpx2),
                                           timeout=self.timeout_s, trust_env=False)
            return anthropic.AsyncAnthropic(
                base_url=self.server.anthropic_url(episode_id), api_key="toolrl",
                max_retries=0, timeout=self.timeout_s, http_client=http), http
        import openai  # lazy: optional (dev extras), ~1 s

        http = httpx.AsyncClient(transport=self._transport(httpx), timeout=self.timeout_s,
                                 trust_env=False)
        return openai.AsyncOpenAI(base_url=self.server.episode_url(episode_id),
                                  api_key="toolrl", max_retries=0, timeout=self.timeout_s,
                                  http_client=http), http

    def _transport(self, httpx: Any) -> Any:
        """``transport``'s transport from the ``httpx`` module given (httpx or httpx2)."""
        if self.transport == "inprocess":
            return self.gateway.transport(httpx)
        if httpx.__name__ not in self._tls:  # unused on loopback, but built per client
            self._tls[httpx.__name__] = httpx.create_ssl_context()
        return httpx.AsyncHTTPTransport(verify=self._tls[httpx.__name__])

    async def run_all(self, rows: Sequence[Mapping[str, Any]], seeds: Sequence[int | None],
                      temperature: float, top_p: float = 1.0, top_k: int = -1
                      ) -> list[tuple[Trajectory, list[Sample]]]:
        """One episode per row, at most ``concurrency`` at once; results in row order."""
        sem = asyncio.Semaphore(self.concurrency)

        async def one(row: Mapping[str, Any], seed: int | None):
            async with sem:
                return await self.run(row, seed, temperature, top_p, top_k)

        return list(await asyncio.gather(*(one(r, s) for r, s in zip(rows, seeds, strict=True))))

    async def run(self, row: Mapping[str, Any], seed: int | None, temperature: float,
                  top_p: float = 1.0, top_k: int = -1) -> tuple[Trajectory, list[Sample]]:
        """One episode: the agent against its own route, then the captured trajectory."""
        t0 = time.perf_counter()
        eid = self.gateway.open_episode(seed=seed, temperature=temperature, top_p=top_p,
                                        top_k=top_k)
        client, http = self.client(eid)
        info: Any = None
        error = infra = None
        try:
            info = await asyncio.wait_for(self.agent(client, dict(row)), self.timeout_s)
        except TimeoutError:
            error = f"agent: no answer within rollout.agent_timeout_s={self.timeout_s:g}"
            infra = "agent_timeout"
        except Exception as e:
            error, infra = f"agent: {type(e).__name__}: {e}", "agent_crash"
        finally:
            await http.aclose()
        capture = self.gateway.close_episode(eid)
        finish = "error" if infra else "terminated"
        if capture.overflow and capture.calls and infra == "agent_crash":
            # the conversation outgrew the token budget: the policy's doing, as in the env
            # loop's ``context`` end, not the infrastructure's
            finish, infra = "context", None
        if infra is None and not capture.calls:
            error, infra = "agent: it never called the model", "agent_crash"
        if infra is not None:
            finish = "error"
            logger.warning("episode %s failed: %s", row.get("id"), error)
        if info is not None and not isinstance(info, Mapping):
            info = {"result": plain(info)}
        traj, samples = capture.trajectory(row, format=self.gateway.format_name, info=info,
                                           finish_reason=finish,
                                           error=error, infra=infra)
        if not samples:  # one placeholder token keeps the batch row non-empty
            samples = [Sample(TokenStream(prompt_ids=[self.renderer.eos_token_id]))]
            traj.tokens = samples[0].tokens
            traj.extra["gateway"]["samples"] = 1
        traj.seed = seed
        traj.timing["total_s"] = time.perf_counter() - t0
        return traj, samples


def gateway_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """``rollout/gateway_splits``: calls that started a new sample (a rewritten history), per
    batch; ``rollout/gateway_calls_mean``: model calls per episode;
    ``rollout/gateway_constrained_calls``: calls sampled through a grammar (``tool_choice``
    required or named), per batch. Empty without agents."""
    lead = [t.extra["gateway"] for t in one_per_episode(trajs) if "gateway" in t.extra]
    if not lead:
        return {}
    return {"rollout/gateway_splits": float(sum(g["splits"] for g in lead)),
            "rollout/gateway_calls_mean": sum(g["calls"] for g in lead) / len(lead),
            "rollout/gateway_constrained_calls": float(sum(g.get("constrained", 0)
                                                           for g in lead))}
