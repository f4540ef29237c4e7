"""BFCL's multi-turn categories: its executable backends and its multi-turn checker, used as a
library (``bfcl_eval``, installed without its dependencies: ``pip install --no-deps
bfcl-eval==2026.3.23``; ``make install`` does).

An entry (`Entry`) is BFCL's: user turns (``question``, a list of turns of messages), the
backends' ``initial_config``, the ``involved_classes``, for ``miss_func`` the functions held
back until a turn (``missed_function``), and the possible answer (``ground_truth``: per turn,
BFCL's call strings).

- `Backends` instantiates BFCL's own classes (GorillaFileSystem, MathAPI, MessageAPI,
  TwitterAPI, TicketAPI, TradingBot, TravelAPI, VehicleControlAPI) fresh for one episode and
  loads the entry's initial configuration into them (``_load_scenario``, with the long-context
  extras when the id's category names ``long_context`` or ``composite``, as BFCL decides). A
  call runs the backend's method with the parsed arguments (no string is evaluated), and its
  output is what BFCL's executor shows the model: a string as is, a dict as JSON, anything
  else ``str()``, an exception ``"Error during execution: ..."``. As in BFCL, every public
  method of the involved classes can be called, offered or not.
- `checker_verdict` is BFCL's verdict: ``multi_turn_checker`` given what BFCL's pipeline gives
  it, the episode's calls per turn and per step as BFCL's FC handlers decode them
  (``name(k=repr(v),...)``, steps without a call left out), after BFCL's force-termination
  check (fewer turns than the answer: invalid). BFCL's executor ``eval``s those strings in its
  module, so they are built here from parsed calls only: a name that is a method of the
  involved classes (or, for any other name, an error with no code run), keys that are
  identifiers, JSON values as Python literals; anything else becomes a string that fails to
  parse, which BFCL records as an execution error, as it would the original. Its backend cache
  (module globals keyed by model name and entry id) gets a key of its own per verdict and is
  emptied of it afterwards, so concurrent episodes of one entry share nothing.
- `turn_agreement`: per user turn, whether the state of every backend and the outputs so far
  match the possible answer's (BFCL's ``state_checker`` and ``response_checker``), for every
  turn (BFCL's verdict stops at the first that fails); turns whose answer is empty (the model
  should ask, or say it cannot) record whether the model made no call.

BFCL's backends are plain Python: a call such as ``power(base=10, exponent=10**12)`` computes
for as long as Python's integers take, in BFCL as here.
"""

from __future__ import annotations

import ast
import builtins
import copy
import importlib
import inspect
import json
import keyword
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from toolrl.core.types import ToolCall

__all__ = [
    "CLASSES", "MULTI_TURN_CATEGORIES", "TRAINING_CATEGORIES", "Backends", "Entry",
    "GroundTruthError", "TurnAgreement", "Verdict", "checker_verdict", "function_docs",
    "ground_truth_calls", "parse_call_string", "render_call", "require_bfcl_eval",
    "turn_agreement",
]

BFCL_EVAL = "bfcl-eval==2026.3.23"  # = toolrl.wheels.BFCL_EVAL (core does not import wheels)
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                         "multi_turn_long_context")
"""BFCL v4's scored multi-turn categories (200 entries each; Multi Turn Acc is their mean)."""
TRAINING_CATEGORIES = ("multi_turn_composite",)
"""BFCL's unused multi-turn set (``data/unused_datasets/``), not part of any score."""
CLASSES = ("GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot",
           "TravelAPI", "VehicleControlAPI")
"""The backends of BFCL's multi-turn categories (the memory and web-search classes belong to
its agentic categories)."""
LANGUAGE_HINT = " Note that the provided function is in Python 3 syntax."
_BLOCKED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")  # BFCL's list
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNPARSABLE = "toolrl_unrenderable_call("  # a string BFCL's eval fails on, running nothing


# --- bfcl_eval, imported --------------------------------------------------------------------
@cache
def require_bfcl_eval() -> ModuleType:
    """The installed ``bfcl_eval`` package, or an ImportError that says how to install it."""
    try:
        version = metadata.version("bfcl-eval")
        module = importlib.import_module("bfcl_eval")
    except (metadata.PackageNotFoundError, ImportError):
        raise ImportError(f"BFCL's multi-turn backends and checker come from {BFCL_EVAL}, which "
                          f"is not installed: pip install --no-deps '{BFCL_EVAL}' (make "
                          f"install does; its checker and backends need only mpmath)") from None
    if version != BFCL_EVAL.split("==")[1]:
        raise ImportError(f"bfcl-eval {version} is installed; toolrl's multi-turn env is "
                          f"written against {BFCL_EVAL}: pip install --no-deps '{BFCL_EVAL}'")
    return module


def _module(name: str) -> ModuleType:
    require_bfcl_eval()
    return importlib.import_module(f"bfcl_eval.{name}")


def data_dir() -> Path:
    """BFCL's data folder inside the installed package."""
    return Path(require_bfcl_eval().__file__).parent / "data"


def max_steps() -> int:
    """BFCL's ``MAXIMUM_STEP_LIMIT``: steps with calls in one user turn before BFCL stops the
    entry (force-terminated)."""
    return int(_module("constants.default_prompts").MAXIMUM_STEP_LIMIT)


def added_functions_message(docs: Sequence[Mapping[str, Any]]) -> str:
    """The user message of a ``miss_func`` turn: BFCL's (prompting handlers') text, the added
    functions' docs first, as JSON."""
    prompts = _module("constants.default_prompts")
    template = prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
    return template.format(functions=json.dumps(list(docs), ensure_ascii=False))


@cache
def _class(name: str) -> type:
    mapping = _module("constants.executable_backend_config").CLASS_FILE_PATH_MAPPING
    return getattr(importlib.import_module(mapping[name]), name)


@cache
def _docs(class_name: str) -> tuple[dict[str, Any], ...]:
    files = _module("constants.executable_backend_config").MULTI_TURN_FUNC_DOC_FILE_MAPPING
    path = data_dir() / "multi_turn_func_doc" / files[class_name]
    return tuple(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                 if line.strip())


def function_docs(involved_classes: Sequence[str]) -> list[dict[str, Any]]:
    """BFCL's function docs of the classes, in their order, each description ending with
    BFCL's Python hint (as BFCL's dataset loader gives them to the model)."""
    docs = []
    for name in involved_classes:
        for doc in _docs(name):
            doc = copy.deepcopy(doc)
            doc["description"] = str(doc.get("description", "")) + LANGUAGE_HINT
            docs.append(doc)
    return docs


@cache
def _methods(involved_classes: tuple[str, ...]) -> dict[str, str]:
    """Public method name -> class, as BFCL's executor maps them (a later class wins)."""
    out: dict[str, str] = {}
    for name in involved_classes:
        for method, _ in inspect.getmembers(_class(name), inspect.isfunction):
            if not method.startswith("_"):
                out[method] = name
    return out


# --- entries ---------------------------------------------------------------------------------
class GroundTruthError(ValueError):
    """A possible answer whose calls cannot be played: not a call, not a method of the
    involved classes, or arguments its signature does not take."""


def category_of_id(entry_id: str) -> str:
    """BFCL's reading of an entry's category from its id (``multi_turn_base_3`` ->
    ``multi_turn_base``)."""
    return str(entry_id).rsplit("_", 1)[0]


@dataclass(frozen=True)
class Entry:
    """A validated BFCL multi-turn entry (see the module docstring)."""

    id: str
    category: str
    turns: list[list[dict[str, Any]]]
    initial_config: dict[str, Any]
    involved_classes: tuple[str, ...]
    ground_truth: list[list[str]]
    missed_function: dict[int, list[str]] = field(default_factory=dict)

    @property
    def long_context(self) -> bool:
        """BFCL loads the backends' long-context extras when the id's category says so."""
        category = category_of_id(self.id)
        return "long_context" in category or "composite" in category

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Entry:
        """An entry from a row in BFCL's shape (``id``, ``question``, ``initial_config``,
        ``involved_classes``, ``ground_truth``, optional ``missed_function`` and
        ``category``). Raises ValueError naming the first thing that is wrong."""
        if not isinstance(row, Mapping):
            raise ValueError(f"a BFCL multi-turn row is an object, got {type(row).__name__}")
        entry_id = row.get("id")
        where = f"BFCL multi-turn row {entry_id!r}"
        if not isinstance(entry_id, str) or not entry_id:
            raise ValueError(f"a BFCL multi-turn row needs a string 'id', got {entry_id!r}")
        missing = [k for k in ("question", "involved_classes", "ground_truth") if k not in row]
        if missing:
            raise ValueError(f"{where} lacks {', '.join(map(repr, missing))} (BFCL's shape: "
                             f"id, question, initial_config, involved_classes, ground_truth)")
        turns = row["question"]
        if not isinstance(turns, list) or not all(isinstance(t, list) for t in turns) \
                or not turns:
            raise ValueError(f"{where}: 'question' must be a non-empty list of turns, each a "
                             f"list of messages")
        for i, turn in enumerate(turns):
            for m in turn:
                if not isinstance(m, Mapping) or m.get("role") not in ("user", "system") \
                        or not isinstance(m.get("content"), str):
                    raise ValueError(f"{where}: turn {i} has a message that is not a user or "
                                     f"system message with string content: {m!r}")
        classes = row["involved_classes"]
        if not isinstance(classes, list) or not classes:
            raise ValueError(f"{where}: 'involved_classes' must be a non-empty list")
        unknown = [c for c in classes if c not in CLASSES]
        if unknown:
            raise ValueError(f"{where}: unknown involved classes {unknown}; BFCL's multi-turn "
                             f"backends are {', '.join(CLASSES)}")
        config = row.get("initial_config") or {}
        if not isinstance(config, Mapping):
            raise ValueError(f"{where}: 'initial_config' must be an object")
        truth = row["ground_truth"]
        if not isinstance(truth, list) or not all(
                isinstance(t, list) and all(isinstance(s, str) for s in t) for t in truth):
            raise ValueError(f"{where}: 'ground_truth' must be a list of turns, each a list of "
                             f"BFCL call strings such as \"cd(folder='document')\"")
        if len(truth) != len(turns):
            raise ValueError(f"{where}: {len(turns)} turns of questions but {len(truth)} "
                             f"turns of ground truth")
        missed_raw = row.get("missed_function") or {}
        if not isinstance(missed_raw, Mapping):
            raise ValueError(f"{where}: 'missed_function' must map a turn index to names")
        names = {d["name"] for c in classes for d in _docs(c)}
        missed: dict[int, list[str]] = {}
        for key, funcs in missed_raw.items():
            try:
                index = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"{where}: missed_function key {key!r} is not a turn "
                                 f"index") from None
            if not 0 <= index < len(turns) or not isinstance(funcs, list):
                raise ValueError(f"{where}: missed_function maps turn indices 0.."
                                 f"{len(turns) - 1} to lists of function names, got "
                                 f"{key!r}: {funcs!r}")
            funcs = [f.get("name") if isinstance(f, Mapping) else f for f in funcs]
            stray = [f for f in funcs if f not in names]
            if stray:
                raise ValueError(f"{where}: missed_function names {stray}, which the involved "
                                 f"classes do not document")
            if turns[index]:
                raise ValueError(f"{where}: turn {index} adds held-back functions, so BFCL "
                                 f"wants it to have no user message")
            missed[index] = list(funcs)
        entry = cls(entry_id, str(row.get("category") or category_of_id(entry_id)),
                    [[dict(m) for m in t] for t in turns], copy.deepcopy(dict(config)),
                    tuple(classes), [list(t) for t in truth], missed)
        for i, turn in enumerate(truth):
            for text in turn:
                try:
                    parse_call_string(text, entry.involved_classes)
                except ValueError as exc:
                    raise GroundTruthError(f"{where}: ground truth turn {i}: {exc}") from None
        return entry

    def held_back(self) -> set[str]:
        """Functions not offered at the start (``miss_func``)."""
        return {f for funcs in self.missed_function.values() for f in funcs}


# --- calls as BFCL writes them ---------------------------------------------------------------
def parse_call_string(text: str, involved_classes: Sequence[str]) -> ToolCall:
    """One BFCL call string (``mv(source='a', destination='b')``, positional arguments too) as
    a `ToolCall` with named arguments. Only literal arguments of a method of the involved
    classes are read (nothing is evaluated); anything else raises ValueError."""
    shown = repr(text) if len(text) <= 120 else repr(text[:100] + "...")
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"{shown} is not a call: {exc.msg}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"{shown} is not a call of a function by name")
    name = node.func.id
    owner = _methods(tuple(involved_classes)).get(name)
    if owner is None:
        raise ValueError(f"{shown} calls {name!r}, which is not a method of "
                         f"{', '.join(involved_classes)}")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    except ValueError:
        raise ValueError(f"{shown}: its arguments are not all literals") from None
    if len(kwargs) != len(node.keywords):
        raise ValueError(f"{shown}: **arguments are not supported")
    signature = inspect.signature(getattr(_class(owner), name))
    params = list(signature.parameters.values())[1:]  # without self
    try:
        bound = signature.replace(parameters=params).bind(*args, **kwargs)
    except TypeError as exc:
        raise ValueError(f"{shown} does not fit {owner}.{name}: {exc}") from None
    return ToolCall(name, dict(bound.arguments))


def ground_truth_calls(entry: Entry) -> list[list[ToolCall]]:
    """The possible answer's calls, per turn."""
    return [[parse_call_string(s, entry.involved_classes) for s in turn]
            for turn in entry.ground_truth]


def _is_json_value(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, list):
        return all(_is_json_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_value(v) for k, v in value.items())
    return False


@cache
def _unsafe_names() -> frozenset[str]:
    """Names BFCL's ``eval`` would resolve to something other than a backend method: Python's
    builtins and the executor module's own globals."""
    utils = _module("eval_checker.multi_turn_eval.multi_turn_utils")
    return frozenset(dir(builtins)) | frozenset(vars(utils))


def render_call(call: ToolCall, involved_classes: Sequence[str]) -> str:
    """A parsed call as BFCL's FC handlers decode it for execution (``convert_to_function_call``:
    ``name(k=repr(v),...)``), made safe for BFCL's ``eval`` (module docstring)."""
    name, args = call.name, call.arguments
    if not isinstance(args, Mapping) or not _is_json_value(dict(args)) or \
            not all(_IDENT.match(k) for k in args):
        return _UNPARSABLE
    if not _IDENT.match(name) or keyword.iskeyword(name):
        return _UNPARSABLE
    if name not in _methods(tuple(involved_classes)) and name in _unsafe_names():
        name = f"toolrl_undefined_{name}"  # BFCL would call the builtin; here: a NameError
    return f"{name}({','.join(f'{k}={v!r}' for k, v in args.items())})"


# --- one episode's backends ------------------------------------------------------------------
def format_output(value: Any) -> str:
    """A backend's return value as BFCL's executor shows it to the model."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class Backends:
    """BFCL's backend instances of one entry, fresh (module docstring)."""

    def __init__(self, entry: Entry) -> None:
        stateless = _module("constants.executable_backend_config").STATELESS_CLASSES
        self.entry = entry
        self.instances: dict[str, Any] = {}
        for name in entry.involved_classes:
            instance = _class(name)()
            if name not in stateless:
                try:
                    instance._load_scenario(copy.deepcopy(entry.initial_config.get(name, {})),
                                            long_context=entry.long_context)
                except Exception as exc:
                    raise ValueError(f"BFCL multi-turn row {entry.id!r}: {name} cannot load "
                                     f"its initial_config: {type(exc).__name__}: {exc}") from None
            self.instances[name] = instance
        self.methods = _methods(entry.involved_classes)

    @staticmethod
    def methods_of(involved_classes: Sequence[str]) -> dict[str, str]:
        """Public method name -> class, as BFCL's executor maps them (a later class wins)."""
        return dict(_methods(tuple(involved_classes)))

    def execute(self, call: ToolCall) -> str:
        """Run one call; its output as BFCL's executor formats it (never raises)."""
        try:
            if call.name in _BLOCKED:
                raise Exception(f"Function call {call.name} is not allowed.")
            owner = self.methods.get(call.name)
            if owner is None:
                raise NameError(f"name {call.name!r} is not defined")
            if not isinstance(call.arguments, Mapping):
                raise TypeError(f"the arguments of {call.name} are not an object")
            # a copy: backends keep (and later change) the objects they are given, as BFCL's
            # eval hands each call fresh ones
            arguments = copy.deepcopy(dict(call.arguments))
            value = getattr(self.instances[owner], call.name)(**arguments)
            return format_output(value)
        except Exception as exc:
            return f"Error during execution: {exc}"

    def state(self) -> dict[str, dict[str, Any]]:
        """Each stateful backend's public attributes (what BFCL's state check compares)."""
        return {name: {k: v for k, v in vars(inst).items() if not k.startswith("_")}
                for name, inst in self.instances.items() if vars(inst)}


# --- BFCL's verdict --------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """BFCL's verdict on an episode: ``valid``, its error type and message (BFCL's own, e.g.
    ``multi_turn:instance_state_mismatch``) and, when a turn failed, which."""

    valid: bool
    error_type: str = ""
    error: str = ""
    turn: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "error_type": self.error_type, "error": self.error,
                "turn": self.turn}


def decoded_turns(turns: Sequence[Sequence[Sequence[ToolCall]]],
                  involved_classes: Sequence[str]) -> list[list[list[str]]]:
    """The episode as BFCL's evaluation decodes it: per turn, per step with calls, the call
    strings (steps without a call left out)."""
    return [[[render_call(c, involved_classes) for c in step] for step in turn if step]
            for turn in turns]


def checker_verdict(entry: Entry, turns: Sequence[Sequence[Sequence[ToolCall]]]) -> Verdict:
    """BFCL's verdict on the calls of an episode (per user turn reached, per step, the calls).

    As BFCL's ``_evaluate_single_multi_turn_entry``: fewer turns than the possible answer (the
    model was stopped) fail as ``multi_turn:force_terminated``; otherwise BFCL's
    ``multi_turn_checker`` decides."""
    if len(turns) != len(entry.ground_truth):
        return Verdict(False, "multi_turn:force_terminated",
                       f"Model was force-terminated during inference phase. The length of the "
                       f"model result turns ({len(turns)}) does not match the length of the "
                       f"ground truth turns ({len(entry.ground_truth)}).")
    checker = _module("eval_checker.multi_turn_eval.multi_turn_checker")
    utils = _module("eval_checker.multi_turn_eval.multi_turn_utils")
    model_name = f"toolrl_{uuid.uuid4().hex}"
    prefix = re.sub(r"[-./:]", "_", model_name)
    test_entry = {"id": entry.id, "initial_config": copy.deepcopy(entry.initial_config),
                  "involved_classes": list(entry.involved_classes)}
    try:
        result = checker.multi_turn_checker(
            decoded_turns(turns, entry.involved_classes), [list(t) for t in entry.ground_truth],
            test_entry, entry.category, model_name)
    finally:
        cache = vars(utils)
        for key in [k for k in list(cache) if k.startswith(prefix)]:
            cache.pop(key, None)
    if result.get("valid"):
        return Verdict(True)
    message = str(result.get("error_message", ""))
    turn = re.search(r"turn (\d+)", message)
    return Verdict(False, str(result.get("error_type", "")), message,
                   int(turn.group(1)) if turn else None)


# --- per-turn agreement ----------------------------------------------------------------------
@dataclass(frozen=True)
class TurnAgreement:
    """One user turn: calls expected and made; whether the backends' state and the outputs so
    far agree with the possible answer's (None for a turn whose answer is empty); for such a
    turn, whether the model made no call (it asked, or said it could not)."""

    turn: int
    expected_calls: int
    calls: int
    state: bool | None
    response: bool | None
    held_back: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "expected_calls": self.expected_calls, "calls": self.calls,
                "state": self.state, "response": self.response, "held_back": self.held_back}


def turn_agreement(entry: Entry, turns: Sequence[Sequence[Sequence[ToolCall]]]
                   ) -> list[TurnAgreement]:
    """`TurnAgreement` of every turn the episode reached (BFCL's sub-checkers, module
    docstring)."""
    checker = _module("eval_checker.multi_turn_eval.multi_turn_checker")
    model, truth = Backends(entry), Backends(entry)
    expected = ground_truth_calls(entry)
    outputs: list[str] = []
    out = []
    for i, turn in enumerate(turns[:len(expected)]):
        calls = [c for step in turn for c in step]
        outputs += [model.execute(c) for c in calls]
        wanted = [truth.execute(c) for c in expected[i]]
        if not expected[i]:
            out.append(TurnAgreement(i, 0, len(calls), None, None, not calls))
            continue
        state = checker.state_checker(model.instances, truth.instances)["valid"]
        response = checker.response_checker(outputs, wanted, i)["valid"]
        out.append(TurnAgreement(i, len(expected[i]), len(calls), bool(state), bool(response),
                                 None))
    return out
