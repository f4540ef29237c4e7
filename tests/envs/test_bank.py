"""toolrl/Bank-v0: scripted user, policy rules, final-state outcome, 64 concurrent episodes."""

from __future__ import annotations

import asyncio
import copy
import json
import random

import pytest
from toolrl.envs.bank import SCENARIOS, BankEnv

from toolrl.core.env import run_episode
from toolrl.core.registration import make_env


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture
def env():
    e = make_env("toolrl/Bank-v0")
    yield e
    e.close()


def test_scripted_policy_reaches_the_expected_state_in_every_scenario(env):
    rows = BankEnv.make_tasks(10, seed=0)
    assert {r["category"] for r in rows} == set(SCENARIOS)
    for row in rows:
        ep = asyncio.run(run_episode(env, row=row))
        assert ep.success and ep.final_state == row["expected_state"], row["category"]
        users = [m["content"] for m in ep.messages if m["role"] == "user"]
        assert users == row["user_script"]  # the customer revealed one line per text turn
        changed = ep.final_state != row["db"]
        assert changed == (row["category"] in ("internal_transfer", "external_transfer",
                                               "update_email"))


def test_tools_enforce_identity_and_funds(env):
    row = BankEnv.make_tasks(1, seed=4, scenarios=["internal_transfer"])[0]
    env.reset(options=row)
    gold = {c["name"]: c["arguments"] for c in row["ground_truth"]}
    transfer = gold["transfer"]
    obs, _, terminated, _, info = env.step(call("transfer", **transfer))
    assert not terminated and info["errors"][0]["type"] == "tool_exception"
    assert "PolicyError: identity of" in obs[0]["content"]
    assert info["turn_reward"] < 0
    bad_id = dict(gold["verify_identity"], date_of_birth="1900-01-01")
    assert "could not be verified" in env.step(call("verify_identity", **bad_id))[0][0]["content"]
    env.step(call("verify_identity", **gold["verify_identity"]))
    huge = dict(transfer, amount=10**7)
    assert "insufficient funds" in env.step(call("transfer", **huge))[0][0]["content"]
    other = next(a for a, v in row["db"]["accounts"].items()
                 if v["customer_id"] != gold["verify_identity"]["customer_id"])
    obs = env.step(call("get_balance", account_id=other))[0]
    assert "not verified" in obs[0]["content"]  # someone else's account
    assert env.unwrapped.state_snapshot() == row["db"]  # nothing changed


def test_breaking_the_transfer_limit_fails_the_episode(env):
    row = BankEnv.make_tasks(1, seed=2, scenarios=["over_limit"])[0]
    env.reset(options=row)
    verify = row["ground_truth"][0]["arguments"]
    accounts = [a for a, v in row["db"]["accounts"].items()
                if v["customer_id"] == verify["customer_id"]]
    amount = max(row["db"]["accounts"][a]["balance_cents"] for a in accounts) // 100
    source = max(accounts, key=lambda a: row["db"]["accounts"][a]["balance_cents"])
    target = next(a for a in accounts if a != source)
    for action in ["Your id and date of birth, please?", call("verify_identity", **verify),
                   "Sure, what do you need?", call("transfer", from_account=source,
                                                   to_account=target, amount=amount),
                   "Done.", "Bye."]:
        _, _, terminated, _, info = env.step(action)
    assert terminated and info["success"] is False  # the tool allowed it; the policy did not


@pytest.mark.timeout(120)
def test_64_concurrent_episodes_do_not_leak_state():
    rows = BankEnv.make_tasks(32, seed=11)
    # 64 episodes: every row twice (one correct agent, one agent making a wrong transfer),
    # sharing the very same row object, interleaved at random points.
    pristine = copy.deepcopy(rows)
    rng = random.Random(0)

    def make_policy(wrong: bool):
        async def policy(env, messages):
            await asyncio.sleep(rng.random() * 0.002)
            base = env.unwrapped
            action = base.oracle_action()
            if wrong and '"transfer"' in action:
                args = json.loads(action.split("<tool_call>")[1].split("</tool_call>")[0])
                args["arguments"]["amount"] = round(args["arguments"]["amount"] / 2, 2)
                action = f"<tool_call>{json.dumps(args)}</tool_call>"
            return action
        return policy

    async def play_all():
        envs = [make_env("toolrl/Bank-v0") for _ in range(64)]
        jobs = [run_episode(envs[i], make_policy(wrong=i % 2 == 1), row=rows[i // 2])
                for i in range(64)]
        try:
            return await asyncio.gather(*jobs)
        finally:
            for e in envs:
                e.close()

    episodes = asyncio.run(play_all())
    assert rows == pristine  # no env wrote into its task row
    for i, ep in enumerate(episodes):
        row = rows[i // 2]
        if i % 2 == 0:
            assert ep.success and ep.final_state == row["expected_state"]
        else:
            transfers = row["category"] in ("internal_transfer", "external_transfer")
            assert ep.success is not transfers
            if transfers:  # exactly one half-size transfer, in this episode's db only
                [tx] = ep.final_state["transactions"]
                gold = next(c for c in row["ground_truth"] if c["name"] == "transfer")
                assert tx["amount_cents"] == round(gold["arguments"]["amount"] * 50)
    # ids are per episode, never shared: every episode numbers its first transaction T1
    assert all(tx["id"] == "T1" for ep in episodes for tx in ep.final_state["transactions"])
