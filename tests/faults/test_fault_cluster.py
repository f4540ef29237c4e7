"""Beyond one machine: a two-node Ray cluster (``ray.cluster_utils.Cluster``, each node with
its own custom resource) runs a short pipeline training with the actor on one node and the
rollout pool on the other, weights synced across; the rollout node's worker is killed while
it generates step 2's batch, and with ``trainer.on_rollout_failure=retry`` the rollout pool
is restarted on its node and the run finishes (`cluster_run.py` does the run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
from trainer_runs import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.timeout(900)
def test_two_nodes_rollout_and_actor_apart_survive_a_killed_rollout_worker(tiny_model_dir,
                                                                          tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="rt-") as temp:
        env["RAY_TMPDIR"] = temp  # Cluster writes its address file under <temp>/ray
        os.makedirs(os.path.join(temp, "ray"))
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "faults" / "cluster_run.py"),
             str(tiny_model_dir), str(tmp_path / "run"), os.path.join(temp, "ray")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=840)
        finally:
            if proc.poll() is None:  # never leave the cluster behind
                os.killpg(proc.pid, 9)
                proc.wait(timeout=60)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    # the actor on the train node, the rollout pool on the other, before and after the restart
    for when in ("before", "after"):
        (actor,), (rollout,) = result[when]["actor"], result[when]["rollout"]
        assert actor.endswith(":train_node") and rollout.endswith(":rollout_node"), result[when]
        assert actor.split(":")[0] != rollout.split(":")[0]
    killed = result["killed"]
    assert killed is not None and result["rollout_pid_after"] != killed["pid"]
    deadline = time.monotonic() + 30
    while not all(_gone(p) for p in [killed["pid"], *killed["engines"]]) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(_gone(p) for p in [killed["pid"], *killed["engines"]])
    rows = result["metrics"]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # every step once, none lost
    assert rows[-1]["trainer/rollout_retries"] == 1
    # weights crossed the nodes: versions advance and engine and actor agree after each push
    assert [r["policy_version"] for r in rows[1:]] == [1.0, 2.0, 3.0]
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 for r in rows[1:])
    assert all(0 <= r["pipeline/staleness_max"] <= 1 for r in rows[1:])
