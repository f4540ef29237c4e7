"""OpenAI's Responses API (``POST /v1/responses``) as a translation onto the gateway's call.

A request becomes a `ChatRequest` (`ResponsesAPI.resolve`):

- ``instructions`` is a system message first; ``input`` (a string: one user message; or items)
  becomes chat messages: a ``message`` item (``user``, ``assistant``, ``system``,
  ``developer``; text content) one message; ``function_call`` items the tool calls of the
  assistant message they follow (or of a new one); a ``function_call_output`` a tool message
  (named by the call it answers);
- ``previous_response_id`` (an episode route only) continues that response's conversation,
  which the episode keeps: its input items and output, without its instructions (as OpenAI
  does); ``store: false`` keeps a response out of it;
- ``tools`` (function tools) become chat tools, ``tool_choice`` (``none``, ``auto``,
  ``required``, ``{"type": "function", "name": ...}``), ``temperature``, ``top_p``,
  ``max_output_tokens`` and ``include: ["message.output_text.logprobs"]`` their chat
  counterparts.

The reply is a ``response`` object (`ResponsesAPI.answer`): an ``output`` of a ``message`` item
(``output_text``) when there is text, then one ``function_call`` item per call (``call_id``,
``name``, JSON ``arguments``); ``status`` ``incomplete`` with ``incomplete_details.reason``
``max_output_tokens`` when the token budget cut it; ``usage`` in input / output tokens. With
``stream: true`` the same object arrives as the Responses API's events (`ResponsesAPI.events`:
``response.created``, ``response.output_item.added``, ``response.output_text.delta``, ...,
``response.completed``). What the gateway cannot honour (other tool types, images, reasoning,
``background``, ``conversation``, ``truncation: "auto"``, ``parallel_tool_calls: false``, a
structured ``text.format``, an unknown argument) is a 400 in OpenAI's error shape.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl.rollout.gateway.protocol import (
    API,
    ChatRequest,
    Reply,
    RequestError,
    bool_field,
    is_int,
    named_tool_choice,
    new_id,
    number_field,
    objects,
    request_model,
    sse,
    string_tool_choice,
)

__all__ = ["ResponsesAPI", "ResponsesRequest"]

# Accepted and ignored: they change nothing about what is sampled.
_IGNORED = ("metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
            "prompt_cache_options", "service_tier", "stream_options")
_KNOWN = ("model", "input", "instructions", "tools", "tool_choice", "temperature", "top_p",
          "max_output_tokens", "stream", "previous_response_id", "store", "include",
          "parallel_tool_calls", "text", "reasoning", "truncation", "top_logprobs",
          "max_tool_calls", "background", "conversation", "prompt", "context_management",
          *_IGNORED)
LOGPROBS = "message.output_text.logprobs"
_TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass
class ResponsesRequest:
    """A validated ``POST /v1/responses`` body: ``items`` are the input items as given
    (checked), ``chat`` the request's sampling and tools in the chat form (its messages are
    filled in by `ResponsesAPI.resolve`)."""

    model: str
    items: list[dict[str, Any]]
    chat: ChatRequest
    body: dict[str, Any]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    tools: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def parse(cls, body: Any) -> ResponsesRequest:
        model = request_model(body, _KNOWN, unknown=lambda key: RequestError(
            f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter"),
            missing=RequestError("Missing required parameter: 'model'.", param="model",
                                 code="missing_required_parameter"))
        _refuse_unsupported(body)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise RequestError("instructions must be a string", param="instructions")
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise RequestError("previous_response_id must be a string",
                               param="previous_response_id")
        include = body.get("include") or []
        if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
            raise RequestError("include must be an array of strings", param="include")
        tools = _tools(body.get("tools"))
        chat = ChatRequest(
            model=model, messages=[], tools=tools,
            tool_choice=_tool_choice(body.get("tool_choice"), tools),
            temperature=number_field(body, "temperature", 1.0, 0.0, 2.0),
            top_p=number_field(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
            max_tokens=_max_output_tokens(body.get("max_output_tokens")),
            logprobs=LOGPROBS in include, stream=bool_field(body, "stream"))
        store = body.get("store")
        return cls(model=model, items=_items(body.get("input")), chat=chat, body=dict(body),
                   instructions=instructions, previous_response_id=previous,
                   store=True if store is None else bool_field(body, "store"),
                   stream=chat.stream, tools=list(body.get("tools") or []))


class ResponsesAPI(API):
    """OpenAI's Responses API (``/v1/responses``); see the module docstring."""

    name = "responses"

    def parse(self, body: Any) -> ResponsesRequest:
        return ResponsesRequest.parse(body)

    def resolve(self, req: ResponsesRequest, capture: Any) -> ChatRequest:
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            if capture is None:
                raise RequestError("previous_response_id needs an episode route "
                                   "(/episodes/{id}/v1): the plain route keeps no responses",
                                   param="previous_response_id")
            if req.previous_response_id not in capture.conversations:
                raise RequestError(f"Previous response with id '{req.previous_response_id}' "
                                   f"not found.", param="previous_response_id",
                                   code="previous_response_not_found")
            history = list(capture.conversations[req.previous_response_id])
        messages = [*history, *input_messages(req.items, history)]
        if not messages:
            raise RequestError("input must hold at least one item", param="input")
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        req.chat.messages = [*system, *messages]
        return req.chat

    def answer(self, req: ResponsesRequest, chat: ChatRequest, reply: Reply,
               capture: Any) -> dict[str, Any]:
        rid = new_id("resp_")
        if capture is not None and req.store:  # the conversation, instructions aside
            start = 1 if req.instructions else 0
            capture.conversations[rid] = [*chat.messages[start:], _echo(reply.message)]
        return response_object(req, rid, reply)

    def events(self, req: ResponsesRequest, answer: Mapping[str, Any], reply: Reply
               ) -> Iterator[str]:
        return stream_events(answer, reply)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    def refuse(key: str, why: str) -> None:
        raise RequestError(f"{key} {why}", param=key)

    if body.get("background"):
        refuse("background", "is not supported: the gateway answers each request at once")
    for key in ("conversation", "prompt", "context_management"):
        if body.get(key) is not None:
            refuse(key, "is not supported: send the input items (or previous_response_id)")
    if body.get("truncation") not in (None, "disabled"):
        refuse("truncation", "'auto' is not supported: a conversation past the token budget "
                             "is refused (context_length_exceeded), never cut")
    if body.get("parallel_tool_calls") is False:
        refuse("parallel_tool_calls", "=false is not supported: a reply carries every call "
                                      "the model wrote")
    if body.get("top_logprobs") not in (None, 0):
        refuse("top_logprobs", "is not supported (include "
                               "'message.output_text.logprobs' gives the sampled tokens')")
    if body.get("max_tool_calls") is not None:
        refuse("max_tool_calls", "is not supported: a reply carries every call the model "
                                 "wrote")
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, Mapping) or any(
            reasoning.get(k) not in (None, "none") for k in reasoning)):
        refuse("reasoning", "is not supported: the policy is sampled as its chat template "
                            "renders it (leave reasoning unset)")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, Mapping) else "?"
        if fmt is not None and (not isinstance(fmt, Mapping) or fmt.get("type") != "text"):
            refuse("text", "formats other than {'format': {'type': 'text'}} are not supported")


def _max_output_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if not is_int(value) or value < 1:
        raise RequestError(f"max_output_tokens must be a positive integer, got {value!r}",
                           param="max_output_tokens")
    return int(value)


def _items(value: Any) -> list[dict[str, Any]]:
    """The input as checked items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise RequestError("input must be a string or an array of input items", param="input")
    out = []
    for where, item in objects(value, "input"):
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(f"Invalid value for '{where}.role': {role!r}; supported "
                                   f"values are 'user', 'assistant', 'system' and 'developer'",
                                   param=f"{where}.role")
            _text(item.get("content"), f"{where}.content")
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise RequestError(f"{where}.{key} must be a string", param=f"{where}.{key}")
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"{where}.call_id must be a string", param=f"{where}.call_id")
            _text(item.get("output"), f"{where}.output")
        else:
            raise RequestError(f"{where}: input items of type {kind!r} are not supported (the "
                               f"gateway takes message, function_call and function_call_output "
                               f"items)", param=f"{where}.type")
        out.append({**item, "type": kind})
    return out


def _text(content: Any, where: str) -> str:
    """Text content: a string, or text parts (``input_text`` / ``output_text``) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or an array of text parts", param=where)
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") not in _TEXT_PARTS or \
                not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, Mapping) else None
            raise RequestError(f"{where}[{j}]: content parts of type {kind!r} are not "
                               f"supported (text only: input_text, output_text)",
                               param=f"{where}[{j}]")
    return "".join(part["text"] for part in content)


def input_messages(items: Sequence[Mapping[str, Any]],
                   history: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Checked input items as chat messages: ``function_call`` items join the assistant
    message they follow (else start one with no text); a ``function_call_output`` is a tool
    message named by its call (in the items or in ``history``, the chat messages before)."""
    names = {c["id"]: c["function"]["name"] for m in history
             for c in m.get("tool_calls") or ()}
    names.update({it["call_id"]: it["name"] for it in items if it["type"] == "function_call"})
    out: list[dict[str, Any]] = []
    turn_open = False  # the last message is an assistant turn that calls may join
    for it in items:
        kind = it["type"]
        if kind == "message":
            out.append({"role": it["role"], "content": _text(it["content"], "input")})
            turn_open = it["role"] == "assistant"
        elif kind == "function_call":
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}
            if turn_open:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                turn_open = True
        else:
            tool = {"role": "tool", "tool_call_id": it["call_id"],
                    "content": _text(it["output"], "input")}
            name = it.get("name") if isinstance(it.get("name"), str) else \
                names.get(it["call_id"])
            if name:
                tool["name"] = name
            out.append(tool)
            turn_open = False
    return out


def _echo(message: Mapping[str, Any]) -> dict[str, Any]:
    """The reply as the conversation keeps it (chat form)."""
    out = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = list(message["tool_calls"])
    return out


def _tools(value: Any) -> list[dict[str, Any]]:
    """Function tools in the chat form (``name``, ``description``, ``parameters``)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError("tools must be an array", param="tools")
    out = []
    for i, t in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(t, Mapping) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, Mapping) else None
            raise RequestError(f"{where}: tools of type {kind!r} are not supported (function "
                               f"tools only)", param=f"{where}.type")
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise RequestError(f"{where}.name must be a non-empty string", param=f"{where}.name")
        if t.get("parameters") is not None and not isinstance(t["parameters"], Mapping):
            raise RequestError(f"{where}.parameters must be a JSON schema object",
                               param=f"{where}.parameters")
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        if t.get("parameters") is not None:
            fn["parameters"] = dict(t["parameters"])
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(value: Any, tools: Sequence[Mapping[str, Any]]) -> str | dict[str, Any]:
    if (choice := string_tool_choice(value, tools)) is not None:
        return choice
    if not isinstance(value, Mapping) or value.get("type") != "function" or \
            not isinstance(value.get("name"), str):
        raise RequestError("tool_choice must be 'none', 'auto', 'required' or {'type': "
                           "'function', 'name': ...}", param="tool_choice")
    return named_tool_choice(value["name"], tools)


# --- the response ---------------------------------------------------------------------------
def response_object(req: ResponsesRequest, rid: str, reply: Reply) -> dict[str, Any]:
    """The ``response`` object of a finished reply."""
    cut = reply.finish_reason == "length"
    output: list[dict[str, Any]] = []
    if reply.text or not reply.calls:
        part: dict[str, Any] = {"type": "output_text", "text": reply.text, "annotations": []}
        if reply.logprobs is not None:
            part["logprobs"] = [_logprob(x) for x in reply.logprobs]
        output.append({"id": new_id("msg_"), "type": "message", "role": "assistant",
                       "status": "incomplete" if cut else "completed", "content": [part]})
    for call in reply.calls:
        output.append({"id": new_id("fc_"), "type": "function_call",
                       "call_id": call["id"], "name": call["function"]["name"],
                       "arguments": call["function"]["arguments"], "status": "completed"})
    body = req.body
    choice = body.get("tool_choice")
    return {
        "id": rid, "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": req.instructions, "max_output_tokens": req.chat.max_tokens,
        "model": req.model, "output": output, "parallel_tool_calls": True,
        "previous_response_id": req.previous_response_id, "reasoning": None,
        "store": req.store, "temperature": req.chat.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": choice if choice is not None else ("auto" if req.tools else "none"),
        "tools": req.tools, "top_p": req.chat.top_p, "truncation": "disabled",
        "usage": {"input_tokens": reply.prompt_tokens,
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": reply.completion_tokens,
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": reply.prompt_tokens + reply.completion_tokens},
        "user": body.get("user"), "metadata": body.get("metadata") or {}}


def _logprob(x: Mapping[str, Any]) -> dict[str, Any]:
    return {"token": x["token"], "logprob": x["logprob"], "bytes": x["bytes"],
            "top_logprobs": []}


def stream_events(response: Mapping[str, Any], reply: Reply) -> Iterator[str]:
    """The Responses API's server-sent events of a finished ``response``: created and in
    progress, each output item added, its text deltas (the reply's pieces) or its arguments,
    done, then ``response.completed`` (``response.incomplete`` when cut)."""
    seq = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> str:
        return sse(kind, {"type": kind, "sequence_number": next(seq), **data})

    start = {**response, "status": "in_progress", "output": [], "usage": None,
             "incomplete_details": None}
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    lps = reply.logprobs
    for k, item in enumerate(response["output"]):
        at = {"output_index": k}
        if item["type"] == "message":
            [part] = item["content"]
            yield event("response.output_item.added", **at,
                        item={**item, "status": "in_progress", "content": []})
            ids = {**at, "item_id": item["id"], "content_index": 0}
            yield event("response.content_part.added", **ids,
                        part={"type": "output_text", "text": "", "annotations": []})
            per_token = lps is not None and len(reply.pieces) == len(lps)
            for j, piece in enumerate(reply.pieces):
                if piece:
                    lp = [_delta_logprob(lps[j])] if per_token else []
                    yield event("response.output_text.delta", **ids, delta=piece, logprobs=lp)
            yield event("response.output_text.done", **ids, text=part["text"],
                        logprobs=[_delta_logprob(x) for x in lps or ()])
            yield event("response.content_part.done", **ids, part=part)
        else:
            yield event("response.output_item.added", **at,
                        item={**item, "arguments": "", "status": "in_progress"})
            ids = {**at, "item_id": item["id"]}
            yield event("response.function_call_arguments.delta", **ids,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", **ids,
                        arguments=item["arguments"])
        yield event("response.output_item.done", **at, item=item)
    done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield event(done, response=response)


def _delta_logprob(x: Mapping[str, Any]) -> dict[str, Any]:
    return {"token": x["token"], "logprob": x["logprob"], "top_logprobs": []}
