"""An OpenAI-compatible gateway on a rollout worker's engine, with exact token capture.

- `app`: `Gateway` (``/v1/chat/completions``, ``/v1/models``, and the same under
  ``/episodes/{id}/v1`` for a captured episode).
- `protocol`: OpenAI's request checks, response and stream shapes, errors.
- `capture`: `EpisodeCapture` (per-call prompt ids, sampled ids, log-probs) and the merge of
  an episode's calls into training samples.
- `server`: `GatewayServer` (uvicorn on loopback, on a daemon thread).
- `agent`: `AgentRunner` (``rollout.agent``: your own agent against the gateway, one episode
  per task row, as a `Trajectory`).
"""
