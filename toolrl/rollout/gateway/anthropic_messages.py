"""Anthropic's Messages API (``POST /v1/messages``) as a translation onto the gateway's call.

A request becomes a `ChatRequest` (`MessagesRequest.parse`):

- ``system`` (a string or text blocks) is a system message first; each message of
  ``messages`` (content a string or blocks) becomes chat messages: an assistant message's
  ``text`` blocks its content and its ``tool_use`` blocks its tool calls; a user message's
  ``tool_result`` blocks one tool message each (named by the call it answers), then its
  ``text`` blocks one user message;
- ``tools`` (custom tools: ``name``, ``description``, ``input_schema``) become chat tools,
  ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` the chat ``auto`` / ``required`` /
  a named function / ``none``; ``max_tokens``, ``temperature``, ``top_p``, ``top_k`` and
  ``stop_sequences`` their sampling counterparts.

The reply is a ``message`` (`message_object`): a ``text`` block when there is text, then one
``tool_use`` block per call (``id``, ``name``, ``input``), with ``stop_reason`` ``tool_use``,
``end_turn``, ``stop_sequence`` (and which, in ``stop_sequence``) or ``max_tokens``; ``usage``
in input / output tokens. With ``stream: true`` the same message arrives as the Messages
API's event sequence (`stream_events`: ``message_start``, ``content_block_start`` /
``content_block_delta`` / ``content_block_stop`` per block, ``message_delta``,
``message_stop``). What the gateway cannot honour (images and documents, thinking, server
tools, a final assistant message to continue, ``disable_parallel_tool_use``, an unknown
field) is refused in Anthropic's error shape: ``{"type": "error", "error": {"type":
"invalid_request_error", "message": ...}}`` with the matching status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolrl.rollout.gateway.protocol import (
    API,
    ChatRequest,
    Reply,
    RequestError,
    bool_field,
    is_int,
    new_id,
    number_field,
    request_model,
    sse,
)

__all__ = ["MessagesAPI", "MessagesRequest", "error_object", "message_object", "stream_events"]

# Accepted and ignored: they change nothing about what is sampled.
_IGNORED = ("metadata", "service_tier", "cache_control", "inference_geo", "speed",
            "diagnostics", "user_profile_id", "workspace_id")
_KNOWN = ("model", "messages", "max_tokens", "system", "tools", "tool_choice", "temperature",
          "top_p", "top_k", "stop_sequences", "stream", "thinking", "output_config",
          "container", "mcp_servers", "context_management", *_IGNORED)
# Anthropic's error type of each status
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 504: "timeout_error",
               529: "overloaded_error"}


def error_object(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body for an HTTP ``status``."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message},
            "request_id": new_id("req_", 24)}


@dataclass
class MessagesRequest:
    """A validated ``POST /v1/messages`` body, its ``chat`` translation beside it."""

    model: str
    chat: ChatRequest
    stream: bool = False

    @classmethod
    def parse(cls, body: Any) -> MessagesRequest:
        model = request_model(body, _KNOWN, unknown=lambda key: RequestError(
            f"{key}: Extra inputs are not permitted", param=key),
            missing=RequestError("model: Field required", param="model"))
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            raise RequestError("max_tokens: Field required", param="max_tokens")
        if not is_int(max_tokens) or max_tokens < 1:
            raise RequestError(f"max_tokens: must be a positive integer, got {max_tokens!r}",
                               param="max_tokens")
        _refuse_unsupported(body)
        tools = _tools(body.get("tools"))
        top_k = body.get("top_k")
        if top_k is not None and (not is_int(top_k) or top_k < 0):
            raise RequestError(f"top_k: must be a non-negative integer, got {top_k!r}",
                               param="top_k")
        chat = ChatRequest(
            model=model, messages=chat_messages(body.get("system"), body.get("messages")),
            tools=tools, tool_choice=_tool_choice(body.get("tool_choice"), tools),
            temperature=number_field(body, "temperature", 1.0, 0.0, 1.0),
            top_p=number_field(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
            max_tokens=int(max_tokens), stop=_stop_sequences(body.get("stop_sequences")),
            stream=bool_field(body, "stream"), top_k=top_k or -1)
        return cls(model=model, chat=chat, stream=chat.stream)


class MessagesAPI(API):
    """Anthropic's Messages API (``/v1/messages``); see the module docstring."""

    name = "messages"
    call_prefix = "toolu_"

    def parse(self, body: Any) -> MessagesRequest:
        return MessagesRequest.parse(body)

    def resolve(self, req: MessagesRequest, capture: Any) -> ChatRequest:
        return req.chat

    def answer(self, req: MessagesRequest, chat: ChatRequest, reply: Reply,
               capture: Any) -> dict[str, Any]:
        return message_object(req.model, reply)

    def events(self, req: MessagesRequest, answer: Mapping[str, Any], reply: Reply
               ) -> Iterator[str]:
        return stream_events(answer, reply)

    def error(self, e: RequestError) -> tuple[dict[str, Any], int]:
        return error_object(e.status, e.message), e.status


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    thinking = body.get("thinking")
    if thinking is not None and (not isinstance(thinking, Mapping) or
                                 thinking.get("type") != "disabled"):
        raise RequestError("thinking: not supported; the policy is sampled as its chat "
                           "template renders it (leave thinking unset or disabled)",
                           param="thinking")
    if body.get("output_config"):
        raise RequestError("output_config: not supported (no structured outputs or effort "
                           "levels)", param="output_config")
    for key in ("container", "context_management"):
        if body.get(key) is not None:
            raise RequestError(f"{key}: not supported by this gateway", param=key)
    if body.get("mcp_servers"):
        raise RequestError("mcp_servers: not supported (the agent runs its own tools)",
                           param="mcp_servers")


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise RequestError("stop_sequences: must be an array of non-empty strings",
                           param="stop_sequences")
    return tuple(value)


def _text_blocks(content: Any, where: str) -> str:
    """A string, or ``text`` blocks joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}: must be a string or an array of text blocks", param=where)
    for j, block in enumerate(content):
        if not isinstance(block, Mapping) or block.get("type") != "text" or \
                not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, Mapping) else None
            raise RequestError(f"{where}.{j}: blocks of type {kind!r} are not supported here "
                               f"(text only)", param=f"{where}.{j}")
    return "".join(block["text"] for block in content)


def chat_messages(system: Any, messages: Any) -> list[dict[str, Any]]:
    """``system`` and ``messages`` as chat messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        text = _text_blocks(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: must be a non-empty array", param="messages")
    names: dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, Mapping):
            raise RequestError(f"{where}: must be an object", param=where)
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant", "system"):
            raise RequestError(f"{where}.role: Input should be 'user', 'assistant' or "
                               f"'system', got {role!r}", param=f"{where}.role")
        if role == "system":
            out.append({"role": "system", "content": _text_blocks(content, f"{where}.content")})
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise RequestError(f"{where}.content: must be a string or an array of content "
                               f"blocks", param=f"{where}.content")
        if role == "assistant":
            out.append(_assistant(blocks, f"{where}.content", names))
        else:
            out += _user(blocks, f"{where}.content", names)
    if messages[-1].get("role") == "assistant":
        raise RequestError(f"messages.{len(messages) - 1}: a final assistant message "
                           f"(prefill) is not supported; end with a user message",
                           param="messages")
    return out


def _assistant(blocks: Sequence[Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    texts, calls = [], []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, Mapping) else None
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or \
                    not isinstance(b.get("input"), Mapping):
                raise RequestError(f"{where}.{j}: a tool_use block needs an id, a name and an "
                                   f"input object", param=f"{where}.{j}")
            names[b["id"]] = b["name"]
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": dict(b["input"])}})
        else:
            raise RequestError(f"{where}.{j}: blocks of type {kind!r} are not supported in an "
                               f"assistant message (text and tool_use only)",
                               param=f"{where}.{j}")
    text = "".join(texts)
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls
                               else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: Sequence[Any], where: str, names: Mapping[str, str]) -> list[dict[str, Any]]:
    tools, texts = [], []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, Mapping) else None
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise RequestError(f"{where}.{j}.tool_use_id: Field required",
                                   param=f"{where}.{j}.tool_use_id")
            tool = {"role": "tool", "tool_call_id": b["tool_use_id"],
                    "content": _text_blocks(b.get("content", ""), f"{where}.{j}.content")}
            if b["tool_use_id"] in names:
                tool["name"] = names[b["tool_use_id"]]
            tools.append(tool)
        else:
            raise RequestError(f"{where}.{j}: blocks of type {kind!r} are not supported in a "
                               f"user message (text and tool_result only)",
                               param=f"{where}.{j}")
    if texts or not tools:
        return [*tools, {"role": "user", "content": "".join(texts)}]
    return tools


def _tools(value: Any) -> list[dict[str, Any]]:
    """Custom tools in the chat form (``name``, ``description``, ``parameters``)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError("tools: must be an array", param="tools")
    out = []
    for i, t in enumerate(value):
        where = f"tools.{i}"
        if not isinstance(t, Mapping) or t.get("type") not in (None, "custom"):
            kind = t.get("type") if isinstance(t, Mapping) else None
            raise RequestError(f"{where}: tools of type {kind!r} are not supported (custom "
                               f"tools with an input_schema only)", param=where)
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise RequestError(f"{where}.name: Field required", param=f"{where}.name")
        if not isinstance(t.get("input_schema"), Mapping):
            raise RequestError(f"{where}.input_schema: Field required",
                               param=f"{where}.input_schema")
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        fn["parameters"] = dict(t["input_schema"])
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(value: Any, tools: Sequence[Mapping[str, Any]]) -> str | dict[str, Any]:
    if value is None:
        return "auto" if tools else "none"
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise RequestError("tool_choice: must be {'type': 'auto' | 'any' | 'tool' | 'none'}",
                           param="tool_choice")
    if value.get("disable_parallel_tool_use"):
        raise RequestError("tool_choice.disable_parallel_tool_use: not supported: a reply "
                           "carries every call the model wrote", param="tool_choice")
    if kind in ("any", "tool") and not tools:
        raise RequestError(f"tool_choice: type {kind!r} needs tools", param="tool_choice")
    if kind == "tool":
        name = value.get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise RequestError(f"tool_choice.name: {name!r} is not in tools",
                               param="tool_choice")
        return {"type": "function", "function": {"name": name}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


# --- the message ----------------------------------------------------------------------------
def stop_reason(reply: Reply) -> str:
    if reply.finish_reason == "length":
        return "max_tokens"
    if reply.calls:
        return "tool_use"
    return "stop_sequence" if reply.stop else "end_turn"


def message_object(model: str, reply: Reply) -> dict[str, Any]:
    """The ``message`` of a finished reply."""
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for call in reply.calls:
        args = json.loads(call["function"]["arguments"])
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": args if isinstance(args, dict) else {"value": args}})
    reason = stop_reason(reply)
    return {"id": new_id("msg_", 24), "type": "message", "role": "assistant",
            "model": model, "content": content, "stop_reason": reason,
            "stop_sequence": reply.stop if reason == "stop_sequence" else None,
            "usage": {"input_tokens": reply.prompt_tokens,
                      "output_tokens": reply.completion_tokens,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def stream_events(message: Mapping[str, Any], reply: Reply) -> Iterator[str]:
    """The Messages API's server-sent events of a finished ``message``: ``message_start``,
    each block's start, deltas (the text's pieces, the tool input's JSON) and stop,
    ``message_delta`` (stop reason, output tokens), ``message_stop``."""
    def event(kind: str, **data: Any) -> str:
        return sse(kind, {"type": kind, **data})

    usage = message["usage"]
    yield event("message_start", message={
        **message, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0}})
    yield event("ping")
    for k, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield event("content_block_start", index=k,
                        content_block={"type": "text", "text": ""})
            for piece in reply.pieces:
                if piece:
                    yield event("content_block_delta", index=k,
                                delta={"type": "text_delta", "text": piece})
        else:
            yield event("content_block_start", index=k,
                        content_block={**block, "input": {}})
            yield event("content_block_delta", index=k, delta={
                "type": "input_json_delta", "partial_json": json.dumps(block["input"],
                                                                       ensure_ascii=False)})
        yield event("content_block_stop", index=k)
    yield event("message_delta", delta={"stop_reason": message["stop_reason"],
                                        "stop_sequence": message["stop_sequence"]},
                usage={"output_tokens": usage["output_tokens"]})
    yield event("message_stop")
