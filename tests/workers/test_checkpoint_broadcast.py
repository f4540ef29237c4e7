"""Two FSDP2 ranks read the checkpoint once: rank 0 loads it, rank 1 gets its shards over the
process group (the meta-device build), with the same weights and log-probs."""

from __future__ import annotations

import pytest
import torch
from fsdp_harness import hf_log_probs, make_batch, run_ranks, with_policy_inputs
from safetensors.torch import load_file

from toolrl.batch import OLD_LOG_PROBS, split
from toolrl.weights.buckets import weights_checksum
from toolrl.workers.actor import ActorConfig, FSDPActor, FSDPReference
from toolrl.workers.critic import CriticConfig, FSDPCritic


def _build(rank, model_dir, shards):
    import transformers

    reads = []
    original = transformers.PreTrainedModel.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        reads.append(cls.__name__)
        return original(cls, *args, **kwargs)

    transformers.PreTrainedModel.from_pretrained = classmethod(counting)
    actor = FSDPActor(ActorConfig(model_path=model_dir))
    ref = FSDPReference(ActorConfig(model_path=model_dir))
    critic = FSDPCritic(CriticConfig(model_path=model_dir))
    checksum = actor.weights.checksum()
    log_probs = actor.compute_log_prob(shards[rank])[OLD_LOG_PROBS]
    frozen = all(not p.requires_grad for p in ref.model.parameters())
    head = critic.model.score.weight.full_tensor().detach().clone()
    buffers = {n: b.clone() for n, b in actor.model.named_buffers()}
    return reads, checksum, log_probs, frozen, head, buffers


@pytest.mark.slow
def test_only_rank_0_reads_the_checkpoint(tiny_model_dir):
    td = with_policy_inputs(tiny_model_dir, make_batch(4, seed=2))
    shards = split(td, 2)
    (reads0, sum0, lp0, frozen0, head0, buf0), (reads1, sum1, lp1, frozen1, head1, buf1) = \
        run_ranks(_build, 2, str(tiny_model_dir), shards, timeout_s=300)
    assert len(reads0) == 3 and reads1 == []  # actor, reference, critic: rank 0 only
    assert sum0 == weights_checksum(load_file(str(tiny_model_dir / "model.safetensors")))
    assert sum1 is None
    torch.testing.assert_close(torch.cat([lp0, lp1]), hf_log_probs(tiny_model_dir, td),
                               atol=1e-4, rtol=1e-4)
    assert frozen0 and frozen1
    torch.testing.assert_close(head0, head1)  # the value head too: rank 0's, broadcast
    assert buf0.keys() == buf1.keys() and buf0
    for name in buf0:
        torch.testing.assert_close(buf0[name], buf1[name])
