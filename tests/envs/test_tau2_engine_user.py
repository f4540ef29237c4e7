"""tau2's user simulated by the rollout's own engine (``user: engine``), on the real vLLM CPU
engine with the tiny model: the user's lines are the engine's greedy reply to tau2's user
prompt, and none of their tokens is trained on (mask 0)."""

from __future__ import annotations

import pytest

pytest.importorskip("tau2", reason="the tau2 extra is not installed")

from toolrl.envs.tau2.env import get_task  # (first: litellm offline before tau2 loads)
from toolrl.envs.tau2.users import chat_messages

from toolrl import batch as B
from toolrl.core.parse import get_format
from toolrl.rollout.engine import EngineConfig, SamplingConfig
from toolrl.rollout.env_model import EngineChatModel
from toolrl.rollout.worker import RolloutConfig, RolloutWorker, make_rollout_input

pytestmark = pytest.mark.slow

MAX_PROMPT, MAX_RESPONSE = 1024, 512
USER_TOKENS = 12


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    config = RolloutConfig(
        engine=EngineConfig(model=str(tiny_model_dir), max_model_len=MAX_PROMPT + MAX_RESPONSE,
                            kv_cache_gib=0.25, multiprocessing=False),
        max_tokens_per_turn=8, max_prompt_tokens=MAX_PROMPT,
        max_total_tokens=MAX_PROMPT + MAX_RESPONSE, max_turns=3, env_id="toolrl/Tau2-v0",
        env_kwargs={"domain": "mock", "user": "engine",
                    "user_llm_args": {"temperature": 1.0, "max_tokens": USER_TOKENS}},
        concurrency=4, seed=0)
    w = RolloutWorker(config)
    yield w
    w.shutdown()


def first_user_line(worker, task_id: str, episode_seed: int) -> str:
    """What tau2's user prompt (the simulator's system prompt, then the agent's greeting with
    the roles flipped) makes the engine say with the seed of the episode's first user call
    (greedy, the random tiny model writes only newlines: an empty line, tau2's USER_ERROR)."""
    from tau2.data_model.message import AssistantMessage
    from tau2.user.user_simulator import UserSimulator

    task = get_task("mock", task_id)
    state = UserSimulator(instructions=str(task.user_scenario)).get_init_state()
    state.messages.append(AssistantMessage(role="assistant",
                                           content="Hi! How can I help you today?"))
    messages = chat_messages(state.system_messages + state.flip_roles(), get_format("hermes"))
    seed = EngineChatModel(worker.engine, worker.renderer, SamplingConfig(),
                           episode_seed).call_seed(0)
    [out] = worker.engine.generate_sync(worker.renderer.render_prompt(messages),
                                        SamplingConfig(temperature=1.0, max_tokens=USER_TOKENS,
                                                       seed=seed, logprobs=False))
    return worker.engine.tokenizer.decode(out.token_ids, skip_special_tokens=True).strip()


@pytest.mark.timeout(300)
def test_the_engine_is_the_user_and_its_tokens_never_train(worker):
    row = {"id": "create_task_1", "domain": "mock", "category": "mock"}
    td = worker.rollout(make_rollout_input([row], n=2))
    trajs = B.trajectories(td)
    assert trajs[0].seed != trajs[1].seed
    for i, traj in enumerate(trajs):
        expected = first_user_line(worker, "create_task_1", traj.seed)
        assert expected  # the tiny model says something
        assert traj.infra_failure is None, traj.error
        users = [m["content"] for m in traj.messages if m["role"] == "user"]
        assert users[0] == expected  # the engine's reply to tau2's user prompt, not a script
        task = get_task("mock", "create_task_1")
        assert str(task.user_scenario) not in "".join(users)
        n = traj.response_tokens
        mask = td[B.RESPONSE_MASK][i, :n].tolist()
        response = td[B.RESPONSES][i, :n].tolist()
        actions = sum(t.action_span[1] - t.action_span[0] for t in traj.turns)
        assert sum(mask) == traj.sampled_tokens == actions  # only the agent's turns train
        later = users[1:]  # user lines after the first turn: in observations, mask 0
        observed = "".join(worker.engine.tokenizer.decode(response[a:b])
                           for a, b in (t.observation_span for t in traj.turns
                                        if t.observation_span))
        assert all(line in observed for line in later)
        for t in traj.turns:
            if t.observation_span:
                a, b = t.observation_span
                assert set(mask[a:b]) == {0}
        usage = (traj.final_state or {}).get("user_model")
        assert usage and usage["calls"] >= len(users)  # (an empty line ends it: USER_ERROR)
        assert usage["sampled_tokens"] > 0  # sampled by the engine, in no mask
    assert any(sum(m["role"] == "user" for m in t.messages) > 1 for t in trajs)
