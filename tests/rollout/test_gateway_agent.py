"""``rollout.agent``: a user's agent plays episodes against the gateway on a real rollout worker
(tiny vLLM engine in this process, gateway on loopback)."""

from __future__ import annotations

import json

import pytest
import torch
from engine_checks import child_pids, left_running

from tests.rollout import gateway_agents
from toolrl import batch as B
from toolrl.algo import episode_advantage, place_rewards
from toolrl.reward import build_reward
from toolrl.rollout.engine import EngineConfig
from toolrl.rollout.gateway.agent import episode_leads, resolve_agent
from toolrl.rollout.worker import RolloutConfig, RolloutWorker, make_rollout_input, rollout_metrics
from toolrl.trainer.failures import InfraFailureConfig, settle

pytestmark = pytest.mark.slow

AGENTS = "tests.rollout.gateway_agents"


def rows(n, seed=0):
    from toolrl.envs.calculator import CalculatorEnv

    return CalculatorEnv.make_tasks(n, seed=seed, difficulty=1)


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    config = RolloutConfig(
        engine=EngineConfig(model=str(tiny_model_dir), max_model_len=1024, kv_cache_gib=0.25,
                            multiprocessing=False),
        max_tokens_per_turn=96, max_prompt_tokens=512, max_total_tokens=1000,
        env_id="toolrl/Calculator-v0", concurrency=2, seed=0, agent=f"{AGENTS}:submit_once",
        agent_timeout_s=180)
    before = child_pids()
    w = RolloutWorker(config)
    yield w
    w.shutdown()
    leftover = left_running(before)
    assert not leftover, f"processes left running: {leftover}"
    assert not w.agent.server.thread.is_alive()


@pytest.fixture()
def agent_as(worker):
    original = worker.agent.agent

    def use(name, timeout_s=None):
        worker.agent.agent = resolve_agent(f"{AGENTS}:{name}")
        if timeout_s is not None:
            worker.agent.timeout_s = timeout_s

    yield use
    worker.agent.agent, worker.agent.timeout_s = original, worker.config.agent_timeout_s


def test_agent_episodes_become_a_batch_that_rewards_score(worker):
    gateway_agents.INFLIGHT["max"] = 0
    task_rows = rows(3)
    td = worker.rollout(make_rollout_input(task_rows, n=2))
    trajs = B.trajectories(td)
    assert B.batch_len(td) == 6 and B.get_non_tensor(td, B.UID)[0::2] == \
        B.get_non_tensor(td, B.UID)[1::2]
    assert gateway_agents.INFLIGHT["max"] <= worker.config.concurrency  # the config's limit
    mask, lps = td[B.RESPONSE_MASK], td[B.ROLLOUT_LOG_PROBS]
    for i, t in enumerate(trajs):
        assert t.infra_failure is None and t.finish_reason == "terminated"
        [turn] = t.turns
        [call] = turn.parse.calls
        assert call.name == "submit"
        assert json.loads(t.info["submitted"]) == call.arguments  # what the agent got back
        assert mask[i].sum() == t.sampled_tokens > 0
        # constrained decoding: vLLM reports log-probs under the grammar's mask (forced: 0)
        assert (lps[i][mask[i].bool()] <= 0).all() and (lps[i][mask[i].bool()] < 0).any()
        assert (lps[i][~mask[i].bool()] == 0).all()
        assert t.policy_version == worker.engine.weight_version
    with build_reward(["answer_match"]) as fn:
        scores = fn.score(trajs).scores
    want = [float(t.calls[0].arguments["answer"] == t.row["ground_truth"]) for t in trajs]
    assert scores == want
    metrics = rollout_metrics(td)
    assert metrics["rollout/gateway_calls_mean"] == 1.0
    assert metrics["rollout/gateway_splits"] == 0.0


def test_a_class_agent_with_two_turns_is_one_sample(worker, agent_as):
    agent_as("TwoTurns")
    td = worker.rollout(make_rollout_input(rows(2), n=1))
    for i, t in enumerate(B.trajectories(td)):
        assert t.num_turns == 2 and t.extra["gateway"]["splits"] == 0
        a, b = (turn.action_span for turn in t.turns)
        m = td[B.RESPONSE_MASK][i]
        assert m[a[0]:a[1]].all() and m[b[0]:b[1]].all() and not m[a[1]:b[0]].any()
        assert t.turns[0].observation_span == (a[1], b[0])


def test_a_rewritten_history_gives_two_rows_of_one_group_sharing_the_advantage(worker,
                                                                              agent_as):
    agent_as("summarizes")
    td = worker.rollout(make_rollout_input(rows(2), n=2))
    trajs = B.trajectories(td)
    uids = B.get_non_tensor(td, B.UID)
    assert B.batch_len(td) == 8  # 4 episodes x 2 samples
    assert [t.extra["gateway"]["sample"] for t in trajs] == [0, 1] * 4
    assert uids[0] == uids[1] == uids[2] == uids[3] != uids[4]
    metrics = rollout_metrics(td)
    assert metrics["rollout/gateway_splits"] == 4.0
    # metrics over episodes count each episode once, not once per sample (row)
    assert metrics["rollout/sampled_tokens"] == float(td[B.RESPONSE_MASK].sum())
    leads = episode_leads(trajs)
    assert leads == [1, 1, 3, 3, 5, 5, 7, 7]
    rewards = place_rewards(td[B.RESPONSE_MASK], [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    adv, _ = episode_advantage("grpo", rewards, td[B.RESPONSE_MASK], leads, uids)
    value = [float(adv[i][td[B.RESPONSE_MASK][i].bool()][0]) for i in range(8)]
    # one group of two episodes (rewards 0 and 1): each episode's samples share its advantage
    assert value[0] == value[1] < 0 < value[2] == value[3]
    assert value[0] == pytest.approx(-value[2])
    mask = td[B.RESPONSE_MASK].bool()
    assert (adv[~mask] == 0).all()


@pytest.mark.parametrize(("agent", "kind", "words"), [
    ("raises", "agent_crash", "the agent's own bug"),
    ("hangs", "agent_timeout", "agent_timeout_s=2"),
    ("never_calls", "agent_crash", "never called the model"),
])
def test_a_failing_agent_gives_an_infra_failed_episode_kept_out_of_the_loss(worker, agent_as,
                                                                            agent, kind, words):
    # only the hanging agent waits out its timeout; the others fail at once, and a short
    # timeout would also catch their first engine call when it opens a worker's module
    # (pytest-xdist: any test can come first)
    agent_as(agent, timeout_s=2 if kind == "agent_timeout" else 300)
    td = worker.rollout(make_rollout_input(rows(2), n=1))
    trajs = B.trajectories(td)
    assert [t.infra_failure for t in trajs] == [kind, kind]
    assert all(t.finish_reason == "error" and words in t.error for t in trajs)
    assert not worker.agent.gateway.episodes  # every route closed
    kept, metrics = settle(td, InfraFailureConfig(rule="drop_sample", max_fraction=1.0))
    assert kept is None and metrics[f"rollout/infra_failed/{kind}"] == 2.0


def test_greedy_rollouts_repeat(worker, agent_as):
    agent_as("TwoTurns")
    a = worker.rollout(make_rollout_input(rows(2), n=1), greedy=True)
    b = worker.rollout(make_rollout_input(rows(2), n=1), greedy=True)
    assert torch.equal(a[B.RESPONSES], b[B.RESPONSES])


def test_bad_agent_specs_fail_clearly():
    with pytest.raises(ValueError, match=r"cannot import rollout\.agent"):
        resolve_agent("tests.rollout.gateway_agents:missing")
    with pytest.raises(TypeError, match="async"):
        resolve_agent(f"{AGENTS}:not_async")
    with pytest.raises(ValueError, match=r"rollout\.agent and rollout\.runner"):
        RolloutConfig(agent=f"{AGENTS}:raises", runner="x:y")


def test_agent_configs_that_cannot_share_advantages_fail_at_load():
    from toolrl.trainer.config import ConfigError, load_config

    agent = f"rollout.agent={AGENTS}:submit_once"
    with pytest.raises(ConfigError, match="rule=refill"):
        load_config(None, [agent])
    with pytest.raises(ConfigError, match="outcome advantage"):
        load_config(None, [agent, "algorithm.advantage=gae", "algorithm.name=ppo",
                           "trainer.infra_failures.rule=drop_sample"])
    cfg = load_config(None, [agent, "trainer.infra_failures.rule=drop_sample"])
    assert cfg.rollout.agent == f"{AGENTS}:submit_once"


@pytest.mark.parametrize(("example", "client"), [("openai_agent", "openai"),
                                               ("anthropic_agent", "anthropic"),
                                               ("agents_sdk_agent", "openai")])
def test_the_example_agents_play_calculator_tasks(worker, example, client):
    """examples/openai_agent (Chat Completions), examples/anthropic_agent (the anthropic SDK on
    /v1/messages) and examples/agents_sdk_agent (the Agents SDK's default Responses model): each
    tool loop runs under rollout.agent (the random model answers in text or calls nothing it
    can finish, so each episode is judged unsolved), on its API's route."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / f"examples/{example}/calculator_agent.py"
    spec = importlib.util.spec_from_file_location(f"{example}_calculator_agent", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    original = worker.agent.agent
    worker.agent.agent, worker.agent.client_kind = resolve_agent(module.solve), client
    try:
        td = worker.rollout(make_rollout_input(rows(2), n=2))
    finally:
        worker.agent.agent, worker.agent.client_kind = original, "openai"
    api = {"openai_agent": "chat.completions", "anthropic_agent": "messages",
           "agents_sdk_agent": "responses"}[example]
    for t in B.trajectories(td):
        assert t.infra_failure is None and t.finish_reason == "terminated", t.error
        assert t.num_turns >= 1 and t.info["success"] is False
        assert t.messages[0]["role"] == "system" and t.tools
        assert set(t.extra["gateway"]["apis"]) == {api}
    assert module.run_tool("div", {"a": 6, "b": 3}) == "2"
    assert module.run_tool("div", {"a": 1, "b": 0}).startswith("error: ZeroDivisionError")


def test_an_agent_that_outgrows_the_budget_ends_with_context_not_infra(worker, agent_as):
    agent_as("chatty")
    td = worker.rollout(make_rollout_input(rows(1), n=1))
    [t] = B.trajectories(td)
    assert t.infra_failure is None and t.finish_reason == "context"
    assert "context_length_exceeded" in t.error or "maximum context length" in t.error
    assert t.num_turns >= 2 and td[B.RESPONSE_MASK].sum() == t.sampled_tokens


def test_an_openai_agents_sdk_agent_gets_tool_names_and_parse_errors_right(worker, agent_as):
    """A third-party agent framework through the gateway: the OpenAI Agents SDK sends tool
    results without ``name``, and its last reply fails to parse (cut at 4 tokens)."""
    pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents, dev extra)")
    agent_as("agents_sdk")
    td = worker.rollout(make_rollout_input(rows(2), n=1))
    for t in B.trajectories(td):
        assert t.infra_failure is None, t.error
        assert t.extra["gateway"]["splits"] == 0  # the SDK's history extends the gateway's
        first, second = t.turns
        assert [c.name for c in first.parse.calls] == ["add"]
        assert [r.name for r in first.results] == ["add"]  # not the call id
        assert second.finish_reason == "length" and second.parse.errors
        assert [e["type"] for e in t.errors] == ["parse_error"] * len(second.parse.errors)
    assert rollout_metrics(td)["rollout/tool_errors_mean"] == \
        sum(len(t.errors) for t in B.trajectories(td)) / 2 >= 1


@pytest.fixture()
def anthropic_client(worker):
    worker.agent.client_kind = "anthropic"
    yield
    worker.agent.client_kind = "openai"


@pytest.mark.parametrize("agent", ["responses_tool_loop", "anthropic_tool_loop",
                                   "agents_sdk_responses"])
def test_agents_on_the_responses_and_messages_apis_play_calculator_tool_loops(
        worker, agent_as, agent, request):
    """The openai client on /v1/responses (previous_response_id, a streamed last call), the
    anthropic client on /v1/messages (tool_use / tool_result, streamed) and the OpenAI Agents
    SDK on its default Responses model (it runs the tool; its last run streamed): each call
    after the first extends the sample, the tool result is the turn's, named by its call."""
    if agent == "anthropic_tool_loop":
        request.getfixturevalue("anthropic_client")
    if agent == "agents_sdk_responses":
        pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents, dev extra)")
    agent_as(agent)
    td = worker.rollout(make_rollout_input(rows(2), n=1))
    trajs = B.trajectories(td)
    for i, t in enumerate(trajs):
        assert t.infra_failure is None, t.error
        assert t.num_turns == 2 and t.extra["gateway"]["splits"] == 0
        api = "messages" if agent == "anthropic_tool_loop" else "responses"
        assert t.extra["gateway"]["apis"] == [api, api]
        first, second = t.turns
        assert [c.name for c in first.parse.calls] == ["add"]
        assert [r.name for r in first.results] == ["add"]
        assert first.results[0].content == str(sum(first.parse.calls[0].arguments.values()))
        assert [c.name for c in second.parse.calls] == ["submit"]
        m = td[B.RESPONSE_MASK][i]
        a, b = first.action_span, second.action_span
        assert m[a[0]:a[1]].all() and m[b[0]:b[1]].all() and not m[a[1]:b[0]].any()
    if agent != "agents_sdk_responses":
        assert [t.info["answer"] for t in trajs] == \
            [t.turns[1].parse.calls[0].arguments["answer"] for t in trajs]
    assert not worker.agent.gateway.episodes
