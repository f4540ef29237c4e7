"""Multi-turn rollouts on vLLM: engine, chat-template deltas, episodes, rollout workers.

- `engine`: `VLLMEngine` (token ids in; ids, log-probs, finish reason out; new weights in
  place through ``engine.weights``, its `toolrl.weights.engine_routes.EngineWeightRoutes`),
  `EngineConfig`, `SamplingConfig`. How weights reach vLLM's worker is `toolrl.weights`.
- `chat`: `ChatRenderer` (first prompt, per-turn deltas, prefix-preserving check).
- `episode`: `EpisodeRunner` (one episode -> its `Trajectory`; subclass its hooks to change
  the loop).
- `worker`: `RolloutWorker` (a controller Worker running episodes concurrently).

The package imports nothing itself: the public names are in ``toolrl``.
"""
