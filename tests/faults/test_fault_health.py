"""Fault table, silent do-nothing steps: every training step checks its own health.

Expected: an env whose ``evaluate`` raises, prompts that leave no room to sample, a reward
that fails on every sample each stop the run with one line (`UnhealthyRun`) that says what
happened and which key to change, or only warn with ``trainer.health.on_unhealthy=warn``;
env and reward exceptions are printed on the driver's console, counted per step, with the
env or reward name and where the exception was raised. The episodes come from the real
episode runner and rollout worker (a scripted stand-in for vLLM), the reward failures from
the real reward composition; the last test runs a real training (Ray, vLLM, FSDP) whose
reward fails and checks that `toolrl train` stops after one step with one line, exit 1.
"""

from __future__ import annotations

import time

import pytest
from fault_harness import FaultEnv, fault_row
from test_fault_episodes import ScriptedRolloutWorker, rollout_config
from transformers import AutoTokenizer

from toolrl import batch as B
from toolrl.core.registration import register_env
from toolrl.reward import REWARDS, build_reward, reward
from toolrl.rollout.worker import make_rollout_input
from toolrl.trainer.failures import InfraFailureConfig, InfraFailureError, settle
from toolrl.trainer.health import HealthConfig, HealthMonitor, UnhealthyRun

pytestmark = pytest.mark.timeout(120)

BAD_EVAL = "toolrl-test/BadEvaluate-v0"


class BadEvaluateEnv(FaultEnv):
    """A user's env with a bug in ``evaluate``: every episode that ends raises."""

    def evaluate(self) -> bool:
        return self.echoed[5] == "done"  # IndexError: the bug


register_env(BAD_EVAL, BadEvaluateEnv)


@pytest.fixture(scope="module", autouse=True)
def failing_reward():
    @reward("test_health_broken")
    def broken(traj, *, limit: int = 3) -> float:
        return len(traj.turns) > limit.bit_length  # TypeError: a method, not a number

    yield
    REWARDS.unregister("test_health_broken")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def rollout(tokenizer, model, rows, **changes):
    worker = ScriptedRolloutWorker(rollout_config(str(model), **changes), tokenizer)
    return B.trajectories(worker.rollout(make_rollout_input(rows)))


class Lines(list):
    def __call__(self, line: str) -> None:
        self.append(line)


def test_an_env_whose_evaluate_raises_stops_the_run(tokenizer, tiny_model_dir):
    """An env that raises is an infrastructure failure (``env_exception``): the health check
    prints it, counted, and leaves it to ``trainer.infra_failures``, which stops the run."""
    rows = [dict(fault_row(f"e-{i}", "echo", text="x"), env=BAD_EVAL) for i in range(3)] + \
        [fault_row("ok-0", "echo", text="fine")]
    worker = ScriptedRolloutWorker(rollout_config(str(tiny_model_dir)), tokenizer)
    batch = worker.rollout(make_rollout_input(rows))
    trajs = B.trajectories(batch)
    envs = [r.get("env", "toolrl-test/Fault-v0") for r in rows]
    assert [t.finish_reason for t in trajs] == ["error"] * 3 + ["terminated"]
    assert [t.infra_failure for t in trajs] == ["env_exception"] * 3 + [None]
    log = Lines()
    monitor = HealthMonitor(HealthConfig(), log=log)
    report = monitor.check(7, trajs, envs)
    # the console line: counted, the env's name, the exception and where it was raised
    assert len(log) == 1, log
    assert log[0].startswith(f"step 7: 3 of 4 episodes failed for infrastructure reasons "
                             f"(env_exception) in {BAD_EVAL}: step: IndexError: list index out "
                             f"of range (at test_fault_health.py:")
    assert log[0].endswith(" in evaluate); kept out of training (trainer.infra_failures)")
    assert report.ok and report.metrics["health/error_episodes"] == 0.0  # not counted twice
    with pytest.raises(InfraFailureError) as info:
        settle(batch, InfraFailureConfig())
    message = str(info.value)
    assert "\n" not in message and "3 of 4 episodes failed for infrastructure reasons" in message
    assert "IndexError" in message and "trainer.infra_failures.max_fraction" in message


def test_below_the_threshold_errors_are_printed_not_fatal(tokenizer, tiny_model_dir):
    rows = [dict(fault_row("e-0", "echo", text="x"), env=BAD_EVAL)] + \
        [fault_row(f"ok-{i}", "echo", text="fine") for i in range(5)]
    trajs = rollout(tokenizer, tiny_model_dir, rows)
    log = Lines()
    monitor = HealthMonitor(HealthConfig(), log=log)
    report = monitor.check(2, trajs, [r.get("env", "toolrl-test/Fault-v0") for r in rows])
    assert report.ok and len(log) == 1 and "step 2: 1 of 6 episodes failed" in log[0]
    monitor.act(report)  # 1/6 <= 0.2: no stop


def _mixed(tokenizer, model, infra: int, errors: int, ok: int):
    """A batch of ``infra`` env_exception failures, ``errors`` episodes that end with an error
    that is not the infrastructure's (an observation the tokenizer rejects) and ``ok`` good
    ones."""
    rows = ([fault_row(f"infra-{i}", "echo", "reset", text="x") for i in range(infra)]
            + [fault_row(f"err-{i}", "echo", "bad_text", text="x") for i in range(errors)]
            + [fault_row(f"ok-{i}", "echo", text="fine") for i in range(ok)])
    worker = ScriptedRolloutWorker(rollout_config(str(model)), tokenizer)
    batch = worker.rollout(make_rollout_input(rows))
    trajs = B.trajectories(batch)
    assert [t.infra_failure for t in trajs] == ["env_exception"] * infra + [None] * (errors + ok)
    assert [t.finish_reason for t in trajs][:infra + errors] == ["error"] * (infra + errors)
    return batch


def _step(batch, infra: InfraFailureConfig, health: HealthConfig):
    """What the trainer does with a batch: settle it, then check the health of what trains
    and of the infrastructure failures as generated (`Trainer.check_health`)."""
    generated = B.trajectories(batch)
    kept, _ = settle(batch, infra, lambda *a: pytest.fail("drop_sample: no refill"))
    trajs = [*B.trajectories(kept), *[t for t in generated if t.infra_failure is not None]]
    monitor = HealthMonitor(health, log=Lines())
    report = monitor.check(1, trajs, ["toolrl-test/Fault-v0"] * len(trajs))
    monitor.act(report)
    return report


def test_the_two_error_thresholds_count_apart(tokenizer, tiny_model_dir):
    """``trainer.infra_failures.max_fraction`` counts infrastructure failures on the batch as
    generated; ``trainer.health.max_error_fraction`` the other errors, over the episodes that
    train. No episode counts against both, and neither threshold hides the other."""
    infra, health = InfraFailureConfig(rule="drop_sample"), HealthConfig()  # 0.5, 0.2
    # at both boundaries at once: 5 of 10 infra (= 0.5), 1 of 5 training episodes errors
    # (= 0.2): the run goes on. Counted together it would be 6 of 10 errors.
    report = _step(_mixed(tokenizer, tiny_model_dir, 5, 1, 4), infra, health)
    assert report.metrics["health/error_episodes"] == 0.2
    # one more infra failure: the infra threshold stops it, not the health check
    with pytest.raises(InfraFailureError, match="6 of 10 episodes"):
        _step(_mixed(tokenizer, tiny_model_dir, 6, 0, 4), infra, health)
    # one more error among the training episodes: the health check stops it, though the
    # infra failures beside them are within their own bound
    with pytest.raises(UnhealthyRun, match="2 of 5 episodes ended with an error"):
        _step(_mixed(tokenizer, tiny_model_dir, 5, 2, 3), infra, health)
    # errors alone, above 0.2 but below 0.5: the health check's (it would have been dead had
    # infrastructure failures been counted by it first, or errors by settle)
    with pytest.raises(UnhealthyRun, match="3 of 10 episodes ended with an error"):
        _step(_mixed(tokenizer, tiny_model_dir, 0, 3, 7), infra, health)


def test_prompts_with_no_room_to_sample_stop_the_run(tokenizer, tiny_model_dir):
    """The budget check is skipped here (rows go to the worker directly), as with a
    prompt that grew after the pre-flight: the step must not train on nothing silently."""
    rows = [fault_row(f"p-{i}", "echo", text="x") for i in range(4)]
    trajs = rollout(tokenizer, tiny_model_dir, rows, max_prompt_tokens=8)
    assert all(t.sampled_tokens == 0 and t.finish_reason == "context" for t in trajs)
    monitor = HealthMonitor(HealthConfig(), log=Lines())
    with pytest.raises(UnhealthyRun) as info:
        monitor.act(monitor.check(1, trajs, ["toolrl-test/Fault-v0"] * 4))
    message = str(info.value)
    assert "4 of 4 episodes sampled no token (finish reasons: context 4)" in message
    assert "rollout.max_prompt_tokens" in message and "\n" not in message


def test_a_reward_failing_on_every_sample_stops_the_run(tokenizer, tiny_model_dir):
    rows = [fault_row(f"r-{i}", "echo", text="fine") for i in range(4)]
    trajs = rollout(tokenizer, tiny_model_dir, rows)
    with build_reward({"rewards": [{"name": "success"},
                                   {"name": "test_health_broken", "kwargs": {"limit": 2}}]}) as fn:
        failures = fn.score(trajs).failures
    log = Lines()
    monitor = HealthMonitor(HealthConfig(), log=log)
    report = monitor.check(3, trajs, ["toolrl-test/Fault-v0"] * 4, failures)
    assert log == [log[0]] and log[0].startswith(
        "step 3: reward 'test_health_broken' failed on 4 of 4 samples (scored with its "
        "fallback): TypeError: '>' not supported")
    assert "(at test_fault_health.py:" in log[0] and log[0].endswith("in broken)")
    with pytest.raises(UnhealthyRun, match=r"trainer\.health\.max_reward_error_fraction"):
        monitor.act(report)


def test_a_healthy_step_says_nothing(tokenizer, tiny_model_dir):
    rows = [fault_row(f"ok-{i}", "echo", text="fine") for i in range(4)]
    trajs = rollout(tokenizer, tiny_model_dir, rows)
    log = Lines()
    monitor = HealthMonitor(HealthConfig(), log=log)
    report = monitor.check(1, trajs, ["toolrl-test/Fault-v0"] * 4)
    monitor.act(report)
    assert report.ok and log == []
    assert report.metrics == {"health/error_episodes": 0.0, "health/no_token_episodes": 0.0,
                              "health/context_episodes": 0.0, "health/reward_failures": 0.0}


def test_per_turn_prompts_over_the_budget_name_the_prompt_budget():
    """Under the per_turn history policy a later turn's prompt is the rendered history: when it
    ends most episodes, the key to raise is rollout.max_prompt_tokens, not max_total_tokens."""
    from toolrl.core.trajectory import Trajectory

    def ended(error):
        return Trajectory(messages=[], finish_reason="context", error=error, sampled_tokens=9)

    monitor = HealthMonitor(HealthConfig(), log=Lines())
    per_turn = [ended("per_turn: the prompt of turn 2 has 201 tokens, more than "
                      "max_prompt_len=192") for _ in range(4)]
    report = monitor.check(1, per_turn, ["toolrl/Calculator-v0"] * 4)
    assert len(report.problems) == 1
    assert "raise rollout.max_prompt_tokens" in report.problems[0]
    assert "the prompt of turn 2 has 201 tokens" in report.problems[0]
    report = monitor.check(1, [ended(None) for _ in range(4)], ["toolrl/Calculator-v0"] * 4)
    assert "raise rollout.max_total_tokens" in report.problems[0]


def test_thresholds_are_validated():
    from toolrl.trainer.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="max_error_fraction must be within"):
        load_config(None, ["trainer.health.max_error_fraction=2"])
    with pytest.raises(ConfigError, match=r"on_unhealthy='halt' is not valid.*'warn'"):
        load_config(None, ["trainer.health.on_unhealthy=halt"])


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_toolrl_train_stops_after_the_first_unhealthy_step(ray_cluster, tiny_model_dir,
                                                           tmp_path, capsys):
    """A real run whose reward raises on every sample: step 1 is logged (with its health
    metrics), then `toolrl train` stops with one line naming the reward, exit 1, and every
    worker is shut down."""
    from trainer_runs import ROOT, small_run_overrides

    from toolrl import cli
    from toolrl.trainer.tracking import read_metrics

    free_cpus = ray_cluster.available_resources().get("CPU")
    out = tmp_path / "run"
    overrides = small_run_overrides(tiny_model_dir, out, **{
        "trainer.total_steps": 5, "trainer.export_hf": False,
        "reward": "{rewards: [{name: success}, {name: test_health_broken}]}"})
    code = cli.main(["train", "--config", str(ROOT / "configs/quickstart.yaml"), *overrides])
    err = capsys.readouterr().err
    assert code == 1, err
    (line,) = [x for x in err.splitlines() if x.startswith("toolrl train: ")]
    assert line.startswith("toolrl train: stopped: step 1: reward 'test_health_broken' "
                           "failed on 8 of 8 samples")
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[1]["health/reward_failures"] == 8
    assert rows[1]["reward/errors/test_health_broken"] == 8
    deadline = time.monotonic() + 60  # the pool is released (Ray frees it asynchronously)
    while ray_cluster.available_resources().get("CPU") != free_cpus:
        assert time.monotonic() < deadline, ray_cluster.available_resources()
        time.sleep(0.5)
