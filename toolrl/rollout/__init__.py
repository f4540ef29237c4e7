"""Multi-turn rollouts on vLLM: engine, chat-template deltas, episodes, rollout workers.

- `engine`: `VLLMEngine` (token ids in; ids, log-probs, finish reason out; in-place
  `load_weights`), `EngineConfig`, `SamplingConfig`.
- `chat`: `ChatRenderer` (first prompt, per-turn deltas, prefix-preserving check).
- `episode`: `EpisodeRunner` (one episode -> its `Trajectory`; subclass its hooks to change
  the loop).
- `worker`: `RolloutWorker` (a controller Worker running episodes concurrently).
"""
