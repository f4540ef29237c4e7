"""Weight sync between the actors and the rollout engines, the part both ends use.

- `weights`: buckets (`iter_buckets`, `meta_buckets`), `Checksum` / `weights_checksum`,
  `WeightSyncGroup` (the broadcast group of split pools), the registry of engines that live in
  this process (`register_local_engine`) and `engine_loader`.
- `canary`: the weight-sync canary's probe, tolerances and verdict (engine vs actor
  log-probs after each push).

The actor's end (`toolrl.workers.weights.WeightSync`) and the rollout's end
(`toolrl.rollout.worker.RolloutWorker`, the engine's `toolrl.rollout.weight_transfer`) both
import it; ``sync`` imports neither, so rollout never imports ``workers``.
"""
