"""FSDP2 training workers: actor, reference, critic, and the actor -> vLLM weight sync.

- `actor`: `ActorConfig`, `FSDPActor` (log-probs, PPO update), `FSDPReference` (frozen),
  and their controller workers `ActorWorker`, `RefWorker`.
- `critic`: `CriticConfig`, `FSDPCritic` (values, clipped value loss), `CriticWorker`.
- `weight_push`: `WeightSync`, the actor's end of weight sync (the full weights gathered and
  streamed to engines bucket by bucket, never whole; policy version); the routes and what both
  ends share (buckets, `WeightSyncGroup`, `weights_checksum`) are in `toolrl.weights`.
- `base` / `fsdp` / `micro_batch` / `forward`: the shared FSDP2 model, PPO loop, sharding
  helpers, micro-batch planning and input packing.
- `scoring` / `varlen`: log-probs and entropy of response tokens (layouts, chunked LM head);
  the packed layout's variable-length attention with torch's own kernel on CUDA.
- `host_memory`: `release_memory`, a freed model's memory handed back to the OS.
"""
