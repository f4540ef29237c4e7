"""FSDP2 training workers: actor, reference, critic, and the actor -> vLLM weight sync.

- `actor`: `ActorConfig`, `FSDPActor` (log-probs, PPO update), `FSDPReference` (frozen),
  and their controller workers `ActorWorker`, `RefWorker`.
- `critic`: `CriticConfig`, `FSDPCritic` (values, clipped value loss), `CriticWorker`.
- `weights`: `WeightSync` (the full weights streamed to engines bucket by bucket, never whole;
  policy version), `WeightSyncGroup` (a dedicated broadcast group for split pools),
  `weights_checksum`.
- `base` / `fsdp` / `micro_batch` / `forward`: the shared FSDP2 model, PPO loop, sharding
  helpers, micro-batch planning and input packing.
"""
