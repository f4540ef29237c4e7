"""OpenAI's chat-completions wire format: request validation, responses, stream chunks, errors;
and what every API of the gateway shares.

`ChatRequest` is the one request the gateway serves (`Gateway.reply`): the chat route parses
it from the body (`ChatRequest.parse`, checked the way OpenAI's API does), the Responses and
Messages routes translate their bodies into it (`openai_responses`, `anthropic_messages`).
`Reply` is what one call answered, before any API's shape. `RequestError` is a refused request
(a 4xx status with a message, a ``param``, a ``code``); each route renders it in its API's own
error shape (here OpenAI's ``{"error": {"message", "type", "param", "code"}}``) for what the
gateway cannot honour: malformed fields, ``n > 1``, an unknown role, a named tool that is not
offered, an unknown argument.
"""

from __future__ import annotations

import abc
import json
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["API", "ChatAPI", "ChatRequest", "Reply", "RequestError", "chat_completion",
           "error_body", "sse", "stream_chunks"]

ROLES = ("system", "developer", "user", "assistant", "tool")
# Accepted and ignored: they change nothing about what is sampled.
_IGNORED = ("user", "metadata", "store", "service_tier", "stream_options")
_KNOWN = ("model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens",
          "max_completion_tokens", "stop", "seed", "logprobs", "n", "stream",
          "frequency_penalty", "presence_penalty", "response_format", "top_logprobs",
          "parallel_tool_calls", *_IGNORED)


class RequestError(Exception):
    """A refused request: HTTP ``status``, OpenAI's error ``type``, ``param`` and ``code``
    (`body`: OpenAI's shape; the Messages route renders it in Anthropic's)."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.type = message, status, type
        self.param, self.code = param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body (or another API's body translated:
    chat messages, tools in the chat form). ``top_k`` (-1: off) comes from APIs that have it
    (Anthropic's); the chat body has none."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    top_k: int = -1

    @property
    def forced_tool(self) -> str | None:
        """The tool a named ``tool_choice`` forces (None otherwise)."""
        if isinstance(self.tool_choice, dict):
            return self.tool_choice["function"]["name"]
        return None

    @property
    def parses_calls(self) -> bool:
        """Whether the reply's tool calls are parsed (tools offered, ``tool_choice`` not
        ``none``)."""
        return bool(self.tools) and self.tool_choice != "none"

    @classmethod
    def parse(cls, body: Any) -> ChatRequest:
        model = request_model(body, _KNOWN, unknown=lambda key: RequestError(
            f"Unrecognized request argument supplied: {key}", param=key),
            missing=RequestError("you must provide a model parameter", param="model"))
        n = body.get("n", 1)
        if n is not None and (not is_int(n) or n != 1):
            raise RequestError(f"n={n!r} is not supported: the gateway samples one choice per "
                              f"request (send one request per sample)", param="n")
        for key in ("frequency_penalty", "presence_penalty"):
            if body.get(key) not in (None, 0, 0.0):
                raise RequestError(f"{key} is not supported (the policy's own distribution is "
                                  f"what trains)", param=key)
        if body.get("top_logprobs") not in (None, 0):
            raise RequestError("top_logprobs is not supported (logprobs=true gives the sampled "
                              "tokens' log-probs)", param="top_logprobs")
        if body.get("parallel_tool_calls") is False:
            raise RequestError("parallel_tool_calls=false is not supported: a reply carries every "
                              "call the model wrote", param="parallel_tool_calls")
        fmt = body.get("response_format")
        if fmt is not None and (not isinstance(fmt, Mapping) or fmt.get("type") != "text"):
            raise RequestError("response_format other than {'type': 'text'} is not supported",
                              param="response_format")
        messages = _messages(body.get("messages"))
        tools = _tools(body.get("tools"))
        req = cls(model=model, messages=messages, tools=tools,
                  tool_choice=_tool_choice(body.get("tool_choice"), tools),
                  temperature=number_field(body, "temperature", 1.0, 0.0, 2.0),
                  top_p=number_field(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
                  max_tokens=_max_tokens(body), stop=_stop(body.get("stop")),
                  seed=_seed(body.get("seed")), logprobs=bool_field(body, "logprobs"),
                  stream=bool_field(body, "stream"))
        options = body.get("stream_options")
        if options is not None:
            if not isinstance(options, Mapping):
                raise RequestError("stream_options must be an object", param="stream_options")
            if not req.stream:
                raise RequestError("stream_options is only allowed when stream is true",
                                  param="stream_options")
            req.include_usage = bool(options.get("include_usage", False))
        return req


def request_model(body: Any, known: Sequence[str], *, unknown: Callable[[str], RequestError],
                  missing: RequestError) -> str:
    """The ``model`` of a request body, a JSON object with no key outside ``known``; each API
    refuses an unknown key (``unknown(key)``) and a missing model (``missing``) in its own
    words."""
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    extra = sorted(set(body) - set(known))
    if extra:
        raise unknown(extra[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise missing
    return model


def objects(items: Sequence[Any], name: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(where, item)`` for each item of the array ``name``, ``where`` its OpenAI-style path
    (``input[2]``); an item that is not an object is refused."""
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        if not isinstance(item, Mapping):
            raise RequestError(f"{where} must be an object", param=where)
        yield where, item


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def bool_field(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be a boolean, got {value!r}", param=key)
    return value


def number_field(body: Mapping[str, Any], key: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value > high or \
            value < low or (low_open and value <= low):
        side = "(" if low_open else "["
        raise RequestError(f"{key} must be a number in {side}{low:g}, {high:g}], got {value!r}",
                          param=key)
    return float(value)


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not is_int(value) or value < 1:
            raise RequestError(f"{key} must be a positive integer, got {value!r}", param=key)
        return int(value)
    return None


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > 4 or \
            not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of up to 4 of them",
                          param="stop")
    return tuple(stops)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if not is_int(value):
        raise RequestError(f"seed must be an integer, got {value!r}", param="seed")
    return int(value) % (2**31 - 1)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty array", param="messages")
    out = []
    for where, m in objects(value, "messages"):
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"Invalid value for '{where}.role': {role!r}; supported values "
                              f"are {', '.join(repr(r) for r in ROLES)}", param=f"{where}.role")
        content = m.get("content")
        if not _valid_content(content, allow_none=role == "assistant"):
            raise RequestError(f"{where}.content must be a string or an array of text parts",
                              param=f"{where}.content")
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise RequestError(f"{where}: a tool message needs its tool_call_id",
                              param=f"{where}.tool_call_id")
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise RequestError(f"{where}.tool_calls must be an array on an assistant message",
                                  param=f"{where}.tool_calls")
            for c in calls:
                fn = c.get("function") if isinstance(c, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or \
                        not isinstance(fn.get("arguments"), str | dict):
                    raise RequestError(f"{where}.tool_calls: each call needs a function with "
                                      f"a name and arguments", param=f"{where}.tool_calls")
        out.append(dict(m))
    return out


def _valid_content(content: Any, allow_none: bool) -> bool:
    if content is None:
        return allow_none
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content)


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError("tools must be an array", param="tools")
    for i, t in enumerate(value):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type") != "function" or \
                not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{i}] must be {{'type': 'function', 'function': "
                              f"{{'name': ..., 'parameters': ...}}}}", param=f"tools[{i}]")
    return [dict(t) for t in value]


def string_tool_choice(value: Any, tools: Sequence[Mapping[str, Any]]) -> str | None:
    """The default (``auto`` with tools, else ``none``) and the three string choices, checked;
    ``None`` for anything else (a named choice, in each API's own shape)."""
    if value is None:
        return "auto" if tools else "none"
    if isinstance(value, str) and value in ("none", "auto", "required"):
        if value == "required" and not tools:
            raise RequestError("tool_choice 'required' needs tools", param="tool_choice")
        return value
    return None


def named_tool_choice(name: str, tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The chat form of a choice naming one tool, which must be among ``tools``."""
    if name not in {t["function"]["name"] for t in tools}:
        raise RequestError(f"tool_choice names {name!r}, which is not in tools",
                           param="tool_choice")
    return {"type": "function", "function": {"name": name}}


def _tool_choice(value: Any, tools: Sequence[Mapping[str, Any]]) -> str | dict[str, Any]:
    if (choice := string_tool_choice(value, tools)) is not None:
        return choice
    fn = value.get("function") if isinstance(value, Mapping) else None
    if not isinstance(fn, Mapping) or value.get("type") != "function" or \
            not isinstance(fn.get("name"), str):
        raise RequestError("tool_choice must be 'none', 'auto', 'required' or {'type': "
                          "'function', 'function': {'name': ...}}", param="tool_choice")
    return named_tool_choice(fn["name"], tools)


# --- responses -----------------------------------------------------------------------------
_IDS = random.Random()  # seeded from os.urandom once: an id per call without a syscall each


def new_id(prefix: str = "chatcmpl-", digits: int = 32) -> str:
    """A fresh object id: ``prefix`` and ``digits`` random hex digits (unique within a
    process; uuid4 read os.urandom per id, ~2% of a gateway call's time here)."""
    return f"{prefix}{_IDS.getrandbits(4 * digits):0{digits}x}"


@dataclass
class Reply:
    """What one call answered, before any API's shape (`Gateway.reply`).

    Attributes:
        message: the assistant message in the chat form: ``content`` (the free text, None
            beside calls when there is none), ``tool_calls`` (ids, names, JSON arguments) when
            the reply's calls were parsed, ``refusal``.
        finish_reason: ``stop``, ``length`` or ``tool_calls``.
        stop: the request's stop string that ended the sampling (left out of the content).
        prompt_tokens / completion_tokens: the prompt's and the sample's lengths.
        logprobs: per sampled token (``token``, ``logprob``, ``bytes``), when asked.
        pieces: the content cut for streaming (one piece per token when it decodes so).
    """

    message: dict[str, Any]
    finish_reason: str
    stop: str | None
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[dict[str, Any]] | None
    pieces: list[str]

    @property
    def text(self) -> str:
        return self.message.get("content") or ""

    @property
    def calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []


def chat_completion(req: ChatRequest, reply: Reply) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice."""
    logprobs = reply.logprobs
    return {"id": new_id(), "object": "chat.completion", "created": int(time.time()),
            "model": req.model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": reply.message,
                         "finish_reason": reply.finish_reason,
                         "logprobs": None if logprobs is None else {"content": logprobs,
                                                                    "refusal": None}}],
            "usage": _usage(reply.prompt_tokens, reply.completion_tokens)}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def stream_chunks(completion: Mapping[str, Any], pieces: Sequence[str],
                  include_usage: bool) -> Iterator[str]:
    """Server-sent events of a finished completion: the role, the content in ``pieces``,
    the tool calls, the finish reason, the usage (when asked) and ``[DONE]``."""
    choice = completion["choices"][0]
    message = choice["message"]
    base = {"id": completion["id"], "object": "chat.completion.chunk",
            "created": completion["created"], "model": completion["model"],
            "system_fingerprint": None}

    def event(delta: dict[str, Any], finish: str | None = None,
              logprobs: Any = None) -> str:
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                      "logprobs": logprobs}]}
        if include_usage:
            chunk["usage"] = None
        return f"data: {json.dumps(chunk)}\n\n"

    yield event({"role": "assistant", "content": ""})
    lps = (choice.get("logprobs") or {}).get("content")
    for k, piece in enumerate(pieces):
        if piece:
            lp = {"content": [lps[k]], "refusal": None} if lps and k < len(lps) else None
            yield event({"content": piece}, logprobs=lp)
    for i, call in enumerate(message.get("tool_calls") or ()):
        yield event({"tool_calls": [{"index": i, **call}]})
    yield event({}, choice["finish_reason"])
    if include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': completion['usage']})}\n\n"
    yield "data: [DONE]\n\n"


# --- how a route speaks one API ------------------------------------------------------------
class API(abc.ABC):
    """How a route of the gateway speaks one API (`toolrl.rollout.gateway.app.Gateway.serve`):
    ``parse`` a body (the request has ``model`` and ``stream``), ``resolve`` it into the
    `ChatRequest` the gateway serves (an episode's ``capture`` holds what the API keeps between
    calls), ``answer`` the `Reply` in the API's shape, stream it as ``events``, and render a
    refusal as its ``error`` body and status. ``call_prefix`` starts the ids of its tool
    calls."""

    name = ""
    call_prefix = "call_"

    @abc.abstractmethod
    def parse(self, body: Any) -> Any:
        """The request of a body (its ``model`` and ``stream`` among the fields)."""

    def resolve(self, req: Any, capture: Any) -> ChatRequest:
        return req

    @abc.abstractmethod
    def answer(self, req: Any, chat: ChatRequest, reply: Reply, capture: Any) -> dict[str, Any]:
        """The finished reply in the API's shape."""

    @abc.abstractmethod
    def events(self, req: Any, answer: Mapping[str, Any], reply: Reply) -> Iterator[str]:
        """The reply as the API's server-sent events."""

    def error(self, e: RequestError) -> tuple[dict[str, Any], int]:
        return e.body(), e.status


class ChatAPI(API):
    """OpenAI's Chat Completions (``/v1/chat/completions``)."""

    name = "chat.completions"

    def parse(self, body: Any) -> ChatRequest:
        return ChatRequest.parse(body)

    def answer(self, req: ChatRequest, chat: ChatRequest, reply: Reply,
               capture: Any) -> dict[str, Any]:
        return chat_completion(chat, reply)

    def events(self, req: ChatRequest, answer: Mapping[str, Any], reply: Reply
               ) -> Iterator[str]:
        return stream_chunks(answer, reply.pieces, req.include_usage)


def sse(event: str | None, data: Mapping[str, Any]) -> str:
    """One server-sent event (``event:`` line when named, then its JSON ``data``)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"
