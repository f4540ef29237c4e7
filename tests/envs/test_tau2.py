"""toolrl/Tau2-v0: tau2's domains, scored exactly as tau2 scores them (a CI sample; the full
set is benchmarks/bench_tau2.py). No test reaches the network: the users are the scripted one
and solo mode, and litellm is told to use its bundled price table."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

pytest.importorskip("tau2", reason="the tau2 extra is not installed")

from tau2.data_model.tasks import RewardType
from toolrl.envs.tau2.env import domain_tasks, split_ids
from toolrl.envs.tau2.reference import (
    argument_pool,
    env_episode,
    gold_script,
    tau2_reward,
    variants,
)

from toolrl import make_env
from toolrl.core.checks import check_tool_env
from toolrl.core.env import run_episode

ENV = "toolrl/Tau2-v0"


def tau2_outcome(domain, task, script, solo, **limits):
    try:
        return tau2_reward(domain, task, script, solo=solo, **limits).reward
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def env_outcome(traj):
    return traj.info["tau2"]["error"] or traj.info["tau2"]["reward"]


def sample_rows(env, n, seed=0):
    rows = env.unwrapped.make_tasks(0, split="all")
    return rows if len(rows) <= n else random.Random(seed).sample(rows, n)


def test_offline_and_task_files():
    assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == "True"
    assert len(domain_tasks("airline")) == 50 and len(domain_tasks("retail")) == 114
    assert len(domain_tasks("telecom")) == 2285 and len(domain_tasks("mock")) == 9
    assert (len(split_ids("airline", "train")), len(split_ids("airline", "test"))) == (30, 20)
    assert len(split_ids("retail", "val")) == 40  # toolrl's val rows are tau2's test split
    rows = make_env(ENV, domain="retail").unwrapped.make_tasks(200, seed=3)
    assert {r["id"] for r in rows} == set(split_ids("retail", "train"))  # cycled
    assert rows == make_env(ENV, domain="retail").unwrapped.make_tasks(200, seed=3)


@pytest.mark.parametrize("kwargs, match", [
    ({"domain": "banking"}, "tau2 has no domain 'banking'; valid: airline, retail"),
    ({"domain": "airline", "user": "solo"}, "solo mode for telecom, mock only"),
    ({"user": "robot"}, "unknown tau2 user 'robot'"),
    ({"split": "dev"}, "unknown tau2 split 'dev'"),
    ({"user": "llm"}, "user='llm' needs user_model"),  # at make_env, not at reset
    ({"user_model": "openai/x"}, "user_model set but user='scripted' does not use it"),
    ({"user": "engine", "user_base_url": "http://h/v1", "user_api_key": "k"},
     "user_base_url, user_api_key set but user='engine' does not use them"),
    ({"user": "solo", "domain": "telecom", "user_llm_args": {"temperature": 1}},
     "user_llm_args set but user='solo'"),
    ({"user": "engine", "user_llm_args": 0.5}, "user_llm_args must be a mapping"),
    ({"max_steps": 0}, "max_steps must be a positive integer"),
    ({"max_errors": "3"}, "max_errors must be a positive integer"),
])
def test_bad_configuration_is_one_clear_line(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        make_env(ENV, **kwargs)
    assert "\n" not in str(err.value)


def test_unknown_task_id_is_one_clear_line():
    env = make_env(ENV, domain="airline")
    with pytest.raises(ValueError, match="tau2 domain 'airline' has no task 'nope'") as err:
        env.reset(options={"id": "nope", "domain": "airline"})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="a 'retail' task row in a 'airline' Tau2 env"):
        env.reset(options={"id": "0", "domain": "retail"})


def test_prompt_tools_and_breakdown_are_tau2s():
    env = make_env(ENV, domain="mock")
    row = {"id": "create_task_1", "domain": "mock"}
    messages, info = env.reset(options=row)
    base = env.unwrapped
    assert base.environment.get_policy() in messages[0]["content"]
    assert messages[1] == {"role": "assistant", "content": "Hi! How can I help you today?"}
    assert messages[2]["role"] == "user" and "Important Meeting" in messages[2]["content"]
    assert sorted(t["function"]["name"] for t in info["tools"]) == sorted(
        t.name for t in base.environment.get_tools())
    traj = asyncio.run(run_episode(env, row=row))
    assert traj.success and traj.info["tau2"]["reward_breakdown"] == {"DB": 1.0,
                                                                      "COMMUNICATE": 1.0}
    assert traj.info["tau2"]["termination_reason"] == "user_stop"
    assert traj.final_state["reward"] == 1.0
    row = {"id": "update_task_with_initialization_data", "domain": "mock"}  # has info to say
    env.reset(options=row)
    silent = env_episode(env, row, [*gold_script(base.task)[:-1], "Done."])
    assert silent.info["tau2"]["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 0.0}
    assert silent.turns[-1].env_reward == 0.0 and not silent.success


# tasks whose gold actions tau2 itself scores below 1.0 (benchmarks/bench_tau2.py shows why)
NO_GOLD_SOLUTION = {("mock", "scripted"): {"update_task_with_history_and_env_assertions"},
                    ("mock", "solo"): {"update_task_with_initialization_data"}}


@pytest.mark.parametrize("domain, user, n", [
    ("mock", "scripted", 9), ("mock", "solo", 9), ("telecom", "solo", 6),
    ("telecom", "scripted", 8), ("retail", "scripted", 2), ("airline", "scripted", 1)])
def test_oracle_solves_every_task_as_tau2_scores_it(domain, user, n):
    """A sample here; every task of every domain in benchmarks/bench_tau2.py."""
    solo = user == "solo"
    env = make_env(ENV, domain=domain, user=user)
    rows = sample_rows(env, n)
    if domain == "telecom":  # the default seed's task, which check-env plays, included
        rows.append(env.unwrapped.make_tasks(1, seed=0)[0])
    for row in rows:
        task = domain_tasks(domain)[row["id"]]
        ref = tau2_outcome(domain, task, gold_script(task, solo=solo), solo)
        got = env_outcome(asyncio.run(run_episode(env, row=row)))
        solved = 0.0 if row["id"] in NO_GOLD_SOLUTION.get((domain, user), ()) else 1.0
        assert got == ref == solved, row["id"]


def test_tasks_without_a_gold_solution_are_tau2s():
    """mock's two exceptions: one lists no gold actions (its success is an env assertion a
    two-step script meets, in tau2 and in the env alike); in solo mode the other's
    communicate info can never be said (a solo agent sends only tool calls; ``done`` becomes
    the bare ``###STOP###``)."""
    task = domain_tasks("mock")["update_task_with_history_and_env_assertions"]
    assert not task.evaluation_criteria.actions
    script = [[("update_task_status", {"task_id": "task_2", "status": "completed"})], "Done."]
    env = make_env(ENV, domain="mock")
    row = {"id": task.id, "domain": "mock"}
    assert env_outcome(env_episode(env, row, script)) == tau2_outcome(
        "mock", task, script, False) == 1.0
    task = domain_tasks("mock")["update_task_with_initialization_data"]
    solo = make_env(ENV, domain="mock", user="solo")
    traj = asyncio.run(run_episode(solo, row={"id": task.id, "domain": "mock"}))
    assert traj.info["tau2"]["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 0.0}
    assert tau2_reward("mock", task, gold_script(task, solo=True), solo=True
                       ).reward_breakdown[RewardType.COMMUNICATE] == 0.0


def test_scripted_user_makes_the_calls_the_agent_asks_for():
    from tau2.registry import registry
    from toolrl.envs.tau2.users import requested_calls

    tools = {t.name for t in registry.get_env_constructor("telecom")().get_user_tools()}
    text = ('First toggle_data_saver_mode(), then grant_app_permission(app_name="messaging", '
            "permission='sms'), set_network_mode_preference(mode=4g_5g_preferred) and "
            "toggle_data(). Not: my_toggle_data(), refuel_data(amount=2), toggle_wifi(x")
    assert requested_calls(text, tools) == [
        ("toggle_data_saver_mode", {}),
        ("grant_app_permission", {"app_name": "messaging", "permission": "sms"}),
        ("set_network_mode_preference", {"mode": "4g_5g_preferred"}),  # tau2's func format
        ("toggle_data", {})]
    assert requested_calls("toggle_data()", {}) == []
    assert requested_calls("reboot_device(now)", tools) == []  # no key=value: not made
    # an episode: the user's calls run on the phone; a wrong instruction is followed as given
    env = make_env(ENV, domain="telecom")
    row = env.unwrapped.make_tasks(1, seed=0)[0]
    task = domain_tasks("telecom")[row["id"]]
    gold = gold_script(task)
    assert any(isinstance(s, str) and "on your phone" in s for s in gold[:-1])
    traj = env_episode(env, row, gold)
    kinds = [type(m).__name__ for m in env.unwrapped.trajectory]
    assert "ToolMessage" in kinds and any(getattr(m, "requestor", None) == "user" and
                                          m.role == "tool" for m in env.unwrapped.trajectory)
    assert traj.success and traj.info["tau2"]["termination_reason"] == "user_stop"
    wrong = [s.replace("toggle_", "toggle_wifi_calling() and toggle_", 1)
             if isinstance(s, str) else s for s in gold]
    assert env_outcome(env_episode(env, row, wrong)) == tau2_outcome(
        "telecom", task, wrong, False)


@pytest.mark.parametrize("domain, user, n", [
    ("mock", "scripted", 9), ("mock", "solo", 9), ("telecom", "solo", 4),
    ("telecom", "scripted", 3), ("retail", "scripted", 1)])
def test_reward_equals_tau2_evaluate_simulation(domain, user, n):
    solo = user == "solo"
    env = make_env(ENV, domain=domain, user=user)
    rows = sample_rows(env, n, seed=1)
    tasks = [domain_tasks(domain)[r["id"]] for r in rows]
    pool = argument_pool(tasks, solo=solo)
    rng = random.Random(0)
    kinds = set()
    for row, task in zip(rows, tasks, strict=True):
        for kind, script in variants(task, pool, rng, solo=solo, domain=domain):
            assert env_outcome(env_episode(env, row, script)) == tau2_outcome(
                domain, task, script, solo), (row["id"], kind, script)
            kinds.add(kind)
    assert {"gold", "dropped", "wrong_arg", "random", "forty_calls"} <= kinds
    assert ("text_stop" if solo else "silent") in kinds


def test_forty_calls_in_one_message_run_as_in_tau2():
    """tau2 runs every call of a message: so does the env (no per-turn cap), and a 40-call
    message scores as tau2's evaluator scores it. A cap set on purpose drops the calls past
    it: an error observation says so and the trajectory counts them."""
    task = domain_tasks("mock")["create_task_1"]
    row = {"id": task.id, "domain": "mock"}
    script = next(s for k, s in variants(task, {}, random.Random(0), domain="mock")
                  if k == "forty_calls")
    assert len(script[0]) == 40 and script[0][-1][0] == "create_task"
    env = make_env(ENV, domain="mock")
    assert env.unwrapped.max_calls_per_turn is None
    traj = env_episode(env, row, script)
    assert len(traj.turns[0].results) == 40 and traj.dropped_calls == 0
    assert env_outcome(traj) == tau2_outcome("mock", task, script, False) == 1.0
    capped = env_episode(make_env(ENV, domain="mock", max_calls_per_turn=32), row, script)
    assert capped.dropped_calls == 8 and capped.info["tau2"]["reward"] == 0.0
    shown = [m for m in capped.messages if m.get("name") == "too_many_calls"]
    assert len(shown) == 1 and "the other 8 did not" in shown[0]["content"]


def test_limits_and_solo_rules_follow_tau2s_orchestrator():
    env = make_env(ENV, domain="mock", max_steps=3)
    row = {"id": "create_task_1", "domain": "mock"}
    task = domain_tasks("mock")["create_task_1"]
    script = gold_script(task)
    traj = env_episode(env, row, script * 3)
    assert traj.info["tau2"]["termination_reason"] == "max_steps"
    assert env_outcome(traj) == tau2_outcome("mock", task, script * 3, False, max_steps=3) == 0
    solo = make_env(ENV, domain="telecom", user="solo")
    row = solo.unwrapped.make_tasks(1)[0]
    task = domain_tasks("telecom")[row["id"]]
    talk = ["Let me check that for you."]  # solo: only tool calls, or the stop
    traj = env_episode(solo, row, talk)
    assert traj.info["tau2"]["termination_reason"] == "agent_error"
    assert env_outcome(traj) == tau2_outcome("telecom", task, talk, True) == 0.0
    # the gold calls, then ###STOP### as text instead of the `done` tool: tau2's solo agent
    # refuses a reply without calls (its run_tasks scores the failed sample 0.0)
    gold = gold_script(task, solo=True)
    text_stop = [*gold[:-1], "###STOP###"]
    traj = env_episode(solo, row, text_stop)
    assert traj.info["tau2"]["termination_reason"] == "agent_error"
    ref = tau2_reward("telecom", task, text_stop, solo=True)
    assert env_outcome(traj) == ref.reward == 0.0
    assert "LLMSoloAgent only supports tool calls" in ref.info["failed_sample"]
    assert env_outcome(env_episode(solo, row, gold)) == tau2_outcome(
        "telecom", task, gold, True) == 1.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kwargs", [{"domain": "airline"}, {"domain": "retail"},
                                    {"domain": "telecom"}, {"domain": "telecom", "user": "solo"},
                                    {"domain": "mock"}, {"domain": "mock", "user": "solo"}])
def test_check_env_per_domain(kwargs):
    report = check_tool_env(ENV, env_kwargs=kwargs)
    assert report.ok, str(report)


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom", "mock"])
def test_databases_are_copies_of_tau2s_load(domain):
    """Loaded once a process, copied per environment: each copy equals a fresh load by tau2's
    own hash (what its evaluator compares), is validated from data (no fallback), and shares
    nothing with another copy; tau2's evaluator gets the same constructor."""
    from tau2.registry import registry
    from toolrl.envs.tau2.domain_cache import evaluation_domain, make_environment, templates

    fresh = registry.get_env_constructor(domain)()
    digest, user_digest = fresh.get_db_hash(), fresh.get_user_db_hash()
    first, second = make_environment(domain), make_environment(domain)
    assert all(t is None or t.data is not None for t in templates(domain))
    assert first.get_db_hash() == digest and first.get_user_db_hash() == user_digest
    key = next(iter(type(first.tools.db).model_fields))
    setattr(first.tools.db, key, type(getattr(first.tools.db, key))())  # emptied in one copy
    assert first.get_db_hash() != digest == second.get_db_hash()
    name = evaluation_domain(domain)
    assert name != domain and registry.get_env_constructor(name)().get_db_hash() == digest


def test_llm_user_is_tau2s_simulator_on_an_openai_compatible_endpoint():
    """Built, never called (no network in tests): tau2's UserSimulator through litellm."""
    from tau2.user.user_simulator import UserSimulator
    from toolrl.envs.tau2.users import make_user

    env = make_env(ENV, domain="telecom", user="llm", user_model="openai/qwen3",
                   user_base_url="http://127.0.0.1:9/v1", user_api_key="none")
    base = env.unwrapped
    task = domain_tasks("telecom")[split_ids("telecom", "test")[0]]
    base.environment = __import__("tau2.registry").registry.registry.get_env_constructor(
        "telecom")()
    user = make_user("llm", task, base.environment, model="openai/qwen3",
                     base_url="http://127.0.0.1:9/v1", api_key="none")
    assert isinstance(user, UserSimulator) and user.llm == "openai/qwen3"
    assert user.llm_args == {"api_base": "http://127.0.0.1:9/v1", "api_key": "none"}
    assert user.tools  # telecom's user has tools (dual control)
    assert str(task.user_scenario) in user.system_prompt
    with pytest.raises(ValueError, match="user='llm' needs user_model"):
        make_user("llm", task, base.environment)


def test_tau2_reward_plugin_has_the_checks_as_components():
    from toolrl.rewards.tau2 import tau2

    env = make_env(ENV, domain="mock")
    traj = asyncio.run(run_episode(env, row={"id": "create_task_1", "domain": "mock"}))
    result = tau2(traj)
    assert result.score == 1.0 and result.components == {"db": 1.0, "communicate": 1.0}


def test_pass_hat_k_is_tau2s():
    from tau2.metrics.agent_metrics import pass_hat_k
    from toolrl.envs.tau2.pass_k import pass_k

    env = make_env(ENV, domain="mock")
    rows = env.unwrapped.make_tasks(27, split="all")  # every task 3 times
    recs = [asyncio.run(run_episode(env, row=r)).to_dict() for r in rows[:26]]
    recs[0]["infra_failure"] = "env_exception"
    out = pass_k(recs)["mock"]
    assert out["infra_failed"] == 1 and out["trials_per_task"] == 2 and out["tasks"] == 9
    ones = {r["row"]["id"] for r in recs if r["info"]["tau2"]["reward"] == 1.0}
    assert out["pass^1"] == pytest.approx(len(ones) / 9) and "pass^3" not in out
    assert pass_hat_k(3, 2, 2) == pytest.approx(1 / 3)


class CannedModel:
    """A `toolrl.ChatModel` that replies from a list (the engine user without an engine)."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.asked: list[tuple] = []

    def chat(self, messages, tools=None, *, temperature=None, max_tokens=None):
        self.asked.append((messages, tools, temperature, max_tokens))
        return self.replies.pop(0)

    async def achat(self, messages, tools=None, *, temperature=None, max_tokens=None):
        return self.chat(messages, tools, temperature=temperature, max_tokens=max_tokens)


def test_engine_user_is_tau2s_simulator_prompted_through_the_rollout_model():
    from tau2.user.user_simulator import UserSimulator
    from toolrl.envs.tau2.users import make_user

    env = make_env(ENV, domain="mock", user="engine", user_llm_args={"max_tokens": 40})
    row = {"id": "create_task_1", "domain": "mock"}
    # outside a rollout (budget check, dry run, oracle) there is no engine: the scripted user
    stand_in = asyncio.run(run_episode(env, row=row))
    assert stand_in.info["tau2"]["user"] == "scripted" and stand_in.info["tau2"]["reward"] == 1
    with pytest.raises(ValueError, match="user='engine' is the rollout's own engine") as err:
        make_user("engine", env.unwrapped.task, env.unwrapped.environment)
    assert "\n" not in str(err.value)
    model = CannedModel("Please create a task for me.", "Thanks! ###STOP###")
    env.unwrapped.rollout_model = model
    traj = asyncio.run(run_episode(env, row=row))
    assert traj.info["tau2"]["termination_reason"] == "user_stop"
    assert traj.info["tau2"]["user"] == "engine"
    assert traj.info["tau2"]["reward"] == 1.0  # the oracle, with the engine's lines as user
    assert [m["content"] for m in traj.messages if m["role"] == "user"] == [
        "Please create a task for me.", "Thanks! ###STOP###"]
    messages, tools, temperature, max_tokens = model.asked[1]
    scenario = str(domain_tasks("mock")["create_task_1"].user_scenario)
    assert messages[0] == {"role": "system", "content": UserSimulator(
        instructions=scenario).system_prompt}  # tau2's user prompt, roles flipped:
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user"]
    assert messages[2]["content"] == "Please create a task for me."
    assert tools is None and (temperature, max_tokens) == (0.0, 40)  # tau2's user default


def test_engine_user_tool_calls_and_empty_lines_follow_tau2():
    env = make_env(ENV, domain="telecom", user="engine")
    call = '<tool_call>{"name": "check_status_bar", "arguments": {}}</tool_call>'
    model = CannedModel(call, "My phone has no signal.", "   ")
    env.unwrapped.rollout_model = model
    row = env.unwrapped.make_tasks(1, split="test")[0]
    traj = asyncio.run(run_episode(env, row=row))
    # the user's call ran in tau2's environment (dual control); the agent saw only the text
    assert [m["role"] for m in traj.messages[1:3]] == ["assistant", "user"]
    assert traj.messages[2]["content"] == "My phone has no signal."
    shown = model.asked[1][0]
    assert shown[-1]["role"] == "tool" and shown[-1]["name"] == "check_status_bar"
    assert model.asked[0][1]  # the user's tools are offered
    # a blank line from the user: tau2's communication check, USER_ERROR, reward 0
    assert traj.info["tau2"]["termination_reason"] == "user_error"
    assert traj.info["tau2"]["reward"] == 0.0


def test_eval_reports_tau2s_pass_hat_k_per_domain():
    """``toolrl eval``'s results (`summarize`) carry pass^1..4 per domain equal to tau2's own
    ``compute_metrics`` over the same simulations; infrastructure failures are left out (tau2
    never sees them) and counted; another env's episodes do not enter them."""
    from tau2.data_model.simulation import AgentInfo, Info, Results, UserInfo
    from tau2.environment.environment import EnvironmentInfo
    from tau2.metrics.agent_metrics import compute_metrics

    from toolrl.trainer.evaluate import result_tables, summarize

    env = make_env(ENV, domain="mock")
    base = env.unwrapped
    rows = base.make_tasks(0, split="all")

    def policy(trial, i):  # the oracle on some (task, trial) pairs, a wrong stop on others
        def act(env, messages):
            return base.oracle_action() if (i + trial) % 3 else "Sorry, bye. ###STOP###"
        return act

    trajs, sims = [], []
    for trial in range(4):
        for i, row in enumerate(rows):
            traj = asyncio.run(run_episode(env, policy(trial, i), row=row))
            trajs.append(traj)
            sim = base.simulation_run()
            sim.reward_info, sim.trial = base.reward_info, trial
            sims.append(sim)
    for traj in trajs[:3]:  # failed by the infrastructure: not in tau2's results
        traj.infra_failure = "env_exception"
    other = asyncio.run(run_episode(make_env("toolrl/Calculator-v0"),
                                    row=make_env("toolrl/Calculator-v0").unwrapped.make_tasks(1)[0]))
    other.row["env"] = "toolrl/Calculator-v0"
    results = summarize([*trajs, other], [0.0] * (len(trajs) + 1), ENV)
    ours = results["env_metrics"][ENV]["mock"]
    info = Info(git_commit="", num_trials=4, max_steps=100, max_errors=10,
                user_info=UserInfo(implementation="scripted"),
                agent_info=AgentInfo(implementation="toolrl"),
                environment_info=EnvironmentInfo(domain_name="mock", policy=""))
    tasks = list(domain_tasks("mock").values())
    kept = [s for s, t in zip(sims, trajs, strict=True) if t.infra_failure is None]
    theirs = compute_metrics(Results(info=info, tasks=tasks, simulations=kept)).pass_hat_ks
    assert ours["infra_failed"] == 3 and ours["tasks"] == 9
    assert ours["trials_per_task"] == 3 == max(theirs)  # tau2 also caps k at the fewest trials
    for k, value in theirs.items():
        assert ours[f"pass^{k}"] == pytest.approx(value)
    assert len({round(ours[f"pass^{k}"], 6) for k in (1, 2, 3)}) == 3  # k matters here
    assert list(results["env_metrics"]) == [ENV]
    titles = [t.title for t in result_tables(results)]
    assert f"eval: {ENV}" in titles
