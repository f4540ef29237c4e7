"""toolrl/Tau2-v0: a tau2-bench domain (airline, retail, telecom, mock) as a `ToolEnv`.

Everything domain-specific is tau2's own code, imported, not copied:

- the task rows are tau2's tasks and splits (``registry.get_tasks_loader(domain)``,
  ``get_task_splits_loader``); a row is ``{"id", "domain", "category"}`` and the env looks the
  task up by id (a row may carry the whole task as ``"task"``, tau2's JSON);
- the system prompt is tau2's agent prompt with the domain's policy (``LLMAgent.system_prompt``;
  ``LLMSoloAgent.system_prompt``, which adds the ticket, in solo mode);
- the tools are tau2's tools for the domain, with tau2's schemas, executed by tau2's domain
  ``Environment.get_response`` against its database (arguments are checked by tau2's tools, as
  in tau2: a bad call is tau2's ``"Error: ..."`` tool message, not a toolrl validation error);
- the user is a tau2 ``BaseUser`` (`toolrl.envs.tau2.users`): scripted, solo, an LLM on an
  OpenAI-compatible endpoint, or the rollout's own engine (``user="engine"``);
- turn order and termination follow tau2's ``Orchestrator``: the greeting
  ``DEFAULT_FIRST_AGENT_MESSAGE``, user turns (and the user's own tool calls, telecom's dual
  control) until the user speaks to the agent, ``###STOP###`` / transfer / out-of-scope from
  the user, a user message with neither text nor a call (``USER_ERROR``, tau2's
  communication check), ``###STOP###`` from the agent (in solo mode only the ``done`` tool:
  a solo agent's text is an agent error, as tau2's ``LLMSoloAgent`` raises on it),
  ``max_steps``
  counted as the orchestrator counts them (one per agent, user and environment message),
  ``max_errors`` tool errors;
- tau2's domain databases are loaded once a process and copied per environment (the
  episode's and the evaluator's two; `toolrl.envs.tau2.domain_cache`), equal by tau2's
  hash, and the agent's tools are built once a domain;
- the reward is ``tau2.evaluator.evaluator.evaluate_simulation`` on a tau2 ``SimulationRun``
  holding the episode's tau2 messages and termination reason (evaluation type ``ALL``:
  env/DB, action and communicate checks as the task's ``reward_basis`` says). NL assertions are
  left out (tau2 judges them with an LLM; no task of the four domains has them in its
  ``reward_basis``). ``success`` is reward == 1.0. The per-check breakdown
  (``reward_breakdown``: DB, ENV_ASSERTION, ACTION, COMMUNICATE) and the termination reason are
  in the final info under ``"tau2"`` and in ``state_snapshot()``.

The oracle (`oracle_action`) replays the task's gold actions (one call per turn), then says the
task's ``communicate_info``; in solo mode it ends with the ``done`` tool.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import random
import uuid
from collections.abc import Mapping
from typing import Any

from tau2.agent.llm_agent import LLMAgent, LLMSoloAgent
from tau2.data_model.message import (
    AssistantMessage,
    MultiToolMessage,
    ToolMessage,
    UserMessage,
)
from tau2.data_model.message import ToolCall as Tau2Call
from tau2.data_model.simulation import RewardInfo, SimulationRun, TerminationReason
from tau2.data_model.tasks import Task
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE
from tau2.registry import registry
from tau2.user.base import is_valid_user_history_message
from tau2.user.user_simulator import UserSimulator

from toolrl import ParseResult, Tool, ToolCall, ToolEnv, ToolResult, Turn

from .domain_cache import agent_tools, collector_paused, evaluation_domain, make_environment
from .reference import gold_script
from .users import USER_KINDS, make_user

DOMAINS = ("airline", "retail", "telecom", "mock")
SPLITS = ("train", "test", "all")
# toolrl's split names (the trainer asks for train / val / warm_start rows) -> tau2's
_SPLIT_OF = {"train": "train", "warm_start": "train", "test": "test", "val": "test",
             "all": "all"}
SOLO_DOMAINS = ("telecom", "mock")


def check_domain(domain: str) -> str:
    if domain not in DOMAINS:
        raise ValueError(f"tau2 has no domain {domain!r}; valid: {', '.join(DOMAINS)}")
    return domain


@functools.cache
def domain_tasks(domain: str) -> dict[str, Task]:
    """Every task of the domain's task file, by id (telecom: all 2,285)."""
    tasks = registry.get_tasks_loader(check_domain(domain))(None)
    return {t.id: t for t in tasks}


@functools.cache
def split_ids(domain: str, split: str) -> tuple[str, ...]:
    """Task ids of a split (``all``: the whole file). A domain without tau2 splits (mock) has
    only ``all``: its train and test are the same tasks."""
    tau2_split = _SPLIT_OF.get(split)
    if tau2_split is None:
        raise ValueError(f"unknown tau2 split {split!r}; valid: {', '.join(SPLITS)}")
    ids = tuple(domain_tasks(domain))
    if tau2_split == "all" or domain not in registry._task_splits:
        return ids
    splits = registry.get_task_splits_loader(domain)()
    return tuple(i for i in splits[tau2_split] if i in domain_tasks(domain))


def get_task(domain: str, task_id: str) -> Task:
    tasks = domain_tasks(domain)
    if task_id not in tasks:
        raise ValueError(f"tau2 domain {domain!r} has no task {task_id!r} ({len(tasks)} tasks, "
                         f"e.g. {next(iter(tasks))!r})")
    return tasks[task_id]


def check_user_settings(user: str, *, user_model: str | None, user_base_url: str | None,
                        user_api_key: str | None, user_llm_args: Any) -> None:
    """The user settings fail when the env is made, not at its first reset: ``user='llm'``
    needs ``user_model``; the endpoint settings are the ``llm`` user's only, the sampling
    settings the ``llm`` and ``engine`` users' (a setting no user reads is an error)."""
    if user == "llm" and not user_model:
        raise ValueError("tau2 user='llm' needs user_model (a litellm model name, e.g. "
                         "'openai/Qwen3-8B' with user_base_url for an OpenAI-compatible "
                         "endpoint)")
    unused = [k for k, v in (("user_model", user_model), ("user_base_url", user_base_url),
                             ("user_api_key", user_api_key)) if v is not None and user != "llm"]
    if user_llm_args is not None and user not in ("llm", "engine"):
        unused.append("user_llm_args")
    if unused:
        raise ValueError(f"tau2 {', '.join(unused)} set but user={user!r} does not use "
                         f"{'it' if len(unused) == 1 else 'them'} (user_model, user_base_url, "
                         f"user_api_key: user='llm'; user_llm_args: 'llm' or 'engine')")
    if user_llm_args is not None and not isinstance(user_llm_args, Mapping):
        raise ValueError(f"tau2 user_llm_args must be a mapping of sampling settings "
                         f"(temperature, max_tokens, ...), got {user_llm_args!r}")


def _now() -> str:
    return datetime.datetime.now().isoformat()


class _Tau2Tool(Tool):
    """A tau2 tool offered with tau2's schema; its arguments are checked by tau2's tool itself
    (as in tau2), so toolrl's schema validation only requires a JSON object."""

    def validate(self, arguments: Any) -> dict[str, Any] | None:
        if isinstance(arguments, dict):
            return None
        return super().validate(arguments)


class Tau2Env(ToolEnv):
    """A tau2 task: tau2's tools, policy, user, turn order and evaluator (module docstring).

    Args:
        domain: airline | retail | telecom | mock.
        split: train | test | all: the tasks a bare ``reset()`` draws from.
        user: scripted | solo | llm | engine (`toolrl.envs.tau2.users`); solo needs a domain
            where tau2 defines it (telecom, mock) and a task with a ticket; engine: the
            rollout's engine (``rollout_model``) is the user; outside a rollout (the trainer's
            prompt-budget check, the dry run, check-env, the warm start's oracle) there is no
            engine and the scripted user stands in (``tau2_summary()["user"]`` says which).
        user_model, user_base_url, user_api_key: the ``llm`` user (litellm).
        user_llm_args: the ``llm`` and ``engine`` users' sampling (``temperature``,
            ``max_tokens``, ...; tau2's default: temperature 0.0).
        max_steps, max_errors: tau2's orchestrator limits (defaults as in tau2).
        max_calls_per_turn: default none: every call of a message runs, as in tau2 (a cap
            drops the calls past it, counted; `toolrl.core.env.ToolEnv`).

    Every setting is checked here: a bad one fails when the env is made, not at reset.
    """

    default_max_turns = 100
    default_max_output_chars = 1 << 20  # tau2 shows tool outputs whole
    default_max_calls_per_turn = None  # tau2 runs every call of a message
    blocking_step = True  # tau2's tools, user and evaluator are sync code
    # tau2's databases loaded once a process and copied per environment (`.domain_cache`);
    # False: loaded from their files each time, as tau2 does (benchmarks compare the two)
    copy_databases: bool = True

    def __init__(self, *, domain: str = "mock", split: str = "train", user: str = "scripted",
                 user_model: str | None = None, user_base_url: str | None = None,
                 user_api_key: str | None = None, user_llm_args: dict[str, Any] | None = None,
                 max_steps: int = 100, max_errors: int = 10, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.domain = check_domain(domain)
        if user not in USER_KINDS:
            raise ValueError(f"unknown tau2 user {user!r}; valid: {', '.join(USER_KINDS)}")
        if user == "solo" and domain not in SOLO_DOMAINS:
            raise ValueError(f"tau2 defines solo mode for {', '.join(SOLO_DOMAINS)} only, "
                             f"not {domain!r}")
        self.split = split
        split_ids(domain, split)  # an unknown split fails here
        check_user_settings(user, user_model=user_model, user_base_url=user_base_url,
                            user_api_key=user_api_key, user_llm_args=user_llm_args)
        for name, value in (("max_steps", max_steps), ("max_errors", max_errors)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"tau2 {name} must be a positive integer (as tau2's run_task "
                                 f"requires), got {value!r}")
        self.user_kind = user
        self.solo = user == "solo"
        self.user_options = {"model": user_model, "base_url": user_base_url,
                             "api_key": user_api_key, "llm_args": user_llm_args}
        self.max_steps = max_steps
        self.max_errors = max_errors
        # rows of this env's domain (check-env and a bare reset call it on the instance)
        self.make_tasks = functools.partial(type(self).make_tasks, domain=domain,
                                            solo=self.solo)
        self.task: Task | None = None
        self.reward_info: RewardInfo | None = None

    # --- task rows -------------------------------------------------------------------------
    @classmethod
    def make_tasks(cls, n: int, seed: int = 0, split: str = "train", domain: str = "mock",
                   solo: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
        """``n`` rows of the split's tasks, shuffled by ``seed`` (cycled when ``n`` exceeds the
        split; ``n <= 0``: every task once, in file order). ``solo``: only tasks with a ticket
        (tau2's ``LLMSoloAgent.check_valid_task``)."""
        ids = list(split_ids(check_domain(domain), split))
        if solo:
            tasks = domain_tasks(domain)
            ids = [i for i in ids if LLMSoloAgent.check_valid_task(tasks[i])]
        if n <= 0:
            order = ids
        else:
            rng = random.Random(f"tau2:{domain}:{split}:{seed}")
            order = []
            while len(order) < n:
                block = list(ids)
                rng.shuffle(block)
                order.extend(block)
            order = order[:n]
        return [{"id": i, "domain": domain, "category": domain} for i in order]

    @classmethod
    def eval_metrics(cls, trajectories: Any) -> dict[str, Any] | None:
        """tau2's pass^1..4 per domain (`toolrl.envs.tau2.pass_k`), infrastructure failures
        left out and counted."""
        from .pass_k import pass_k

        return pass_k(trajectories) or None

    def sample_task(self) -> dict[str, Any]:
        return self.make_tasks(1, seed=int(self.np_random.integers(2**31 - 1)),
                               split=self.split)[0]

    # --- episode ---------------------------------------------------------------------------
    def setup(self, row: dict[str, Any]) -> None:
        domain = row.get("domain", self.domain)
        if domain != self.domain:
            raise ValueError(f"a {domain!r} task row in a {self.domain!r} Tau2 env")
        if "task" in row:
            self.task = Task.model_validate(row["task"])
        else:
            self.task = get_task(self.domain, str(row["id"]))
        task = self.task
        if self.solo and not LLMSoloAgent.check_valid_task(task):
            raise ValueError(f"tau2 task {task.id!r} has no solo form (no ticket)")
        if self.copy_databases:  # (`.domain_cache`)
            self.environment = make_environment(self.domain, self.solo)
            cached = agent_tools(self.domain, self.solo)
            tools = [t for t, _ in cached]
            self._schemas = {t.name: schema for t, schema in cached}
        else:  # as tau2's run_task builds them
            self.environment = registry.get_env_constructor(self.domain)(solo_mode=self.solo)
            user_tools = (self.environment.get_user_tools() if self.solo and
                          self.environment.user_tools is not None else [])
            tools = self.environment.get_tools() + user_tools
            self._schemas = {}
        policy = self.environment.get_policy()
        self.agent = LLMSoloAgent(tools=tools, domain_policy=policy, task=task) if self.solo \
            else LLMAgent(tools=tools, domain_policy=policy)
        self.user_used = self.user_kind
        if self.user_kind == "engine" and self.rollout_model is None:
            self.user_used = "scripted"  # outside a rollout: no engine to speak for the user
        self.user = make_user(self.user_used, task, self.environment, **self.user_options,
                              engine=self.rollout_model, parser=self.parser)
        initial = task.initial_state
        history = copy.deepcopy(initial.message_history or []) if initial else []
        self.environment.set_state(  # as Orchestrator.initialize
            initialization_data=initial.initialization_data if initial else None,
            initialization_actions=initial.initialization_actions if initial else None,
            message_history=history)
        self.trajectory: list[Any] = history
        self.step_count = 0
        self.num_errors = 0
        self.termination: TerminationReason | None = None
        self.reward_info = None
        self.eval_error: str | None = None
        self.start_time = _now()
        self._pending: list[tuple[Tau2Call, ToolMessage]] = []
        self._to_user: Any = None
        self.user_state = None
        if self.solo:
            self.user_state = self.user.get_init_state()
        elif not history:
            greeting = copy.deepcopy(DEFAULT_FIRST_AGENT_MESSAGE)
            self.trajectory = [greeting]
            self.user_state = self.user.get_init_state()
            self._to_user = greeting
        else:  # continue where the task's history stops (as Orchestrator.initialize)
            last = history[-1]
            valid = [m for m in history if is_valid_user_history_message(m)]
            if isinstance(last, AssistantMessage) and not last.is_tool_call():
                self.user_state = self.user.get_init_state(message_history=valid[:-1])
                self._to_user = last
            elif (isinstance(last, UserMessage) and not last.is_tool_call()) or (isinstance(
                    last, ToolMessage) and last.requestor == "assistant"):
                self.user_state = self.user.get_init_state(message_history=valid)
            else:
                raise ValueError(f"tau2 task {task.id!r}: a message history ending in "
                                 f"{type(last).__name__} is not supported")
        for m in history:
            m.turn_idx = None

    def initial_messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        messages = [{"role": "system", "content": self.agent.system_prompt}]
        messages.extend(self._chat(m) for m in self.trajectory)
        if self._to_user is not None:  # the user opens (after tau2's greeting)
            messages.extend(self._user_turn(self._to_user))
            self._to_user = None
        return messages

    def _chat(self, message: Any) -> dict[str, Any]:
        """A tau2 message as the agent's chat message."""
        if isinstance(message, ToolMessage):
            names = {c.id: c.name for m in self.trajectory
                     for c in getattr(m, "tool_calls", None) or []}
            return {"role": "tool", "name": names.get(message.id, "tool"),
                    "content": message.content or ""}
        if isinstance(message, AssistantMessage):
            calls = [ToolCall(c.name, c.arguments, c.id) for c in message.tool_calls or []]
            text = message.content or ""
            return {"role": "assistant",
                    "content": self.render_calls(calls, text) if calls else text}
        return {"role": "user", "content": message.content or ""}

    def episode_tools(self) -> list[Tool]:
        return [_Tau2Tool.from_schema(copy.deepcopy(self._schemas[t.name]) if t.name in
                                      self._schemas else t.openai_schema,
                                      fn=self._executor(t.name), inline=True)
                for t in self.agent.tools]

    def _executor(self, name: str) -> Any:
        def run(**arguments: Any) -> str:
            call = Tau2Call(id=f"call_{self.turn}_{len(self._pending)}", name=name,
                            arguments=arguments, requestor="assistant")
            if name == getattr(self.agent, "STOP_FUNCTION_NAME", None) and self.solo:
                self._pending.append((call, None))  # tau2 turns the message into a stop
                return self.agent.STOP_TOKEN
            response = self.environment.get_response(call)
            self._pending.append((call, response))
            return response.content or ""
        return run

    # --- tau2's turn order -----------------------------------------------------------------
    def _check_limits(self, to_env: bool) -> None:
        """Orchestrator.run's checks after a step (skipped while a message goes to the env)."""
        if to_env:
            return
        if self.step_count >= self.max_steps:
            self.termination = TerminationReason.MAX_STEPS
        if self.num_errors >= self.max_errors:
            self.termination = TerminationReason.TOO_MANY_ERRORS

    def _env_step(self, message: Any) -> Any:
        """The orchestrator's AGENT/USER -> ENV step for a message whose calls already ran."""
        responses = [r for _, r in self._pending] if message.role == "assistant" else [
            self.environment.get_response(c) for c in message.tool_calls]
        self.num_errors += sum(r.error for r in responses)
        self.trajectory.extend(responses)
        self.step_count += 1
        self._check_limits(False)
        return MultiToolMessage(role="tool", tool_messages=responses) \
            if len(responses) > 1 else responses[0]

    def _user_turn(self, message: Any) -> list[dict[str, Any]]:
        """User steps (and the user's tool calls) until the user speaks to the agent or stops."""
        out = []
        while self.termination is None:
            user_msg, self.user_state = self.user.generate_next_message(message,
                                                                        self.user_state)
            if not user_msg.has_text_content() and not user_msg.is_tool_call():
                # tau2's communication check: a user error ends the conversation
                self.trajectory.append(user_msg)
                self.step_count += 1
                self.termination = TerminationReason.USER_ERROR
                return out
            stop = UserSimulator.is_stop(user_msg)  # as the orchestrator checks it
            self.trajectory.append(user_msg)
            self.step_count += 1
            if stop:
                self.termination = TerminationReason.USER_STOP
            self._check_limits(user_msg.is_tool_call())
            if not user_msg.is_tool_call():
                out.append({"role": "user", "content": user_msg.content or ""})
                return out
            message = self._env_step(user_msg)
        return out

    def on_turn(self, parse: ParseResult, results: list[ToolResult]) -> Turn:
        if self.termination is not None:  # tau2 ended the conversation before this turn (the
            self._pending = []            # user stopped at once): the turn is not part of it
            return Turn(terminated=True)
        ran = self._pending
        calls: list[Tau2Call] = []
        responses: list[ToolMessage | None] = []
        for i, call in enumerate(parse.calls):
            if ran and ran[0][0].name == call.name and ran[0][0].arguments == call.arguments:
                tau2_call, response = ran.pop(0)
            else:  # not run by toolrl (an unknown tool): tau2's environment answers
                tau2_call = Tau2Call(id=f"call_{self.turn}_x{i}", name=call.name,
                                     arguments=call.arguments if isinstance(
                                         call.arguments, dict) else {}, requestor="assistant")
                response = self.environment.get_response(tau2_call)
            calls.append(tau2_call)
            responses.append(response)
        self._pending = []
        # the message tau2 would hold: its text and calls (no calls: the whole message is
        # text for the user, a malformed call included, as tau2's litellm client would give it)
        text = (parse.text if calls else self.messages[-1]["content"]).strip()
        message = AssistantMessage(role="assistant", content=text or None,
                                   tool_calls=calls or None)
        if self.solo and not calls:
            # tau2's LLMSoloAgent asks its model for tool calls only and raises on any other
            # reply ("LLMSoloAgent only supports tool calls"; its run_tasks scores the sample
            # 0.0, an agent error): a plain ###STOP### is no stop here, only the `done` tool
            self.trajectory.append(message)
            self.termination = TerminationReason.AGENT_ERROR
            return Turn(terminated=True)
        if self.solo:
            message = self.agent._check_if_stop_toolcall(message)  # tau2's `done` handling
        if not message.has_text_content() and not message.is_tool_call():
            # an empty message: tau2's orchestrator raises on it (validate); an agent error
            self.trajectory.append(AssistantMessage(role="assistant", content=""))
            self.termination = TerminationReason.AGENT_ERROR
            return Turn(terminated=True)
        self.trajectory.append(message)
        self.step_count += 1
        stop = self.agent.is_stop(message)
        if stop:
            self.termination = TerminationReason.AGENT_STOP
        if message.is_tool_call():
            if stop:  # tau2's orchestrator fails here (the env would get the last message)
                self.termination = TerminationReason.AGENT_ERROR
                return Turn(terminated=True)
            self._pending = list(zip(calls, responses, strict=True))
            self._env_step(message)
            self._pending = []
            return Turn(terminated=self.termination is not None)
        self._check_limits(False)
        if self.termination is not None:
            return Turn(terminated=True)
        observation = self._user_turn(message)
        return Turn(messages=observation, terminated=self.termination is not None)

    # --- tau2's evaluation -----------------------------------------------------------------
    def simulation_run(self) -> SimulationRun:
        """The episode as a tau2 ``SimulationRun`` (cut episodes count as ``max_steps``)."""
        messages = copy.deepcopy(self.trajectory)
        for i, m in enumerate(messages):
            m.turn_idx = i
        return SimulationRun(id=str(uuid.uuid4()), task_id=self.task.id,
                             start_time=self.start_time, end_time=_now(), duration=0.0,
                             termination_reason=self.termination or TerminationReason.MAX_STEPS,
                             messages=messages)

    def evaluate(self) -> bool:
        """tau2's evaluate_simulation. Where it raises (e.g. an env assertion about a record
        the episode never created), the episode scores 0.0, as tau2's ``run_tasks`` scores a
        failed sample with ``skip_failed_samples``; the error is in the ``tau2`` info."""
        self.eval_error = None
        paused = collector_paused() if self.copy_databases else contextlib.nullcontext()
        try:
            with paused:  # two database copies hashed and replayed on (domain_cache)
                self.reward_info = evaluate_simulation(
                    simulation=self.simulation_run(), task=self.task,
                    evaluation_type=EvaluationType.ALL, solo_mode=self.solo,
                    domain=evaluation_domain(self.domain) if self.copy_databases
                    else self.domain)
        except Exception as exc:
            self.reward_info = RewardInfo(reward=0.0)
            self.eval_error = f"{type(exc).__name__}: {exc}"
        return self.reward_info.reward == 1.0

    def outcome_reward(self, success: bool) -> float:
        return float(self.reward_info.reward) if self.reward_info is not None else 0.0

    async def end_episode(self, reason: str) -> dict[str, Any]:
        end = await super().end_episode(reason)
        end["tau2"] = self.tau2_summary()
        return end

    def tau2_summary(self) -> dict[str, Any]:
        info = self.reward_info
        return {"task_id": self.task.id if self.task else None, "domain": self.domain,
                "user": getattr(self, "user_used", self.user_kind),
                "termination_reason": (self.termination or TerminationReason.MAX_STEPS).value,
                "reward": None if info is None else float(info.reward),
                "reward_breakdown": {} if info is None or not info.reward_breakdown else
                {getattr(k, "value", str(k)): float(v)
                 for k, v in info.reward_breakdown.items()},
                "error": getattr(self, "eval_error", None),
                **({"user_model": self.rollout_model.usage()}
                   if getattr(self, "user_used", None) == "engine"
                   and hasattr(self.rollout_model, "usage") else {})}

    def state_snapshot(self) -> dict[str, Any]:
        return self.tau2_summary() if self.task is not None else {}

    # --- the oracle ------------------------------------------------------------------------
    def oracle_action(self) -> str:
        """The task's gold actions, one call a turn, then its communicate info (solo: the
        ``done`` tool), as `toolrl.envs.tau2.reference.gold_script` writes them."""
        script = gold_script(self.task, solo=self.solo)
        step = script[min(self.turn, len(script) - 1)]
        if isinstance(step, str):
            return step
        return self.render_calls([ToolCall(name, args) for name, args in step])
