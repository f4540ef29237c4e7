"""Multi-turn rollouts on vLLM: engine, chat-template deltas, episodes, rollout workers.

- `engine`: `VLLMEngine` (token ids in; ids, log-probs, finish reason out; in-place
  `load_weights`, bucket by bucket), `EngineConfig`, `SamplingConfig`.
- `weight_transfer`: how a bucket of weights reaches vLLM's worker (shared-memory staging and
  the worker extension on CPU, vLLM's IPC / NCCL weight transfer on GPU).
- `chat`: `ChatRenderer` (first prompt, per-turn deltas, prefix-preserving check).
- `episode`: `EpisodeRunner` (one episode -> its `Trajectory`; subclass its hooks to change
  the loop).
- `worker`: `RolloutWorker` (a controller Worker running episodes concurrently).

The package imports nothing itself: vLLM imports ``toolrl.rollout.weight_transfer`` inside its
own worker processes, and the public names are in ``toolrl``.
"""
