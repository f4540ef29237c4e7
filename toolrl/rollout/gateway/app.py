"""`Gateway`: OpenAI's and Anthropic's APIs on a rollout worker's engine, one capture for all.

Routes (a starlette app, served on loopback by `toolrl.rollout.gateway.server.GatewayServer`):

- ``GET /v1/models``; ``POST /v1/chat/completions`` (OpenAI's Chat Completions),
  ``POST /v1/responses`` (OpenAI's Responses API, `openai_responses`) and ``POST /v1/messages``
  (Anthropic's Messages API, `anthropic_messages`): plain calls, nothing captured;
- the same under ``/episodes/{id}/v1/``: the route of one open episode
  (`Gateway.open_episode`); every call is captured (`EpisodeCapture`) with the exact prompt
  ids, sampled ids and log-probs, and calls of one episode run one at a time.

Every route is a thin translation onto one call (`Gateway.reply`): its body becomes a
`ChatRequest` (chat messages, tools), which is rendered with the model's chat template
(`ChatRenderer`, as the env path does), sampled on the engine, decoded, parsed for tool calls
with the configured tool-call format (`toolrl.core.parse`) and captured; the `Reply` is then
answered in the route's API's shape. So the same conversation gives the same tokens whichever
API carried it, and a history the agent rewrote starts a new sample in every API.

A reply with calls carries them (``tool_calls`` with ``finish_reason: "tool_calls"``;
``function_call`` items; ``tool_use`` blocks with ``stop_reason: "tool_use"``); otherwise
plain text with the engine's ``stop`` / ``length``. ``tool_choice: "none"`` leaves calls
unparsed (text); ``"required"`` (Anthropic's ``any``) and a named function constrain sampling
(vLLM structured outputs, a grammar of the format's call tags around the tool's parameter
schema) to one call, so the reply has it. ``stream: true`` answers with the API's server-sent
events. A refused request gets the API's own error shape and status.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from toolrl.core.parse import get_format
from toolrl.rollout.engine import ContextLengthError, SamplingConfig
from toolrl.rollout.gateway.anthropic_messages import MessagesAPI
from toolrl.rollout.gateway.capture import CallRecord, EpisodeCapture, template_messages
from toolrl.rollout.gateway.openai_responses import ResponsesAPI
from toolrl.rollout.gateway.protocol import (
    API,
    ChatAPI,
    ChatRequest,
    Reply,
    RequestError,
    error_body,
    new_id,
)

logger = logging.getLogger(__name__)

__all__ = ["Answer", "Gateway"]

APIS: dict[str, API] = {"chat/completions": ChatAPI(), "responses": ResponsesAPI(),
                        "messages": MessagesAPI()}
_ROUTE = re.compile(r"(?:/episodes/(?P<episode_id>[^/]+))?/v1/(?P<route>[a-z/]+)")
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@dataclass(frozen=True)
class Answer:
    """What one request gets: a status and a JSON body, or the API's server-sent events."""

    status: int
    body: Any = None
    events: Iterable[str] | None = None

    def content(self) -> bytes:
        """The body as the JSON bytes sent (starlette's JSONResponse rendering)."""
        return json.dumps(self.body, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode()


@functools.cache
def _transport_class(httpx: Any) -> type:
    """`Gateway.transport`'s class for one httpx module (the openai SDK speaks httpx, the
    anthropic SDK httpx2: the same API)."""

    class GatewayTransport(httpx.AsyncBaseTransport):
        def __init__(self, gateway: Gateway) -> None:
            self.gateway = gateway

        async def handle_async_request(self, request: Any) -> Any:
            answer = await self.gateway.handle(request.method, request.url.path,
                                               await request.aread())
            if answer.events is not None:  # complete already: sent whole, as over ASGI
                return httpx.Response(answer.status, content="".join(answer.events).encode(),
                                      headers={"content-type": "text/event-stream; "
                                                               "charset=utf-8"})
            content = b"" if request.method == "HEAD" else answer.content()  # as HTTP's HEAD
            return httpx.Response(answer.status, content=content,
                                  headers={"content-type": "application/json"})

    return GatewayTransport


class Gateway:
    """Chat Completions, Responses and Messages on one engine, with per-episode token capture.

    Args:
        engine: the `VLLMEngine` (``generate``, ``max_model_len``, ``tokenizer``).
        renderer: the engine tokenizer's `ChatRenderer`.
        model: the model name clients send (``GET /v1/models`` lists it).
        format: the tool-call format replies are parsed with (``hermes``, ...).
        max_tokens: the most tokens of one call (a request's ``max_tokens`` is clipped to it;
            None: the room left in the context window).
        max_prompt_tokens / max_response_tokens: the budget of one captured sample (the
            batch's prompt and response widths): a first prompt past the first is a 400
            ``context_length_exceeded``; a call whose merged response has no room left
            starts a new sample. None: the engine's context window.
    """

    def __init__(self, engine: Any, renderer: Any, *, model: str = "policy",
                 format: str = "hermes", max_tokens: int | None = None,
                 max_prompt_tokens: int | None = None,
                 max_response_tokens: int | None = None) -> None:
        self.engine, self.renderer, self.model = engine, renderer, model
        self.format_name = format
        self.parser = get_format(format)
        self.max_tokens = max_tokens
        limit = int(engine.max_model_len)
        self.max_prompt_tokens = min(max_prompt_tokens or limit - 1, limit - 1)
        self.max_response_tokens = min(max_response_tokens or limit, limit)
        self.episodes: dict[str, EpisodeCapture] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._app: Any = None

    # --- episodes --------------------------------------------------------------------------
    def open_episode(self, episode_id: str | None = None, **sampling: Any) -> str:
        """Start capturing a new episode; returns its id (the route's ``{id}``).
        ``sampling``: the route's ``seed``, ``temperature``, ``top_p``, ``top_k``
        (`EpisodeCapture`)."""
        eid = episode_id or uuid.uuid4().hex
        if eid in self.episodes:
            raise ValueError(f"episode {eid!r} is already open")
        self.episodes[eid] = EpisodeCapture(eid, **sampling)
        return eid

    def close_episode(self, episode_id: str) -> EpisodeCapture:
        """Stop capturing; later calls on its route get 404. Returns what was captured."""
        self._locks.pop(episode_id, None)
        return self.episodes.pop(episode_id)

    # --- the app ---------------------------------------------------------------------------
    @property
    def app(self) -> Any:
        """The ASGI application (starlette): every request goes to `handle`."""
        if self._app is None:
            async def endpoint(request: Any) -> Any:
                answer = await self.handle(request.method, request.url.path,
                                           await request.body())
                if answer.events is not None:
                    return StreamingResponse(answer.events, media_type="text/event-stream")
                return Response(answer.content(), status_code=answer.status,
                                media_type="application/json")

            self._app = Starlette(routes=[Route("/{path:path}", endpoint, methods=METHODS)])
        return self._app

    def transport(self, httpx: Any) -> Any:
        """An ``httpx`` (or ``httpx2``) transport that hands each request straight to `handle`
        on the caller's event loop: the same routes, bodies and replies as the app, without
        the ASGI round trip (scope, receive and send, the app's routing and response objects;
        ~5% of a Chat Completions agent's call here)."""
        return _transport_class(httpx)(self)

    async def handle(self, method: str, path: str, body: bytes) -> Answer:
        """One request, by its method, path and body: routed (``/v1/...`` and
        ``/episodes/{id}/v1/...``), answered, refused in the API's own shape."""
        m = _ROUTE.fullmatch(path)
        if m is None or (m["route"] != "models" and m["route"] not in APIS):
            return Answer(404, error_body(f"{method} {path}: Not Found", code="not_found"))
        eid, route = m["episode_id"], m["route"]
        if method not in (("GET", "HEAD") if route == "models" else ("POST",)):
            return Answer(405, error_body(f"{method} {path}: Method Not Allowed"))
        if route == "models":
            return self._models(eid)
        return await self.serve(body, APIS[route], eid)

    def _models(self, eid: str | None) -> Answer:
        if eid is not None and eid not in self.episodes:
            return Answer(404, _no_episode(eid).body())
        return Answer(200, {"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "toolrl"}]})

    async def serve(self, body: bytes, api: API, eid: str | None = None) -> Answer:
        """One request of ``api`` (on episode ``eid``'s route, or the plain one): parse,
        check, answer (captured on an episode route); refusals and failures in the API's own
        error shape."""
        try:
            try:
                data = json.loads(body)
            except ValueError as e:
                raise RequestError(f"the request body is not valid JSON: {e}") from e
            req = api.parse(data)
            if req.model != self.model:
                raise RequestError(f"The model `{req.model}` does not exist; this gateway "
                                   f"serves `{self.model}`", status=404, param="model",
                                   code="model_not_found")
            capture = None
            if eid is not None:
                capture = self.episodes.get(eid)
                if capture is None:
                    raise _no_episode(eid)
            lock = (self._locks.setdefault(eid, asyncio.Lock()) if capture is not None
                    else contextlib.nullcontext())
            async with lock:
                chat = api.resolve(req, capture)
                reply = await self.reply(chat, capture, api)
                answer = api.answer(req, chat, reply, capture)
        except RequestError as e:
            return _refused(api, e)
        except Exception as e:  # the engine or template failed: a 500 in the API's shape
            logger.warning("%s call failed: %s", api.name, e, exc_info=True)
            return _refused(api, RequestError(f"{type(e).__name__}: {e}", status=500,
                                              type="server_error"))
        if req.stream:
            return Answer(200, events=api.events(req, answer, reply))
        return Answer(200, answer)

    # --- one call --------------------------------------------------------------------------
    async def reply(self, req: ChatRequest, capture: EpisodeCapture | None,
                    api: API = APIS["chat/completions"]) -> Reply:
        """Render, sample, decode, parse; record the call in ``capture`` (as carried by
        ``api``, whose ``call_prefix`` starts the ids of the reply's tool calls)."""
        messages = template_messages(req.messages)
        tools = [dict(t) for t in req.tools]
        try:
            if capture is not None:
                prompt, extends = capture.prompt_for(messages, tools, self.renderer)
            else:
                prompt, extends = self.renderer.render_prompt(messages, tools or None), False
        except ValueError as e:  # TemplateError: the template rejects these messages
            raise RequestError(f"the chat template cannot render these messages: {e}",
                               param="messages") from e
        room = self.max_response_tokens
        if extends:
            room -= len(prompt) - capture.sample_prompt_len()
            if room < 1:  # the merged sample is full: this call starts a new one
                prompt, extends = self.renderer.render_prompt(messages, tools or None), False
                room = self.max_response_tokens
        if not extends and len(prompt) > self.max_prompt_tokens:
            if capture is not None:
                capture.overflow = True
            raise RequestError(f"This model's maximum context length is "
                               f"{self.max_prompt_tokens} prompt tokens; the messages take "
                               f"{len(prompt)}", param="messages",
                               code="context_length_exceeded")
        room = min(room, self.engine.max_model_len - len(prompt))
        sampling = self.sampling(req, room, capture)
        t0 = time.perf_counter()
        try:
            [out] = await self.engine.generate(prompt, sampling)
        except ContextLengthError as e:
            raise RequestError(str(e), param="messages", code="context_length_exceeded") from e
        gen_s = time.perf_counter() - t0
        text = self.renderer.decode(out.token_ids)
        content = text
        stop = out.stop_reason if isinstance(out.stop_reason, str) else None
        if stop and stop in content:  # the APIs leave the stop string out, and what follows
            content = content[: content.index(stop)]  # it in its last token
        parse = self.parser.parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        finish = "length" if out.finish_reason == "length" else "stop"
        if req.parses_calls and parse.calls and not parse.errors:
            message["content"] = parse.text or None
            message["tool_calls"] = [
                {"id": new_id(api.call_prefix, 24), "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments,
                                                                       ensure_ascii=False)}}
                for c in parse.calls]
            finish = "tool_calls"
        message.setdefault("refusal", None)
        logprobs = self._logprobs(out.token_ids, out.log_probs) if req.logprobs else None
        if capture is not None:
            [reply] = template_messages([message])
            capture.calls.append(CallRecord(
                messages=messages, tools=tools, prompt_ids=list(prompt),
                completion_ids=list(out.token_ids), log_probs=list(out.log_probs or []),
                reply=reply, text=text, parse=parse, finish_reason=out.finish_reason,
                extends=extends, generate_s=gen_s, versions=list(out.versions or []),
                constrained=sampling.structured_outputs is not None, api=api.name))
        pieces = [message["content"] or ""]
        if req.stream and "tool_calls" not in message:  # token by token
            pieces = self._pieces(out.token_ids, message["content"])
        return Reply(message=message, finish_reason=finish, stop=stop,
                     prompt_tokens=len(prompt), completion_tokens=len(out.token_ids),
                     logprobs=logprobs, pieces=pieces)

    def sampling(self, req: ChatRequest, room: int,
                 capture: EpisodeCapture | None = None) -> SamplingConfig:
        """The engine's sampling for a request (log-probs always: the capture needs them);
        an episode route's own temperature, top_p, top_k and seed win (`EpisodeCapture`)."""
        limit = min(x for x in (req.max_tokens, self.max_tokens, room) if x is not None)
        temperature, top_p, seed = req.temperature, req.top_p, req.seed
        top_k = capture.top_k if capture is not None else req.top_k
        if capture is not None:
            if capture.temperature is not None:
                temperature = capture.temperature
            if capture.top_p is not None:
                top_p = capture.top_p
            if seed is None and capture.seed is not None:
                seed = (capture.seed * 1_000_003 + 7919 * len(capture.calls)) % (2**31 - 1)
        return SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=limit,
                              stop=req.stop, include_stop_str_in_output=True, seed=seed,
                              logprobs=True, structured_outputs=self.structured(req))

    def structured(self, req: ChatRequest) -> dict[str, Any] | None:
        """vLLM structured-output constraints for ``tool_choice`` required / named: exactly
        one call of an offered tool, in the format's own syntax (`call_grammar`)."""
        if not req.parses_calls or req.tool_choice == "auto":
            return None
        tools = [t["function"] for t in req.tools]
        if req.forced_tool is not None:
            tools = [f for f in tools if f["name"] == req.forced_tool]
        begin = getattr(self.parser, "open_tag", None)
        end = getattr(self.parser, "close_tag", None)
        if not begin or not end:
            raise RequestError(f"tool_choice {req.tool_choice!r} is not supported with the "
                              f"{self.format_name!r} tool-call format", param="tool_choice")
        return {"grammar": call_grammar(begin, end, _call_schema(tools))}

    def _logprobs(self, ids: list[int], lps: list[float] | None) -> list[dict[str, Any]]:
        tok = self.renderer.tokenizer
        out = []
        for t, lp in zip(ids, lps or [0.0] * len(ids), strict=True):
            s = tok.decode([t])
            out.append({"token": s, "logprob": float(lp), "bytes": list(s.encode()),
                        "top_logprobs": []})
        return out

    def _pieces(self, ids: list[int], content: str) -> list[str]:
        """The content cut at token boundaries (one piece per token), for streaming."""
        pieces, prev = [], ""
        for k in range(len(ids)):
            text = self.renderer.decode(ids[: k + 1])
            pieces.append(text[len(prev):] if text.startswith(prev) else "")
            prev = text
        return pieces if "".join(pieces) == content else [content]


def call_grammar(begin: str, end: str, schema: Mapping[str, Any]) -> str:
    """An EBNF grammar (xgrammar's, as vLLM takes it) of ``begin`` + one compact JSON value of
    ``schema`` + ``end``: the call syntax of formats like hermes, without free whitespace (a
    random model would otherwise fill its budget with it)."""
    import xgrammar  # lazy: xgrammar comes with vLLM (optional) and takes seconds to import

    body = str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False,
                                                 separators=(", ", ": ")))
    lines = [("call_object ::=" + ln[len("root ::="):]) if ln.startswith("root ::=") else ln
             for ln in body.splitlines()]
    return "\n".join([f"root ::= {json.dumps(begin)} call_object {json.dumps(end)}", *lines])


def _call_schema(tools: list[Mapping[str, Any]]) -> dict[str, Any]:
    """JSON schema of one call object ``{"name": ..., "arguments": {...}}`` of these tools."""
    options = [{"type": "object",
                "properties": {"name": {"const": f["name"]},
                               "arguments": f.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False}
               for f in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _no_episode(eid: str) -> RequestError:
    return RequestError(f"no open episode {eid!r} (it finished, or never started)", status=404,
                       code="episode_not_found")


def _refused(api: API, e: RequestError) -> Answer:
    body, status = api.error(e)
    return Answer(status, body)
