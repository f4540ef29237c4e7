"""Actor, reference and critic as controller workers on the session's real Ray cluster:
two ranks, the three roles colocated in one process per rank."""

from __future__ import annotations

import sys

import pytest
import ray
import torch
from fsdp_harness import hf_log_probs, make_batch, with_policy_inputs

from toolrl.batch import OLD_LOG_PROBS, REF_LOG_PROBS, RETURNS, VALUES
from toolrl.controller import Dispatch, RayResourcePool, RayWorkerGroup, RoleSpec, Worker, remote
from toolrl.weights.buckets import weights_checksum
from toolrl.weights.group import WeightSyncGroup
from toolrl.workers.actor import ActorConfig, ActorWorker, RefWorker
from toolrl.workers.critic import CriticConfig, CriticWorker

# Test modules are not importable inside Ray workers: ship this module's classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DictReceiver(Worker):
    """A stand-in rollout worker on its own pool: receives pushes into a dict 'engine'."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    @remote(Dispatch.ONE_TO_ALL)
    def connect_weight_sync(self, master_addr: str, master_port: int, world_size: int) -> None:
        self.sync = WeightSyncGroup(master_addr, master_port, world_size, 1 + self.rank,
                                    timeout_s=120)

    @remote(Dispatch.ONE_TO_ALL)
    def receive_weights(self) -> tuple[int, str]:
        def load(named):
            self.weights = {n: t.clone() for n, t in named}

        version = self.sync.receive(load)
        return version, weights_checksum(self.weights)


def test_dispatch_specs_are_class_data():
    assert ActorWorker.__remote__["compute_log_prob"].dispatch is Dispatch.DP_SPLIT
    assert ActorWorker.__remote__["update"].dispatch is Dispatch.DP_SPLIT_RAW
    assert ActorWorker.__remote__["save_checkpoint"].dispatch is Dispatch.ONE_TO_ALL
    assert RefWorker.__remote__["compute_ref_log_prob"].dispatch is Dispatch.DP_SPLIT
    assert CriticWorker.__remote__["update_critic"].dispatch is Dispatch.DP_SPLIT_RAW


@pytest.fixture(scope="module")
def group(ray_cluster, tiny_model_dir):
    actor_cfg = ActorConfig(model_path=str(tiny_model_dir), lr=1e-4, micro_batch_size=2)
    critic_cfg = CriticConfig(model_path=str(tiny_model_dir), lr=1e-3)
    pool = RayResourcePool([2], cpus_per_process=1, name="workers-test")
    g = RayWorkerGroup(pool, {"actor": RoleSpec.of(ActorWorker, actor_cfg),
                              "ref": RoleSpec.of(RefWorker, actor_cfg),
                              "critic": RoleSpec.of(CriticWorker, critic_cfg)},
                       call_timeout_s=300, ready_timeout_s=300)
    try:
        yield g
    finally:
        g.shutdown()
        pool.release()


def test_ppo_step_through_the_worker_group(group, tiny_model_dir, tmp_path):
    actor, ref, critic = group.role("actor"), group.role("ref"), group.role("critic")
    td = with_policy_inputs(tiny_model_dir, make_batch(6, seed=21))
    old = actor.call(ActorWorker.compute_log_prob, td)
    torch.testing.assert_close(old[OLD_LOG_PROBS], hf_log_probs(tiny_model_dir, td),
                               atol=2e-5, rtol=1e-5)
    ref_lp = ref.call(RefWorker.compute_ref_log_prob, td)[REF_LOG_PROBS]
    torch.testing.assert_close(ref_lp, old[OLD_LOG_PROBS], atol=0, rtol=0)
    before = actor.call(ActorWorker.weights_checksum)[0]

    td[VALUES] = critic.call(CriticWorker.compute_values, td)[VALUES]
    td[RETURNS] = td["advantages"] + td[VALUES]
    critic_metrics = critic.call(CriticWorker.update_critic, td)
    assert critic_metrics[0] == critic_metrics[1] and critic_metrics[0]["critic/vf_loss"] > 0

    metrics = actor.call(ActorWorker.update, td)
    assert len(metrics) == 2 and metrics[0] == metrics[1]
    assert metrics[0]["actor/num_updates"] == 1.0 and metrics[0]["actor/grad_norm"] > 0
    after = actor.call(ActorWorker.weights_checksum)
    assert after[1] is None and after[0] != before
    new = actor.call(ActorWorker.compute_log_prob, td)[OLD_LOG_PROBS]
    assert not torch.allclose(new, old[OLD_LOG_PROBS])
    # the reference stayed frozen
    torch.testing.assert_close(ref.call(RefWorker.compute_ref_log_prob, td)[REF_LOG_PROBS],
                               ref_lp, atol=0, rtol=0)

    actor.call(ActorWorker.save_checkpoint, str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / ".metadata").is_file()
    paths = actor.call(ActorWorker.export_hf, str(tmp_path / "hf"))
    assert paths == [str(tmp_path / "hf"), None]
    torch.testing.assert_close(hf_log_probs(tmp_path / "hf", td), new, atol=2e-5, rtol=1e-5)
    # a second update, then restore the checkpoint: the weights come back exactly
    actor.call(ActorWorker.update, td)
    assert actor.call(ActorWorker.weights_checksum)[0] != after[0]
    actor.call(ActorWorker.load_checkpoint, str(tmp_path / "ckpt"))
    assert actor.call(ActorWorker.weights_checksum)[0] == after[0]


def test_split_pool_weight_sync_through_ray(group, ray_cluster):
    """Actor rank 0 and a rollout pool of 2 form their own sync group; every push lands
    bit-exact on each rollout worker with the next policy version."""
    actor = group.role("actor")
    pool = RayResourcePool([2], cpus_per_process=0.5, name="receivers-test")
    receivers = RayWorkerGroup(pool, DictReceiver, call_timeout_s=120)
    try:
        addr, port = actor.call(ActorWorker.weight_sync_endpoint)
        futures = [actor.call_async(ActorWorker.connect_weight_sync, addr, port, 3),
                   receivers.call_async(DictReceiver.connect_weight_sync, addr, port, 3)]
        for f in futures:
            f.get(timeout=120)
        start = actor.call(ActorWorker.policy_version)
        for expected in (start + 1, start + 2):
            pushed = actor.call_async(ActorWorker.push_weights)
            got = receivers.call(DictReceiver.receive_weights)
            assert pushed.get(timeout=120) == [expected, expected]
            checksum = actor.call(ActorWorker.weights_checksum)[0]
            assert got == [(expected, checksum), (expected, checksum)]
    finally:
        receivers.shutdown()
        pool.release()
