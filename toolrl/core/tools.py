"""Tools: a callable plus its JSON schema, with validation, timeouts and output caps.

A `Tool` is built from a Python function (sync or async; the schema comes from its type hints
and Google-style docstring via ``transformers.utils.get_json_schema``, or from pydantic when
the docstring does not describe every argument), from a pydantic model, or from an explicit
OpenAI function schema. `Tool.acall` never raises for the model's mistakes: the arguments are
validated with ``jsonschema`` first, and every failure becomes a typed error (see
``toolrl.core.types.ERROR_TYPES``) that the model reads as a short JSON observation, e.g.
``{"error": "missing_required", "tool": "add", "message": "missing required argument 'b'"}``.

The ``@tool`` decorator works on functions and on methods of a `ToolEnv` subclass; accessed
through an instance, a method tool is bound to that instance (so its state is per episode).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import functools
import inspect
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jsonschema
import pydantic
from jsonschema.exceptions import ValidationError, best_match

if TYPE_CHECKING:
    from toolrl.core.types import ParseResult

__all__ = [
    "Tool",
    "ToolFailure",
    "ToolResult",
    "error_observation",
    "in_daemon_thread",
    "make_error",
    "normalize_parameters",
    "parse_error_records",
    "tool",
]

TRUNCATION_MARKER = "...[truncated {n} chars]"
MAX_MESSAGE_CHARS = 300


class ToolFailure(Exception):
    """Raise inside a tool to report a typed error of your choosing (e.g. ``http_error``).

    ``infra=True`` says the failure is the infrastructure's, not the policy's (the tool's
    server could not be reached, its connection dropped): the episode is then recorded as an
    infrastructure failure (`toolrl.core.trajectory.Trajectory.infra_failure`) and kept out of
    the loss and the reward statistics.
    """

    def __init__(self, type: str, message: str, infra: bool = False) -> None:
        super().__init__(message)
        self.type = type
        self.message = message
        self.infra = infra


def make_error(type: str, tool: str | None, message: str, infra: bool = False
               ) -> dict[str, Any]:
    """A typed error record: ``{"type", "tool", "message"}`` (message capped in length), with
    ``"infra": True`` when the infrastructure failed (see `ToolFailure`)."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    out: dict[str, Any] = {"type": type, "tool": tool, "message": message}
    if infra:
        out["infra"] = True
    return out


def parse_error_records(parse: ParseResult) -> list[dict[str, Any]]:
    """A turn's parse errors as typed error records (``parse_error``, one per error). With the
    records of tool results and ``too_many_calls`` they are the turn's tool errors, counted
    the same way on every path: env steps and an agent's calls through the gateway."""
    return [make_error("parse_error", None, e.message) for e in parse.errors]


def error_observation(error: dict[str, Any]) -> str:
    """The short JSON string the model sees for an error."""
    out = {"error": error["type"]}
    if error.get("tool"):
        out["tool"] = error["tool"]
    out["message"] = error["message"]
    return json.dumps(out, ensure_ascii=False)


@dataclass
class ToolResult:
    """The outcome of one call: what the model sees plus what the env and rewards need."""

    name: str
    content: str  # the observation text
    error: dict[str, Any] | None = None  # a typed error, or None on success
    latency: float = 0.0  # seconds, validation included
    value: Any = None  # the Python return value (None on error)
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None or self.error["type"] == "output_truncated"


# --- schemas ---------------------------------------------------------------------------------
_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "int": "integer",
               "bool": "boolean", "str": "string", "list": "array", "any": None}


def normalize_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """Make a parameters schema plain JSON Schema (a copy): OpenAPI ``nullable`` -> a type union,
    BFCL type names (``dict``, ``float``, ``tuple``, ``any``) -> JSON Schema types, pydantic
    ``title`` fields dropped (they cost prompt tokens and say nothing)."""

    def fix(node: Any, in_properties: bool = False) -> Any:
        if isinstance(node, list):
            return [fix(x) for x in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if in_properties:  # keys are parameter names: keep every one
                out[key] = fix(value)
            elif key == "title" and isinstance(value, str):
                continue
            elif key == "properties":
                out[key] = fix(value, in_properties=True)
            else:
                out[key] = fix(value)
        if in_properties:
            return out
        kind = out.get("type")
        if isinstance(kind, str) and kind in _BFCL_TYPES:
            mapped = _BFCL_TYPES[kind]
            if mapped is None:
                out.pop("type")
            else:
                out["type"] = mapped
        if out.pop("nullable", False) and isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        return out

    fixed = fix(schema)
    fixed.setdefault("type", "object")
    fixed.setdefault("properties", {})
    return fixed


def _schema_from_function(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """(description, parameters) from type hints + docstring; pydantic as the fallback."""
    # lazy: transformers (~2 s) stays out of core's import; only a tool's schema needs it
    from transformers.utils.chat_template_utils import (
        DocstringParsingException,
        TypeHintParsingException,
        get_json_schema,
    )

    try:
        function = get_json_schema(fn)["function"]
        return function.get("description", ""), function["parameters"]
    except (DocstringParsingException, TypeHintParsingException):
        pass
    target = fn
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name in ("self", "cls"):  # unbound method: drop the receiver
        def target(*args: Any, **kwargs: Any) -> Any:
            return None

        target.__signature__ = inspect.signature(fn).replace(parameters=params[1:])
        target.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items()
                                  if k not in ("self", "cls")}
        target.__module__ = fn.__module__
        target.__wrapped__ = fn  # resolves string annotations in fn's module
    try:
        parameters = pydantic.TypeAdapter(target).json_schema()
    except Exception as exc:  # a type pydantic cannot express: fail loudly, naming the function
        raise TypeError(f"cannot build a JSON schema for {fn.__qualname__}: {exc}") from exc
    doc = inspect.getdoc(fn) or ""
    # get_json_schema's key order (type, properties, required): jsonschema reports a call's
    # errors in the schema's order, and the first error names the observation's error kind
    order = ("type", "properties", "required")
    parameters = {**{k: parameters[k] for k in order if k in parameters},
                  **{k: v for k, v in parameters.items() if k not in order}}
    return doc.split("\n\n", 1)[0].strip(), parameters


def _check_schema(validator_cls: Any, parameters: dict[str, Any]) -> None:
    """``validator_cls.check_schema(parameters)``, each distinct schema once a process (an env
    that builds its tools per episode checks the same schemas again and again)."""
    try:
        key = json.dumps(parameters, sort_keys=True)
    except (TypeError, ValueError):  # not JSON: checked every time
        validator_cls.check_schema(parameters)
        return
    _checked_schema(validator_cls, key)


@functools.lru_cache(maxsize=4096)
def _checked_schema(validator_cls: Any, key: str) -> None:
    validator_cls.check_schema(json.loads(key))  # raises SchemaError: not cached


def _strict(parameters: dict[str, Any]) -> dict[str, Any]:
    """The validation schema: undeclared top-level arguments are errors unless allowed."""
    if "additionalProperties" in parameters or parameters.get("type") != "object":
        return parameters
    return {**parameters, "additionalProperties": False}


def _path(error: ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int):
        return "integer"
    return {dict: "object", list: "array", str: "string", float: "number"}.get(
        type(value), type(value).__name__)


def _classify(error: ValidationError, schema: dict[str, Any]) -> tuple[str, str]:
    """(typed error kind, short human message) for one jsonschema violation."""
    where = _path(error)
    kind = error.validator
    if kind == "required":
        missing = [n for n in error.validator_value if n not in (error.instance or {})]
        prefix = f"{where}: " if where else ""
        return "missing_required", prefix + ", ".join(
            f"missing required argument {n!r}" for n in missing)
    if kind == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return "wrong_type", (f"argument {where!r} must be {expected}, got "
                              f"{_json_type(error.instance)} {_short(error.instance)}")
    if kind == "additionalProperties":
        declared = set((error.schema or {}).get("properties", {}))
        extra = sorted(k for k in (error.instance or {}) if k not in declared)
        allowed = ", ".join(sorted(declared)) or "none"
        prefix = f"{where}: " if where else ""
        return "unknown_param", prefix + ", ".join(
            f"unknown argument {k!r}" for k in extra) + f" (allowed: {allowed})"
    if kind in ("enum", "const"):
        options = error.validator_value if kind == "enum" else [error.validator_value]
        return "enum_mismatch", (f"argument {where!r} must be one of {_short(options, 80)}, "
                                 f"got {_short(error.instance)}")
    return "invalid_value", f"argument {where!r}: {error.message}" if where else error.message


# --- the tool ----------------------------------------------------------------------------------
@dataclass
class Tool:
    """A callable tool with a JSON schema.

    Args:
        name: the function name the model calls.
        description: one line for the model.
        parameters: the JSON schema of the arguments (an ``object`` schema).
        fn: the implementation, sync or async, called with the arguments as keywords (or with
            a pydantic model instance when ``model`` is set). None: the tool is schema-only
            (validated but not executed; `acall` returns ``"ok"``).
        timeout: seconds per call (None: the env's default).
        max_output_chars: output cap (None: the env's default); longer output is cut and
            marked, and the call reports an ``output_truncated`` error.
        strict: reject arguments the schema does not declare (``unknown_param``).
        inline: run a sync ``fn`` directly on the event loop (fast pure functions) instead of
            in a worker thread; such a call cannot be interrupted by its timeout.
        model: a pydantic model that parses the arguments before ``fn`` gets them.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object",
                                                                "properties": {}})
    fn: Callable[..., Any] | None = None
    timeout: float | None = None
    max_output_chars: int | None = None
    strict: bool = True
    inline: bool = False
    model: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a tool needs a non-empty name, got {self.name!r}")
        self.parameters = normalize_parameters(self.parameters)
        validator_cls = jsonschema.validators.validator_for(self.parameters,
                                                            default=jsonschema.Draft202012Validator)
        try:
            _check_schema(validator_cls, self.parameters)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"tool {self.name!r} has an invalid parameters schema: "
                             f"{exc.message}") from exc
        schema = _strict(self.parameters) if self.strict else self.parameters
        self._validator = validator_cls(schema)

    # --- construction ----------------------------------------------------------------------
    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, name: str | None = None,
                      description: str | None = None, **options: Any) -> Tool:
        """A tool from a (sync or async) function or method; schema from hints + docstring."""
        doc, parameters = _schema_from_function(fn)
        return cls(name=name or fn.__name__, description=doc if description is None else
                   description, parameters=parameters, fn=fn, **options)

    @classmethod
    def from_pydantic(cls, model: Any, fn: Callable[..., Any], *, name: str | None = None,
                      description: str | None = None, **options: Any) -> Tool:
        """A tool whose arguments are the fields of a pydantic model; ``fn(model_instance)``."""
        parameters = model.model_json_schema()
        parameters.pop("description", None)
        doc = description if description is not None else (inspect.getdoc(model) or "")
        return cls(name=name or _snake(model.__name__), description=doc.split("\n\n")[0],
                   parameters=parameters, fn=fn, model=model, **options)

    @classmethod
    def from_schema(cls, schema: dict[str, Any], fn: Callable[..., Any] | None = None,
                    **options: Any) -> Tool:
        """A tool from an OpenAI function schema (``{"type": "function", "function": {...}}``
        or the bare ``{"name", "description", "parameters"}``)."""
        function = schema.get("function", schema) if schema.get("type") == "function" else schema
        if "name" not in function:
            raise ValueError(f"a tool schema needs a 'name': {_short(schema, 120)}")
        return cls(name=function["name"], description=function.get("description", ""),
                   parameters=function.get("parameters") or {"type": "object", "properties": {}},
                   fn=fn, **options)

    # --- schema ----------------------------------------------------------------------------
    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI tool schema (a fresh copy): what chat templates render."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": copy.deepcopy(self.parameters)}}

    def validate(self, arguments: Any) -> dict[str, Any] | None:
        """A typed error for the first violation (all violations listed), or None."""
        if not isinstance(arguments, dict):
            return make_error("wrong_type", self.name,
                              f"arguments must be a JSON object, got {_json_type(arguments)}")
        errors = list(self._validator.iter_errors(arguments))
        if not errors:
            return None
        first = best_match(errors)
        kind, message = _classify(first, self.parameters)
        messages = dict.fromkeys([message, *(_classify(e, self.parameters)[1] for e in errors)])
        return make_error(kind, self.name, "; ".join(list(messages)[:3]))

    # --- calling ---------------------------------------------------------------------------
    async def acall(self, arguments: dict[str, Any], *, timeout: float | None = None,
                    max_output_chars: int | None = None) -> ToolResult:
        """Validate, run (with a timeout), and render the output; never raises for bad calls."""
        start = time.perf_counter()

        def done(content: str, error: dict[str, Any] | None = None, value: Any = None,
                 truncated: bool = False) -> ToolResult:
            return ToolResult(self.name, content, error, time.perf_counter() - start, value,
                              truncated)

        error = self.validate(arguments)
        if error is not None:
            return done(error_observation(error), error)
        limit = _min(self.timeout, timeout)
        try:
            if limit is not None and not self.inline:
                async with asyncio.timeout(limit):  # unlike wait_for, no task per call
                    value = await self._invoke(arguments)
            else:
                value = await self._invoke(arguments)
        except TimeoutError:
            error = make_error("timeout", self.name, f"tool {self.name!r} did not finish within "
                                                     f"{limit:g} s")
            return done(error_observation(error), error)
        except ToolFailure as exc:
            error = make_error(exc.type, self.name, exc.message, infra=exc.infra)
            return done(error_observation(error), error)
        except asyncio.CancelledError:
            raise
        except ConnectionError as exc:  # refused, reset, broken pipe: the server, not the call
            error = make_error("tool_exception", self.name, f"{type(exc).__name__}: {exc}",
                               infra=True)
            return done(error_observation(error), error)
        except Exception as exc:  # the tool's own bug or refusal: an observation, not a crash
            error = make_error("tool_exception", self.name, f"{type(exc).__name__}: {exc}")
            return done(error_observation(error), error)
        try:
            content = render_output(value)
        except Exception as exc:  # e.g. an int too long for str(): the tool's output is unusable
            error = make_error("tool_exception", self.name, f"the output of {self.name!r} "
                               f"cannot be rendered as text: {type(exc).__name__}: {exc}")
            return done(error_observation(error), error)
        cap = _min(self.max_output_chars, max_output_chars)
        if cap is not None and len(content) > cap:
            cut = len(content) - cap
            content = _valid_utf8(content[:cap]) + TRUNCATION_MARKER.format(n=cut)
            error = make_error("output_truncated", self.name,
                               f"output of {self.name!r} cut to {cap} chars ({cut} dropped)")
            return done(content, error, value, truncated=True)
        return done(_valid_utf8(content), None, value)

    async def _invoke(self, arguments: dict[str, Any]) -> Any:
        if self.fn is None:
            return "ok"
        if self.model is not None:
            args: tuple[Any, ...] = (self.model.model_validate(arguments),)
            kwargs: dict[str, Any] = {}
        else:
            args, kwargs = (), arguments
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(*args, **kwargs)
        if self.inline:
            value = self.fn(*args, **kwargs)
        else:
            value = await in_daemon_thread(self.fn, *args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the implementation directly (no validation): tools stay plain functions."""
        if self.fn is None:
            raise TypeError(f"tool {self.name!r} has no implementation")
        return self.fn(*args, **kwargs)

    # --- methods of ToolEnv subclasses -------------------------------------------------------
    def __get__(self, instance: Any, owner: type | None = None) -> Tool:
        if instance is None or self.fn is None:
            return self
        bound = copy.copy(self)
        bound.fn = self.fn.__get__(instance, owner)
        return bound


def render_output(value: Any) -> str:
    """A tool's return value as observation text: strings as-is, everything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if hasattr(value, "model_dump_json"):
        return value.model_dump_json()
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _valid_utf8(text: str) -> str:
    """``text`` without lone surrogates (e.g. bytes decoded with ``surrogateescape``), which
    tokenizers and UTF-8 files reject; each becomes ``?``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace").decode("utf-8")


class _DaemonWorkers:
    """Daemon threads reused across blocking calls: a call takes an idle one or starts one;
    a thread idle for ``idle_s`` ends. A call that never returns keeps its thread (a daemon:
    nothing waits for it) and later calls start others. Starting a thread per call cost more
    than the call (the starter waits until the new thread runs; ~25% of an agent episode's
    time on the event loop under bench_gateway)."""

    def __init__(self, idle_s: float = 30.0) -> None:
        self.idle_s = idle_s
        self.forget()

    def forget(self) -> None:
        """No idle threads and a fresh lock: a forked child has none of the parent's threads
        (and the parent's lock may have been held at the fork)."""
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue] = []  # one hand-off slot per idle thread

    def submit(self, job: Callable[[], Callable[[], None]]) -> None:
        """Run ``job`` on a daemon thread; what it returns runs once the thread is idle again
        (so a caller woken by it finds the thread free)."""
        with self._lock:
            slot = self._idle.pop() if self._idle else None
        if slot is not None:
            slot.put(job)
            return
        threading.Thread(target=self._work, args=(queue.SimpleQueue(), job),
                         name="toolrl-blocking-call", daemon=True).start()

    def _work(self, slot: queue.SimpleQueue, job: Callable[[], Callable[[], None]]) -> None:
        while True:
            notify = job()
            with self._lock:
                self._idle.append(slot)
            notify()
            try:
                job = slot.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if slot in self._idle:  # nobody took this thread: it ends
                        self._idle.remove(slot)
                        return
                job = slot.get()  # taken just now: its job is on the way


_WORKERS = _DaemonWorkers()
os.register_at_fork(after_in_child=_WORKERS.forget)


def in_daemon_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future:
    """Run a blocking call on a daemon thread (reused across calls, `_DaemonWorkers`). Unlike
    ``asyncio.to_thread`` (the loop's default executor), a call that never returns is
    abandoned when its timeout fires: neither the loop's shutdown nor the interpreter's exit
    waits for it, and it holds no thread that other calls wait for."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, outcome: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(outcome)

    def job() -> Callable[[], None]:
        threading.current_thread().name = f"toolrl-tool-{getattr(fn, '__name__', 'call')}"
        try:
            outcome, ok = context.run(fn, *args, **kwargs), True
        except BaseException as exc:  # handed to the awaiting coroutine
            outcome, ok = exc, False

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(settle, ok, outcome)

        return notify

    _WORKERS.submit(job)
    return future


def _min(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower()
                   for i, c in enumerate(name))


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         description: str | None = None, **options: Any) -> Any:
    """Decorator: turn a function or a `ToolEnv` method into a `Tool`.

    ``@tool`` or ``@tool(name=..., timeout=..., max_output_chars=..., inline=True)``; the schema
    comes from type hints + the Google-style docstring (see `Tool.from_function`).
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool.from_function(f, name=name, description=description, **options)

    return wrap(fn) if fn is not None else wrap
