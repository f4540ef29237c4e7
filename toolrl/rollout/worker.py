"""`RolloutWorker`: one vLLM engine running many tool episodes concurrently.

::

    group = RayWorkerGroup(pool, RolloutWorker, config)
    out = group.call(RolloutWorker.rollout, make_rollout_input(rows, n=8))

The input is a TensorDict of task rows (``ROWS``, a NonTensorStack of dicts) with a ``UID``
per row; rows that share a uid form one GRPO group (`make_rollout_input` repeats each task
``n`` times with `toolrl.batch.repeat_interleave`). Each row becomes one episode; up to
``concurrency`` episodes run at once on the event loop of the worker's engine (beside vLLM's
output handler, as in vLLM's own server: no hop between threads per model call), so while one
waits on a tool the others generate. The output is `toolrl.batch.build_rollout_batch`'s layout
(left-padded prompts, right-padded responses, masks, ``rollout_log_probs``) plus
``POLICY_VERSION``, the input ``ROWS`` and ``UID``, and one `Trajectory` per row under
``TRAJECTORIES`` (its tokens moved into the tensors, its ``uid`` and ``policy_version`` set).
Prompts and responses are padded to the configured maxima, so the shards of several workers
concatenate.

Which env a row runs in: the row's ``env`` field (and ``env_kwargs``), else
``RolloutConfig.env_id`` (with ``RolloutConfig.env_kwargs``). The episode
loop is `EpisodeRunner`; ``RolloutConfig.runner`` names a subclass (class or
``"package.module:Class"``) to change it without touching this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from toolrl import batch as B
from toolrl.controller.worker import Dispatch, Worker, remote
from toolrl.core.families import FAMILIES
from toolrl.core.mcp_client import close_mcp_connections
from toolrl.core.registration import make_env, row_env
from toolrl.core.trajectory import TokenStream, Trajectory
from toolrl.registry import import_object
from toolrl.rollout import engine_guard
from toolrl.rollout.chat import ChatRenderer
from toolrl.rollout.engine import EngineConfig, SamplingConfig, VLLMEngine
from toolrl.rollout.episode import MAX_TURNS, EpisodeConfig, EpisodeRunner, Overflow
from toolrl.rollout.gateway import CLIENTS, AgentClient
from toolrl.rollout.gateway.agent import AgentRunner, gateway_metrics
from toolrl.rollout.history import HISTORY_POLICIES, HistoryPolicy
from toolrl.rollout.samples import episode_rows, one_per_episode, per_turn_rows
from toolrl.rollout.stream import EpisodeStream, FinishedGroup, GroupJob
from toolrl.weights.buckets import Checksum
from toolrl.weights.colocated import register_local_engine, unregister_local_engine
from toolrl.weights.group import WeightSyncGroup

logger = logging.getLogger(__name__)


def experiment_engine() -> EngineConfig:
    """The engine of an experiment's rollout workers before the trainer names the model: vLLM's
    worker in the engine-core process, a 2048-token context, the backend's other defaults."""
    return EngineConfig(model="", max_model_len=2048, multiprocessing=False)


@dataclass
class RolloutConfig:
    """The rollout workers: their engine, sampling, token budgets, concurrency and episode
    loop. It is the experiment's ``rollout:`` section, key for key; the trainer fills
    ``engine.model``, ``engine.seed``, ``env_id``, ``env_kwargs`` and ``seed``.

    Attributes:
        concurrency: episodes in flight at once (per worker).
        temperature / top_p / top_k: per-turn sampling (``top_k=-1``, ``top_p=1``: off). At
            a temperature other than 1 the engine reports the log-probs of the tempered
            distribution (``engine.logprobs_mode`` ``processed_logprobs``), the actor's.
        max_tokens_per_turn: most tokens of one model turn.
        ignore_eos: sample every turn to its budget (fixed-length turns, for benchmarks).
        max_turns: a safety cap on model turns (the env has its own limit).
        max_total_tokens: the episode's tokens: the first prompt and every turn and
            observation after it; ``engine.max_model_len`` must hold it.
        max_prompt_tokens: most tokens of the first prompt (None: ``min(max_total_tokens //
            2, 512)``); the response gets the rest. Both are the padded widths of the batch.
        val_temperature: validation episodes decode greedily when 0 (the trainer's choice).
        on_overflow: when an observation does not fit: ``"stop"`` appends none of it,
            ``"truncate"`` appends the part that fits; either way the episode ends
            (``context``). See `EpisodeConfig`.
        env_timeout_s: the longest one env step may take (None: no bound); past it the
            episode ends as an infrastructure failure (``env_timeout``).
        engine: the vLLM engine (`EngineConfig`).
        env_id: env of rows without an ``env`` field; env_kwargs: passed to ``make_env``.
        seed: base of the per-episode sampling seeds (None: unseeded sampling).
        seed_episodes: give every episode a sampling seed (reproducible rollouts). None: on
            for a CPU engine, off on GPU (seeded requests make vLLM's GPU sampler fall back
            from its fast kernels). Off: unseeded sampling, whatever ``seed`` says.
        pad_to_max: pad to the configured widths (needed to concatenate workers' shards);
            False pads to the longest sample of the shard.
        runner: the `EpisodeRunner` subclass (class or ``"module:Class"``); None: the default.
        agent: ``"package.module:solve"``: your own agent (``async solve(client, row)``, or a
            class with that method) plays each episode against the OpenAI-compatible gateway
            on the worker's engine instead of the env loop (`toolrl.rollout.gateway.agent`);
            ``concurrency``, the sampling keys, ``max_tokens_per_turn`` and the token budgets
            apply to its calls; ``max_turns``, ``ignore_eos``, ``on_overflow`` and
            ``env_timeout_s`` belong to the env loop (the agent's loop is its own).
            None: the env loop.
        agent_timeout_s: each agent episode's deadline (past it: ``agent_timeout``).
        agent_client: the client ``solve`` gets: ``openai`` (``openai.AsyncOpenAI`` on the
            episode's route: Chat Completions and the Responses API) or ``anthropic``
            (``anthropic.AsyncAnthropic``: the Messages API).
        agent_format: the tool-call format gateway replies are parsed with; None: the format
            of ``env_id``'s env.
        allow_non_prefix_preserving: the old spelling of ``history_policy="keep_stream"``.
        chat_template_kwargs: extra keyword arguments for every ``apply_chat_template`` call
            (e.g. ``{"enable_thinking": False}``).
        history_policy: how a template that rewrites history is held
            (`toolrl.rollout.history`): ``auto`` (deltas when the template is
            prefix-preserving, else ``per_turn``), ``delta`` (refuse a template that is not),
            ``per_turn`` (each model turn its own sample, prompted as at inference),
            ``keep_stream`` (train on the sampled stream, not exact: said in a warning),
            ``preserve`` (the family's keywords that keep earlier reasoning).
        family: the model family of the tokenizer's template (`toolrl.core.families`); None:
            found by the template itself (none: no conventions).
    """

    concurrency: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens_per_turn: int = 64
    ignore_eos: bool = False
    max_turns: int = MAX_TURNS
    max_total_tokens: int = 1024
    max_prompt_tokens: int | None = None
    val_temperature: float = 0.0
    on_overflow: Overflow = "stop"
    env_timeout_s: float | None = None
    engine: EngineConfig = field(default_factory=experiment_engine)
    env_id: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int | None = 0
    seed_episodes: bool | None = None
    pad_to_max: bool = True
    runner: Any = None
    agent: str | None = None
    agent_timeout_s: float = 120.0
    agent_client: AgentClient = "openai"
    agent_format: str | None = None
    allow_non_prefix_preserving: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    history_policy: HistoryPolicy = "auto"
    family: str | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be >= 1, or -1 or 0 (off), got {self.top_k}")
        if self.val_temperature < 0:
            raise ValueError(f"val_temperature must be >= 0, got {self.val_temperature}")
        prompt = self.max_prompt_tokens
        if prompt is not None and not 1 <= prompt < self.max_total_tokens:
            raise ValueError(f"max_prompt_tokens ({prompt}) must be >= 1 and leave room for "
                             f"the response in max_total_tokens ({self.max_total_tokens})")
        if self.agent is not None and self.runner is not None:
            raise ValueError("rollout.agent and rollout.runner both replace the episode loop: "
                             "set one of them")
        if not self.agent_timeout_s > 0:
            raise ValueError(f"agent_timeout_s must be > 0, got {self.agent_timeout_s}")
        if self.agent_client not in CLIENTS:
            raise ValueError(f"agent_client must be one of {list(CLIENTS)}, got "
                             f"{self.agent_client!r}")
        if self.history_policy not in HISTORY_POLICIES:
            raise ValueError(f"history_policy={self.history_policy!r}; choose one of "
                             f"{', '.join(HISTORY_POLICIES)}")
        if self.family is not None and self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r} is not a known model family; known: "
                             f"{', '.join(FAMILIES.names())}")
        if self.max_total_tokens > self.engine.max_model_len:
            raise ValueError(f"max_total_tokens ({self.max_total_tokens}) exceeds "
                             f"engine.max_model_len ({self.engine.max_model_len})")

    def engine_config(self) -> EngineConfig:
        """``engine`` with the log-probs the actor recomputes (logits / ``temperature``): the
        model's raw ones at temperature 1, else the tempered (processed) ones, unless
        ``engine.logprobs_mode`` says otherwise."""
        if self.engine.logprobs_mode is not None:
            return self.engine
        mode = "raw_logprobs" if self.temperature == 1.0 else "processed_logprobs"
        return dataclasses.replace(self.engine, logprobs_mode=mode)

    @property
    def seeded(self) -> bool:
        """Whether episodes get sampling seeds (``seed_episodes``, by default on CPU)."""
        if self.seed_episodes is not None:
            return self.seed_episodes
        return self.engine.backend != "gpu"

    @property
    def max_prompt_len(self) -> int:
        """The first prompt's budget (and the batch's prompt width)."""
        return self.max_prompt_tokens or min(self.max_total_tokens // 2, 512)

    @property
    def max_response_len(self) -> int:
        """The response's budget (and the batch's response width)."""
        return self.max_total_tokens - self.max_prompt_len

    @property
    def sampling(self) -> SamplingConfig:
        """Per-turn sampling."""
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_tokens_per_turn, ignore_eos=self.ignore_eos)

    def episode_config(self) -> EpisodeConfig:
        return EpisodeConfig(sampling=self.sampling, max_prompt_len=self.max_prompt_len,
                             max_response_len=self.max_response_len, max_turns=self.max_turns,
                             on_overflow=self.on_overflow,  # type: ignore[arg-type]
                             env_timeout_s=self.env_timeout_s)


def make_rollout_input(rows: Sequence[Mapping[str, Any]], n: int = 1,
                       uids: Sequence[str] | None = None) -> TensorDict:
    """A rollout batch of ``len(rows) * n`` rows: each task ``n`` times, sharing a ``UID``."""
    if not rows:
        raise ValueError("no task rows")
    td = TensorDict({}, batch_size=[len(rows)])
    B.set_non_tensor(td, B.ROWS, [dict(r) for r in rows])
    if uids is None:
        uids = [str(r.get("id") or uuid.uuid4().hex) for r in rows]
        if len(set(uids)) != len(uids):  # repeated task ids must not merge groups
            uids = [f"{u}#{i}" for i, u in enumerate(uids)]
    return B.repeat_interleave(td, n, uids=list(uids))


def resolve_runner(runner: Any) -> type[EpisodeRunner]:
    """An `EpisodeRunner` subclass from a class or a ``"module:Class"`` string."""
    if runner is None:
        return EpisodeRunner
    if isinstance(runner, str):
        runner = import_object(runner, "episode runner")
    if not (isinstance(runner, type) and issubclass(runner, EpisodeRunner)):
        raise TypeError(f"runner must be an EpisodeRunner subclass, got {runner!r}")
    return runner


class RolloutWorker(Worker):
    """Holds one `VLLMEngine`; `rollout` turns task rows into a training batch.

    Usable in one process (``RolloutWorker(config).rollout(td)``) or in a `RayWorkerGroup`.
    """

    @classmethod
    def early_start(cls, config: RolloutConfig) -> Callable[[], object] | None:
        """On CPU, where the engine forks its core from a fork server
        (`toolrl.rollout.engine_guard`): the driver's own, which a worker on its machine joins,
        so that vLLM's engine core is imported once per machine and driver; elsewhere the
        worker's own, whose import then runs beside the worker's."""
        if config.engine_config().backend != "cpu":
            return None
        return functools.partial(engine_guard.join_fork_server, engine_guard.shared_fork_server())

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config
        self.engine = VLLMEngine(config.engine_config())
        try:
            self.renderer = ChatRenderer(
                self.engine.tokenizer,
                allow_non_prefix_preserving=config.allow_non_prefix_preserving,
                chat_template_kwargs=config.chat_template_kwargs, family=config.family,
                history_policy=config.history_policy)
            self.runner = resolve_runner(config.runner)(self.engine, self.renderer,
                                                        config.episode_config())
            self.agent = self._agent_runner() if config.agent else None
        except BaseException:
            self.engine.shutdown()
            raise
        tok = self.engine.tokenizer
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None \
            else tok.eos_token_id
        self._calls = 0
        self._sync: WeightSyncGroup | None = None  # split pools: the group actor rank 0 sends on
        self._nccl = False  # split pools on GPU: the engine's workers receive over NCCL
        self._loaded_checksum: str | None = None
        self._stream: EpisodeStream | None = None  # trainer.mode=async
        # a colocated actor (same process) pushes weights straight into this engine
        register_local_engine(self.engine.weights)
        # vLLM, torch and transformers leave ~1M long-lived objects; a full collection walks
        # them all, a ~0.4 s pause mid-rollout that stalls every episode in flight. Freeze them
        # out of the collector after startup, as vLLM's own server and engine core do.
        # lazy: vLLM is optional and takes seconds to import
        from vllm.utils.gc_utils import freeze_gc_heap

        freeze_gc_heap()

    # --- group methods ----------------------------------------------------------------------
    @remote(Dispatch.DP_SPLIT)
    def rollout(self, batch: TensorDict, seed: int | None = None,
                greedy: bool = False) -> TensorDict:
        """Run one episode per row of ``batch`` (ROWS, UID); see the module docstring.

        ``seed`` fixes this call's sampling seeds (the trainer passes a function of the step,
        so a resumed run samples what an uninterrupted one would); ``greedy`` decodes with
        temperature 0 (validation).
        """
        return _run(self.engine, self.arollout(batch, seed=seed, greedy=greedy))

    @remote(Dispatch.ONE_TO_ALL)
    def load_weights(self, weights: Mapping[str, torch.Tensor]
                     | Iterable[tuple[str, torch.Tensor]]) -> int:
        """Push new policy weights into the engine; returns the new policy version."""
        items = weights.items() if isinstance(weights, Mapping) else weights
        return self.engine.weights.load_weights_sync(items)

    @remote(Dispatch.ONE_TO_ALL)
    def connect_weight_sync(self, master_addr: str, master_port: int, world_size: int,
                            backend: str | None = None) -> None:
        """Split pools: join the weight-sync group as rank ``1 + self.rank`` (actor rank 0 is its
        rank 0; call together with `ActorWorker.connect_weight_sync`, it is a rendezvous).
        ``backend="nccl"`` (GPU): the engine's own vLLM workers join, so pushes land on its
        device directly; otherwise a gloo group in this process."""
        if backend == "nccl":
            self.engine.weights.init_broadcast_receiver(master_addr, master_port, 1 + self.rank,
                                                world_size)
            self._nccl = True
            return
        self._sync = WeightSyncGroup(master_addr, master_port, world_size, 1 + self.rank,
                                     backend)

    @remote(Dispatch.ONE_TO_ALL)
    def receive_weights(self, checksum: bool = False,
                        metadata: list[tuple[str, str, tuple[int, ...]]] | None = None,
                        version: int | None = None, keep_inflight: bool = False) -> int:
        """Receive one push of the actor (`ActorWorker.push_weights`, called at the same time)
        into the engine, bucket by bucket; the engine's version becomes the actor's. With
        ``checksum`` the `Checksum` of the received weights is kept for
        `loaded_weights_checksum` (hashing costs a pass over the weights; gloo route only).
        The NCCL route needs the push's ``metadata`` (`ActorWorker.weight_metadata`) and
        ``version`` from the caller. ``keep_inflight``: requests in flight (the episode
        stream's) are frozen for the load and continue under the new weights. Returns the
        version."""
        if self._nccl:
            if metadata is None or version is None:
                raise ValueError("the NCCL weight sync needs the push's metadata and version")
            if checksum:
                raise ValueError("checksum=True is not available on the NCCL route (the "
                                 "weights land in vLLM's workers, not in this process)")
            self.engine.weights.receive_broadcast(metadata, keep_inflight=keep_inflight,
                                          version=int(version))
            self._loaded_checksum = None
            return int(version)
        if self._sync is None:
            raise RuntimeError("receive_weights before connect_weight_sync: no sync group")
        acc = Checksum() if checksum else None
        inspect = (lambda named: [acc.add(n, t) for n, t in named]) if acc else None
        push = self.engine.weights.begin_staged_push(keep_inflight=keep_inflight)
        try:
            got = self._sync.receive_staged(
                lambda layout, fill: push.receive(layout, fill, inspect))
        except BaseException:
            with contextlib.suppress(Exception):
                push.finish()
            raise
        # samples are tagged with the actor's version, set before held requests resume
        self.engine.weights.finish_staged_push(push, version=got)
        if version is not None and got != version:
            raise RuntimeError(f"weight sync: received version {got}, expected {version}")
        self._loaded_checksum = acc.hexdigest() if acc else None
        return got

    # --- the episode stream (trainer.mode=async, `toolrl.rollout.stream`) -------------------
    @remote(Dispatch.ALL_TO_ALL)
    def stream_submit(self, jobs: list[GroupJob]) -> int:
        """Add groups to this worker's episode stream (started at the first call); returns
        the groups it has in flight."""
        if self._stream is None:
            per_group = max(job.n for job in jobs) if jobs else 1
            self._stream = EpisodeStream(self._run_group, lambda: self.engine.weight_version,
                                         max_groups=max(1, self.config.concurrency // per_group))
        return self._stream.submit(jobs)

    @remote(Dispatch.ONE_TO_ALL)
    def stream_poll(self, wait_s: float = 0.0) -> list[FinishedGroup]:
        """The groups this worker finished since the last poll (waiting up to ``wait_s`` for
        one); raises if a group's generation raised."""
        if self._stream is None:
            return []
        return self._stream.poll(wait_s)

    @remote(Dispatch.ONE_TO_ALL)
    def stream_cancel(self, uids: list[str]) -> int:
        """Stop generating these groups (those of other workers are ignored)."""
        return self._stream.cancel(uids) if self._stream is not None else 0

    @remote(Dispatch.ONE_TO_ALL)
    def stream_stop(self) -> int:
        """Cancel every group in flight and stop the stream; returns how many there were."""
        stream, self._stream = self._stream, None
        return stream.stop() if stream is not None else 0

    @remote(Dispatch.ONE_TO_ALL)
    def last_push_pause_s(self) -> float:
        """How long the last ``keep_inflight`` push held the engine's generation."""
        return float(self.engine.weights.last_pause_s)

    async def _run_group(self, job: GroupJob) -> TensorDict:
        return await self.arollout(make_rollout_input([job.row], n=job.n, uids=[job.uid]),
                                   seed=job.seed)

    @remote(Dispatch.ONE_TO_ALL)
    def loaded_weights_checksum(self) -> str | None:
        """`Checksum` of the last weights loaded by ``receive_weights(checksum=True)``
        (None if the last push was received without it)."""
        return self._loaded_checksum

    @remote(Dispatch.ONE_TO_ALL)
    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory while a colocated actor trains (vLLM's sleep mode: KV
        cache freed, weights offloaded at level 1 or dropped at level 2); a no-op on CPU."""
        self.engine.sleep(level)

    @remote(Dispatch.ONE_TO_ALL)
    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo `sleep`: ``["weights"]`` before a weight push, ``["kv_cache"]`` after it, or
        everything (None); a no-op on CPU or when awake."""
        self.engine.wake_up(tags)

    @remote(Dispatch.ONE_TO_ALL)
    def probe(self, texts: Sequence[str], max_tokens: int, seed: int,
              temperature: float = 1.0) -> TensorDict:
        """The weight-sync canary's probe (`toolrl.weights.canary`): one user message per
        text, ``max_tokens`` tokens sampled from each (at ``temperature``, the actor's; no
        top-k / top-p; seeded, past EOS) with the engine's log-prob beside every token; a
        rollout batch the actor can score."""
        sampling = SamplingConfig(temperature=temperature, max_tokens=max_tokens,
                                  ignore_eos=True)
        prompts = [self.renderer.render_prompt([{"role": "user", "content": t}], [],
                                               exact=False)  # not trained on: any pieces
                   for t in texts]

        async def run() -> list[Any]:
            return await asyncio.gather(*(
                self.engine.generate(p, sampling.replace(seed=seed + i))
                for i, p in enumerate(prompts)))

        outs = [c[0] for c in _run(self.engine, run())]
        return B.build_rollout_batch(
            prompts, [o.token_ids for o in outs], [[1] * len(o.token_ids) for o in outs],
            self.pad_token_id, rollout_log_probs=[o.log_probs for o in outs])

    @remote(Dispatch.ONE_TO_ALL)
    def check_health(self) -> bool:
        return self.engine.is_healthy()

    @remote(Dispatch.ONE_TO_ALL)
    def policy_version(self) -> int:
        return self.engine.weight_version

    @remote(Dispatch.ONE_TO_ALL)
    def engine_pids(self) -> list[int]:
        """The processes of this worker's engine (to check that shutdown reaped them)."""
        return self.engine.engine_pids

    @remote(Dispatch.ONE_TO_ALL)
    def shutdown(self) -> None:
        """Stop the engine and its processes, and the tool servers (MCP) this worker's
        episodes shared (call before killing the group)."""
        if self._stream is not None:
            self._stream.stop()
            self._stream = None
        close_mcp_connections()
        if self.agent is not None:
            self.agent.close()
        unregister_local_engine(self.engine.weights)
        if self._sync is not None:
            self._sync.close()
            self._sync = None
        self.engine.shutdown()

    # --- the work ---------------------------------------------------------------------------
    async def arollout(self, batch: TensorDict, seed: int | None = None,
                       greedy: bool = False) -> TensorDict:
        """`rollout` as a coroutine (for callers that already run an event loop)."""
        rows = B.get_non_tensor(batch, B.ROWS)
        n = len(rows)
        uids = B.get_non_tensor(batch, B.UID) if B.UID in batch else \
            [uuid.uuid4().hex for _ in range(n)]
        self._calls += 1
        start = self.engine.weight_version  # the oldest weights this call's tokens can have
        if self.agent is not None:
            return await self.agent_rollout(rows, uids, self._seeds(n, seed), greedy, start)
        runner = self.runner
        if greedy:
            cfg = self.config.episode_config()
            cfg.sampling = cfg.sampling.replace(temperature=0.0)
            runner = type(self.runner)(self.engine, self.renderer, cfg)
        results = await self.run_episodes(rows, self._seeds(n, seed), runner=runner)
        return self.to_batch(*per_turn_rows(rows, uids, results), start_version=start)

    async def agent_rollout(self, rows: Sequence[Mapping[str, Any]], uids: Sequence[str],
                            seeds: Sequence[int | None], greedy: bool,
                            start_version: int | None = None) -> TensorDict:
        """``rollout.agent``'s episodes through the gateway; an episode whose rewritten history
        split it into several samples gives several rows of its group (`episode_rows`)."""
        temperature = 0.0 if greedy else self.config.temperature
        results = await self.agent.run_all(rows, seeds, temperature, self.config.top_p,
                                           self.config.top_k)
        return self.to_batch(*episode_rows(rows, uids, results), start_version=start_version)

    def _agent_runner(self) -> Any:
        c = self.config
        fmt = c.agent_format
        if fmt is None and c.env_id:
            env = self.make_env({})
            try:
                fmt = getattr(getattr(env.unwrapped, "parser", None), "name", None)
            finally:
                env.close()
        return AgentRunner(self.engine, self.renderer, c.agent, format=fmt or "hermes",
                           timeout_s=c.agent_timeout_s, concurrency=c.concurrency,
                           client=c.agent_client,
                           max_tokens=c.max_tokens_per_turn,
                           max_prompt_tokens=c.max_prompt_len,
                           max_response_tokens=c.max_response_len)

    async def run_episodes(self, rows: Sequence[Mapping[str, Any]],
                           seeds: Sequence[int | None],
                           runner: EpisodeRunner | None = None) -> list[Trajectory]:
        """Run one episode per row, at most ``concurrency`` at a time; results in row order."""
        sem = asyncio.Semaphore(self.config.concurrency)
        runner = runner or self.runner

        async def one(row: Mapping[str, Any], seed: int | None) -> Trajectory:
            async with sem:
                try:
                    env = self.make_env(row)
                except Exception as e:  # unknown env id, bad kwargs: this row fails
                    return runner.failed(row, seed, f"make_env: {type(e).__name__}: {e}")
                try:
                    return await runner.run(env, row, seed=seed)
                except Exception as e:  # the episode loop itself crashed: this row fails
                    logger.warning("episode %s crashed: %s", row.get("id"), e)
                    return runner.failed(row, seed, f"agent: {type(e).__name__}: {e}",
                                         infra="agent_crash")
                finally:
                    try:
                        env.close()
                    except Exception as e:  # the episode is finished: a bad close keeps it
                        logger.warning("closing the env of episode %s failed: %s",
                                       row.get("id"), e)

        return list(await asyncio.gather(*(one(r, s) for r, s in zip(rows, seeds,
                                                                       strict=True))))

    def make_env(self, row: Mapping[str, Any]) -> Any:
        """The env for one row (`row_env`)."""
        env_id, kwargs = row_env(row, self.config.env_id, self.config.env_kwargs)
        return make_env(env_id, **kwargs)

    def to_batch(self, rows: Sequence[Mapping[str, Any]], uids: Sequence[str],
                 trajs: Sequence[Trajectory], start_version: int | None = None) -> TensorDict:
        """The rollout TensorDict of a list of finished episodes. ``TOKEN_VERSIONS`` come
        from each token stream; a stream that does not record them gets ``start_version``
        (the engine's version when the episodes started; default: now) on its sampled
        tokens, the oldest weights they can come from."""
        version = self.engine.weight_version
        oldest = version if start_version is None else int(start_version)
        streams = [t.tokens for t in trajs]
        if any(s is None for s in streams):
            raise ValueError("a trajectory without its token stream cannot enter a batch")
        records = [dataclasses.replace(t, uid=uid, policy_version=version, tokens=None)
                   for uid, t in zip(uids, trajs, strict=True)]
        pad = self.config.pad_to_max
        td = B.build_rollout_batch(
            [s.prompt_ids for s in streams], [s.response_ids for s in streams],
            [s.response_mask for s in streams], self.pad_token_id,
            rollout_log_probs=[s.log_probs for s in streams],
            token_versions=[_sampled_versions(s, oldest) for s in streams],
            non_tensor={B.ROWS: [dict(r) for r in rows], B.UID: list(uids),
                        B.TRAJECTORIES: records},
            max_prompt_len=self.config.max_prompt_len if pad else None,
            max_response_len=self.config.max_response_len if pad else None)
        td.set(B.POLICY_VERSION, torch.full((len(trajs),), version, dtype=torch.long))
        return td

    def _seeds(self, n: int, seed: int | None = None) -> list[int | None]:
        """Per-episode seeds: from the call's ``seed`` when given, else the config's seed and a
        call counter; None (unseeded) when neither is set or episodes are unseeded
        (`RolloutConfig.seeded`)."""
        if not self.config.seeded:
            return [None] * n
        if seed is not None:
            base = f"call{seed}"
        elif self.config.seed is not None:
            base = f"{self.config.seed}:{self._calls}"
        else:
            return [None] * n
        return [zlib.crc32(f"{base}:{self.rank}:{i}".encode()) % (2**31 - 1) for i in range(n)]


def _sampled_versions(stream: TokenStream, oldest: int) -> list[int]:
    """The stream's per-token versions, -1 off the sampled tokens; ``oldest`` where a sampled
    token has none (a stream that does not record them)."""
    versions = stream.versions if len(stream.versions) == len(stream.response_ids) else \
        [-1] * len(stream.response_ids)
    return [(v if v >= 0 else oldest) if m else -1
            for v, m in zip(versions, stream.response_mask, strict=True)]


def rollout_metrics(td: TensorDict) -> dict[str, float]:
    """Batch means of a rollout: env reward, success, turns, tokens, finish reasons, errors;
    over episodes (an agent episode split into several rows counts once)."""
    rows = B.trajectories(td)
    trajs = one_per_episode(rows)
    n = max(len(trajs), 1)
    out = {
        "rollout/reward_mean": sum(t.env_reward for t in trajs) / n,
        "rollout/success": sum(t.success for t in trajs) / n,
        "rollout/turns_mean": sum(t.num_turns for t in trajs) / n,
        "rollout/response_len_mean": sum(t.response_tokens for t in trajs) / n,
        "rollout/sampled_tokens": float(sum(t.sampled_tokens for t in trajs)),
        "rollout/tool_errors_mean": sum(len(t.errors) for t in trajs) / n,
        "rollout/dropped_calls_mean": sum(t.dropped_calls for t in trajs) / n,
    }
    for t in trajs:
        key = f"rollout/finish_{t.finish_reason}"
        out[key] = out.get(key, 0.0) + 1.0 / n
    out.update(gateway_metrics(rows))  # rollout.agent: model calls, split samples
    return out


def _run(engine: VLLMEngine, coro: Any) -> Any:
    """Run a rollout's coroutine on the engine's event loop (`VLLMEngine.run_on_loop`)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return engine.run_on_loop(coro)
    coro.close()
    raise RuntimeError("RolloutWorker.rollout was called inside a running event loop; "
                       "await RolloutWorker.arollout instead")


__all__ = [
    "RolloutConfig",
    "RolloutWorker",
    "make_rollout_input",
    "resolve_runner",
    "rollout_metrics",
]
