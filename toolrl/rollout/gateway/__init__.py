"""A gateway on a rollout worker's engine that speaks OpenAI's and Anthropic's APIs, with exact
token capture.

- `app`: `Gateway` (``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages``,
  ``/v1/models``, and the same under ``/episodes/{id}/v1`` for a captured episode): every API
  a translation onto one call (`Gateway.reply`).
- `protocol`: what the APIs share (`ChatRequest`, `Reply`, `RequestError`, `API`) and OpenAI's
  Chat Completions: request checks, response and stream shapes, errors.
- `openai_responses`: OpenAI's Responses API (input items, ``previous_response_id``, events).
- `anthropic_messages`: Anthropic's Messages API (content blocks, events, error shape).
- `capture`: `EpisodeCapture` (per-call prompt ids, sampled ids, log-probs) and the merge of
  an episode's calls into training samples.
- `server`: `GatewayServer` (uvicorn on loopback, on a daemon thread).
- `agent`: `AgentRunner` (``rollout.agent``: your own agent against the gateway, one episode
  per task row, as a `Trajectory`).
"""

from typing import Literal, get_args

AgentClient = Literal["openai", "anthropic"]
"""The client a gateway agent's ``solve`` gets (``rollout.agent_client``)."""
CLIENTS: tuple[str, ...] = get_args(AgentClient)
