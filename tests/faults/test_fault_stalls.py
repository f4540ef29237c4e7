"""Issue 32: a run that stops making progress says so. One run per mode with a stall injected
after step 1 (`stall_plugins`): the watchdog fires within its bound, the stacks of the driver
and the workers are written, and the run stops with its one line. With
``trainer.on_rollout_failure: retry`` (pipeline and async here; the watchdog's path is the same
in every mode, issue 49) the stall kills the rollout workers instead, the retry path restarts
them and the run trains to its end. Signals: SIGTERM and SIGINT
end a real ``toolrl train`` with one line, 143 / 130, and no process of the run left
(SIGTERM after the step in flight, with a checkpoint; SIGINT without a grace at once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from trainer_runs import ROOT, register_test_rewards, small_run_overrides

from toolrl.trainer.checkpoint import load_trainer_state
from toolrl.trainer.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PLUGINS = "tests.faults.stall_plugins"
# The grace before the watchdog's hard exit: a loaded machine took more than 120 s to stop.
WATCHDOG = {"trainer.watchdog.first_step_s": 600, "trainer.watchdog.after_steps": 1,
            "trainer.watchdog.multiple": 3, "trainer.watchdog.floor_s": 10,
            "trainer.watchdog.grace_s": 600}
RETRY = {"trainer.on_rollout_failure": "retry", "trainer.max_retries": 1}
MODES = {  # stop: the stall ends the run; retry: the rollout workers are restarted, it goes on
    "sync": ("configs/quickstart.yaml", {"rollout.runner": f"{PLUGINS}:UnansweringRunner"}),
    "pipeline": ("configs/quickstart_pipeline.yaml",
                 {"rollout.runner": f"{PLUGINS}:StallsOnceRunner", **RETRY}),
    "async": ("configs/quickstart_async.yaml",
              {"rollout.runner": f"{PLUGINS}:StallsOnceRunner", "trainer.max_staleness": 1,
               **RETRY}),
    "gateway": ("configs/quickstart.yaml",
                {"rollout.agent": f"{PLUGINS}:hangs_after_step_1",
                 "rollout.agent_timeout_s": 3600,
                 "trainer.infra_failures.rule": "drop_sample"}),
}


def _child_env(**extra: str) -> dict[str, str]:
    """The test's environment for a child run, with ``tests/`` importable and SIGINT's default
    handler (see `_default_sigint`)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
            **extra}


def _default_sigint() -> None:
    """A background job has SIGINT ignored, and children inherit it; the watchdog and the
    signal tests need Python's handler back in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", list(MODES))
def test_a_stall_is_reported_and_stops_the_run(mode, ray_cluster, tiny_model_dir, tmp_path):
    """The run is a child process on the session's Ray cluster: the watchdog's interrupt and
    its hard exit after the grace end that process, never the test runner. Stop: the stall
    ends the run with its one line. Retry: the line says the rollout workers were killed; the
    retry path restarts them and the run trains to its end."""
    config, extra = MODES[mode]
    out = tmp_path / mode
    overrides = small_run_overrides(tiny_model_dir, out, **{
        "trainer.total_steps": 3, "trainer.export_hf": False, "actor.weight_bucket_mb": 0.5,
        **WATCHDOG, **extra})
    address = ray_cluster.get_runtime_context().gcs_address
    proc = subprocess.run([sys.executable, str(ROOT / "tests/faults/stall_run.py"), config,
                           *overrides], cwd=ROOT, env=_child_env(RAY_ADDRESS=address),
                          capture_output=True, text=True, timeout=840,
                          preexec_fn=_default_sigint)
    output = f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, output
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    printed = [ln for ln in proc.stderr.splitlines() if ln.startswith("stall:")]
    stalls = sorted((out / "stalls").iterdir())
    assert len(stalls) == 1 and len(printed) == 1, (printed, output)
    files = sorted(p.name for p in stalls[0].iterdir())
    assert any(f.startswith("driver-pid") for f in files)
    workers = [p for p in stalls[0].iterdir() if "-rank" in p.name]
    assert workers and all("Thread 0x" in p.read_text() for p in workers), files
    (line,) = printed  # one line
    assert line.startswith("stall: no progress in step ")
    assert "phase 'rollout" in line and "pid " in line, line  # which worker, which wait
    if "trainer.on_rollout_failure" in extra:  # the same in every mode: restart, go on
        assert line.endswith("trainer.on_rollout_failure=retry restarts them and redoes the "
                             "batch"), line
        assert "FINISHED" in proc.stdout and "retry 1 of 1" in proc.stdout + proc.stderr
        assert steps[-1] == 3 and steps == sorted(set(steps)), steps
        last = read_metrics(out / "metrics.jsonl")[-1]
        assert last["trainer/rollout_retries"] == 1
    else:
        assert proc.stdout.splitlines()[-1] == f"STALL_ERROR {line}", output
        assert steps[:2] == [0, 1] and steps[-1] == 1, steps  # step 1 trained, then no step


def _run_tree(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _alive(pids: list[int]) -> list[str]:
    left = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {p.name()}")
        except psutil.Error:
            pass
    return left


@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_run_cleanly(sig, tiny_model_dir, tmp_path):
    """SIGTERM (a preemption): the step in flight finishes, a checkpoint of it is written and
    the run ends with 143. SIGINT with ``trainer.stop_grace_s=0``: the run stops at once (130),
    the step in flight lost. Either way one line, and no process of the run is left
    (Ray's gcs, raylet, agents, workers, the engine)."""
    register_test_rewards()
    out = tmp_path / "run"
    # SIGINT with no grace: at once (a second signal during a grace does the same, timed
    # against the step's end: tests/trainer/test_stopping.py checks it without that race)
    args = small_run_overrides(tiny_model_dir, out, **{
        "trainer.total_steps": 50, "trainer.save_every": 0, "trainer.export_hf": False,
        "rollout.engine.multiprocessing": True,  # the engine's own process must go too
        "trainer.stop_grace_s": 120 if sig == signal.SIGTERM else 0})
    env = _child_env()
    env.pop("RAY_ADDRESS", None)  # its own local cluster, which it must stop whole
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, trainer_runs; trainer_runs.register_test_rewards();"
         " from toolrl.cli import main; sys.exit(main(sys.argv[1:]))", "train", "--config",
         str(ROOT / "configs/quickstart.yaml"), *args],
        cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 600
        while 1 not in [r["step"] for r in read_metrics(out / "metrics.jsonl")]:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "step 1 never finished"
            time.sleep(0.2)
        tree = _run_tree(proc.pid)
        names = {psutil.Process(p).name() for p in tree if psutil.pid_exists(p)}
        assert any("raylet" in n for n in names) and any("gcs" in n for n in names), names
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == 128 + sig.value, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("toolrl train:")]
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    if sig == signal.SIGTERM:
        last = steps[-1]
        ckpt = out / "checkpoints" / f"step_{last}"
        assert lines == [f"toolrl train: stopped by SIGTERM after step {last}: checkpoint "
                         f"{ckpt} written; workers and the local Ray cluster shut down "
                         f"(trainer.resume=auto goes on from step {last})"], err[-3000:]
        assert (ckpt / "COMPLETE").exists()
        assert load_trainer_state(ckpt)["step"] == last
    else:
        assert lines == ["toolrl train: stopped by SIGINT; workers and the local Ray cluster "
                         "shut down (the step in flight is redone by trainer.resume=auto from "
                         "the last checkpoint)"], err[-3000:]
        assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    # Ray's gcs, raylet, agents, workers, the engine and its fork server (which sees its
    # driver's exit as the end of a pipe): all gone
    deadline = time.monotonic() + 10
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(tree) == []


EVAL_CONFIG = """\
experiment_name: eval_signal
env: {id: toolrl/FunctionCalling-v0}
data: {val_file: VAL}
rollout: {max_turns: 1, max_tokens_per_turn: 32, max_total_tokens: 640, max_prompt_tokens: 512,
          concurrency: 1, engine: {max_model_len: 640, multiprocessing: true}}
reward: {rewards: [{name: bfcl_ast}]}
"""


@pytest.mark.timeout(900)
def test_sigterm_ends_an_eval_cleanly_and_the_rerun_goes_on(tiny_model_dir, tmp_path):
    """SIGTERM to a real ``toolrl eval`` (the recipe's Ctrl-C, a preemption): one line, 143, no
    process of its tree left (Ray's own handler used to abort it, exit 134, its agents left
    running), and the chunks it finished are journaled: the same command plays only the rest."""
    import json

    from toolrl.envs.function_calling import FunctionCallingEnv

    from toolrl.trainer.evaluate import JOURNAL

    rows = FunctionCallingEnv.make_tasks(64)
    for i, row in enumerate(rows):
        row.update(id=f"simple_python_{i}", source="bfcl", category="simple_python")
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "eval.yaml"
    config.write_text(EVAL_CONFIG.replace("VAL", str(val)))
    out = tmp_path / "eval"
    command = [sys.executable, "-m", "toolrl.cli", "eval", "--config", str(config), "--model",
               str(tiny_model_dir), "--output-dir", str(out),
               f"trainer.output_dir={tmp_path / 'run'}"]
    env = _child_env()
    env.pop("RAY_ADDRESS", None)  # its own local cluster, which it must stop whole
    proc = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    journal = out / JOURNAL
    try:
        deadline = time.monotonic() + 600
        while not journal.exists() or len(journal.read_text().splitlines()) < 2:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no chunk finished"
            time.sleep(0.1)
        tree = _run_tree(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == 143, err[-3000:]
    assert [ln for ln in err.splitlines() if ln.startswith("toolrl eval:")] == [
        f"toolrl eval: stopped by SIGTERM; workers and the local Ray cluster shut down (the "
        f"same command goes on from the chunks finished in {out}/{JOURNAL})"], err[-3000:]
    deadline = time.monotonic() + 10
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(tree) == []
    assert not (out / "results.json").exists()
    done = len(journal.read_text().splitlines()) - 1
    assert 1 <= done < 8
    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["num_tasks"] == 64 and results["resumed_episodes"] >= 8 * done
