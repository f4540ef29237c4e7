"""A short pipeline training on a two-node Ray cluster on this machine (not a test module).

Run by ``test_fault_cluster.py`` in a subprocess (it cannot share the session's cluster):
``ray.cluster_utils.Cluster`` starts a head node with the resource ``train_node`` and a second
node with ``rollout_node``; ``resources.pool_resources`` puts the actor's pool on the first
and the rollout pool on the second, so the weights travel between nodes over the sync group.
While the rollout node's worker generates the batch of step 2 it is SIGKILLed once. Prints one
``RESULT {json}`` line: where each pool ran (before and after the kill), the pids, the metrics.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import ray
from ray.cluster_utils import Cluster
from ray.util import placement_group_table
from trainer_runs import ROOT, register_test_rewards, small_run_overrides

from toolrl.rollout.worker import RolloutWorker
from toolrl.trainer.config import load_config
from toolrl.trainer.pipeline import PipelineSchedule
from toolrl.trainer.tracking import read_metrics
from toolrl.trainer.trainer import Trainer


def pool_nodes(trainer: Trainer) -> dict[str, list[str]]:
    """Node ids of each pool's bundles, with the custom resources of those nodes."""
    resources = {n["NodeID"]: sorted(k for k in n["Resources"] if k.endswith("_node"))
                 for n in ray.nodes() if n["Alive"]}
    out = {}
    for role in ("actor", "rollout"):
        pool = trainer.handles[role].group.pool
        nodes = [node for pg in pool.placement_groups()
                 for node in placement_group_table(pg)["bundles_to_node_id"].values()]
        out[role] = [f"{node}:{','.join(resources[node])}" for node in nodes]
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def main(model: str, out: str, temp: str) -> dict:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "temp_dir": temp, "include_dashboard": False,
        "resources": {"train_node": 1}})
    cluster.add_node(num_cpus=4, resources={"rollout_node": 1})
    cluster.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = cluster.address  # what a user of an existing cluster sets
    register_test_rewards()
    cfg = load_config(ROOT / "configs/quickstart_pipeline.yaml", small_run_overrides(
        Path(model), Path(out), **{
            "trainer.total_steps": 3, "trainer.on_rollout_failure": "retry",
            "rollout.concurrency": 1, "rollout.max_tokens_per_turn": 48,
            "resources.pool_resources":
                "{train: {train_node: 0.01}, rollout: {rollout_node: 0.01}}"}))
    result: dict = {"killed": None}
    trainer = Trainer(cfg)
    launch = PipelineSchedule.launch_rollout

    def launch_then_kill(self: PipelineSchedule, step: int):
        if step != 2 or result["killed"] is not None:
            return launch(self, step)
        rollout = self.t.handles["rollout"]
        engines = rollout.call(RolloutWorker.engine_pids)[0]
        pid = rollout.group.pids[0]
        busy = cpu_seconds(engines)
        pending = launch(self, step)
        deadline = time.monotonic() + 60  # kill while the engine computes for this batch
        while cpu_seconds(engines) < busy + 0.05 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        result["killed"] = {"pid": pid, "engines": engines}
        return pending

    PipelineSchedule.launch_rollout = launch_then_kill
    try:
        trainer.setup()
        result["before"] = pool_nodes(trainer)
        trainer.fit()
        result["after"] = pool_nodes(trainer)
        result["rollout_pid_after"] = trainer.handles["rollout"].group.pids[0]
    finally:
        trainer.close()
        ray.shutdown()
        cluster.shutdown()
    result["metrics"] = read_metrics(Path(out) / "metrics.jsonl")
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(*sys.argv[1:4])), flush=True)
