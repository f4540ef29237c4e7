"""toolrl/FunctionCalling-v0: dataset-driven single-turn function calling (BFCL style).

A row holds the conversation, the tools offered, and the ground truth in BFCL's possible-answer
format: a list of expected calls, each ``{function_name: {param: [acceptable values]}}``, where
``""`` among the values means the parameter may be omitted. Categories: toolrl's ``simple``,
``multiple``, ``parallel``, ``parallel_multiple``, ``irrelevance`` (no call expected),
``relevance`` (any well-formed call), and BFCL's single-turn names (``simple_python``,
``live_multiple``, ...; see `toolrl.bfcl.BFCL_CATEGORIES`).

Nothing is executed: the episode is one assistant turn. The calls are validated against the
tools' JSON schemas (typed errors in ``info["errors"]``) and checked against the ground truth
with the shared BFCL AST checker (`toolrl.bfcl.check_parsed`), which decides ``success``;
as in BFCL, a malformed call fails the turn unless ``strict_parse=False``.

Rows come from `load_tasks` (JSON, JSONL or parquet; BFCL's question and possible-answer files
via `toolrl.data.load_bfcl`), from `toolrl data convert` (public training sets), or from
`make_tasks`, a seeded synthetic generator over a handful of everyday functions. Row fields:
``id``, ``category``, ``messages`` (or BFCL ``question``), ``tools`` (OpenAI schemas, or BFCL
``function``), ``ground_truth``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from toolrl import ParseResult, Tool, ToolCall, ToolEnv, Turn, bfcl, data, tasks_by_kind

SYSTEM_PROMPT = ("Call the functions needed to answer. If none of them fits, answer in plain "
                 "text without calling any.")


# --- loading ---------------------------------------------------------------------------------
normalize_row = data.normalize_row  # the row layout lives with the data check that reads it


def load_tasks(path: str | Path, answers: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows from JSON, JSONL or parquet. A BFCL question file (or any file with ``answers``, a
    BFCL possible-answer file) is joined with its answers by id first (`load_bfcl`)."""
    rows = data.load_rows(path)
    if answers is not None or (rows and all(data.is_bfcl_row(r) for r in rows)):
        return data.load_bfcl(path, answers)
    rows = [normalize_row(r) for r in rows]
    for row in rows:
        if "ground_truth" not in row:
            if row.get("category") not in ("irrelevance", "relevance"):
                raise ValueError(f"{path}: row {row.get('id')!r} has no ground_truth")
            row["ground_truth"] = []
    return rows


# --- synthetic data --------------------------------------------------------------------------
def _fn(name: str, description: str, properties: dict[str, Any],
        required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}}


FUNCTIONS: dict[str, dict[str, Any]] = {
    "get_weather": _fn("get_weather", "Current weather in a city.", {
        "city": {"type": "string", "description": "city name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    "convert_currency": _fn("convert_currency", "Convert an amount between currencies.", {
        "amount": {"type": "number"},
        "from_currency": {"type": "string", "description": "ISO code, e.g. USD"},
        "to_currency": {"type": "string", "description": "ISO code, e.g. EUR"}},
        ["amount", "from_currency", "to_currency"]),
    "book_table": _fn("book_table", "Book a restaurant table.", {
        "restaurant": {"type": "string"}, "people": {"type": "integer"},
        "time": {"type": "string", "description": "HH:MM, 24h"}},
        ["restaurant", "people", "time"]),
    "calculate_area": _fn("calculate_area", "Area of a shape.", {
        "shape": {"type": "string", "enum": ["circle", "square", "rectangle"]},
        "width": {"type": "number", "description": "width, or radius of a circle"},
        "height": {"type": "number"}}, ["shape", "width"]),
    "set_reminder": _fn("set_reminder", "Set a reminder.", {
        "text": {"type": "string"}, "minutes": {"type": "integer", "description": "from now"}},
        ["text", "minutes"]),
}

_CITIES = [("Paris", "Paris, France"), ("Tokyo", "Tokyo, Japan"), ("Lima", "Lima, Peru"),
           ("Oslo", "Oslo, Norway"), ("Cairo", "Cairo, Egypt"), ("Austin", "Austin, TX")]
_CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF"]
_RESTAURANTS = ["Blue Fig", "Casa Rio", "The Lantern", "Sakura"]
_REMINDERS = ["call mom", "water the plants", "stretch", "check the oven"]
_IRRELEVANT = ["Tell me a joke about cats.", "Who wrote Hamlet?",
               "What is the capital of Canada?", "Write a haiku about rain.",
               "How do I tie a bowline knot?", "Summarize the plot of Cinderella."]


def _example(rng: random.Random, name: str) -> tuple[str, dict[str, list[Any]]]:
    """(an imperative clause, possible answers) for one call of ``name``."""
    if name == "get_weather":
        city = rng.choice(_CITIES)
        if rng.random() < 0.5:
            unit = rng.choice(["celsius", "fahrenheit"])
            return (f"get the weather in {city[0]} in {unit}",
                    {"city": list(city), "unit": [unit]})
        return f"get the weather in {city[0]}", {"city": list(city), "unit": ["", "celsius"]}
    if name == "convert_currency":
        amount = rng.choice([5, 12, 40, 99.5, 250, 1000])
        a, b = rng.sample(_CURRENCIES, 2)
        return (f"convert {amount} {a} to {b}",
                {"amount": [amount], "from_currency": [a], "to_currency": [b]})
    if name == "book_table":
        place, people = rng.choice(_RESTAURANTS), rng.randint(1, 8)
        hour, minute = rng.randint(11, 22), rng.choice([0, 15, 30, 45])
        return (f"book a table at {place} for {people} at {hour}:{minute:02d}",
                {"restaurant": [place], "people": [people], "time": [f"{hour}:{minute:02d}"]})
    if name == "calculate_area":
        shape = rng.choice(["circle", "square", "rectangle"])
        width = rng.randint(1, 20)
        if shape == "rectangle":
            height = rng.randint(1, 20)
            return (f"compute the area of a {width} by {height} rectangle",
                    {"shape": ["rectangle"], "width": [width], "height": [height]})
        what = "radius" if shape == "circle" else "side"
        return (f"compute the area of a {shape} with {what} {width}",
                {"shape": [shape], "width": [width], "height": [""]})
    if name == "set_reminder":
        text, minutes = rng.choice(_REMINDERS), rng.choice([5, 10, 30, 60, 90])
        return (f"remind me to {text} in {minutes} minutes",
                {"text": [text, f"to {text}"], "minutes": [minutes]})
    raise ValueError(f"no example generator for {name!r}")


def _question(clauses: list[str]) -> str:
    if len(clauses) == 1:
        return clauses[0][0].upper() + clauses[0][1:] + "."
    return "Please " + ", and ".join(clauses) + "."


def make_task(rng: random.Random, category: str) -> dict[str, Any]:
    """One synthetic row of ``category``."""
    names = list(FUNCTIONS)
    if category == "simple":
        called, offered = [rng.choice(names)], None
    elif category == "multiple":
        called = [rng.choice(names)]
        offered = called + rng.sample([n for n in names if n != called[0]], rng.randint(1, 3))
    elif category == "parallel":
        called = [rng.choice(names)] * rng.randint(2, 3)
        offered = None
    elif category == "parallel_multiple":
        called = rng.sample(names, rng.randint(2, 3))
        offered = called + rng.sample([n for n in names if n not in called], 1)
    elif category == "irrelevance":
        called, offered = [], rng.sample(names, rng.randint(1, 3))
    else:
        raise ValueError(f"unknown category {category!r}; valid: {', '.join(bfcl.CATEGORIES)}")
    offered = list(dict.fromkeys(offered if offered is not None else called))
    rng.shuffle(offered)
    clauses, truth, seen = [], [], set()
    for name in called:
        for _ in range(20):  # parallel calls of one function: distinct arguments
            clause, answer = _example(rng, name)
            if clause not in seen:
                break
        seen.add(clause)
        clauses.append(clause)
        truth.append({name: answer})
    question = _question(clauses) if called else rng.choice(_IRRELEVANT)
    return {"category": category, "messages": [{"role": "user", "content": question}],
            "tools": [FUNCTIONS[n] for n in offered], "ground_truth": truth}


def oracle_calls(ground_truth: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None = None,
                 category: str | None = None) -> list[ToolCall]:
    """Calls that pass the check (`toolrl.bfcl.ground_truth_calls`)."""
    return bfcl.ground_truth_calls(ground_truth, tools, category)


_PLACEHOLDERS = {"string": "example", "integer": 1, "number": 1.0, "float": 1.0,
                 "boolean": True, "array": [], "tuple": [], "object": {}, "dict": {}}


def placeholder_call(tools: list[dict[str, Any]]) -> list[ToolCall]:
    """A well-formed call of the first tool (relevance rows expect any call)."""
    schemas = bfcl.tool_schemas(tools)
    if not schemas:
        return []
    name, schema = next(iter(schemas.items()))
    props = schema.get("properties") or {}
    return [ToolCall(name, {p: _PLACEHOLDERS.get((props.get(p) or {}).get("type"), "example")
                            for p in schema.get("required") or []})]


class FunctionCallingEnv(ToolEnv):
    """One turn: the model's calls are validated and checked against BFCL possible answers.

    Args:
        data: a dataset file (JSON, JSONL, parquet, or a BFCL question file) to draw rows from
            on a bare ``reset()``; None uses the synthetic generator.
        answers: BFCL possible-answer file for ``data`` (default: BFCL's layout beside it).
        categories: categories of synthetic rows.
        strict_parse: a malformed call fails the turn (BFCL decodes all or nothing); False
            judges the calls that parsed.
    """

    system_prompt = SYSTEM_PROMPT
    default_max_turns = 1
    per_task_tools = True  # each row brings its own tools

    def __init__(self, *, data: str | None = None, answers: str | None = None,
                 categories: list[str] | None = None, strict_parse: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.categories = list(categories or bfcl.CATEGORIES)
        unknown = [c for c in self.categories if c not in bfcl.CATEGORIES]
        if unknown:
            raise ValueError(f"no synthetic rows of {unknown}; choose from {list(bfcl.CATEGORIES)}")
        self.strict_parse = strict_parse
        self.dataset = load_tasks(data, answers) if data else None
        self.check: dict[str, Any] = {}

    @classmethod
    def make_tasks(cls, n: int, seed: int = 0, split: str = "train",
                   categories: list[str] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        """``n`` synthetic rows cycling through ``categories`` (default: all five)."""
        return tasks_by_kind(make_task, categories or bfcl.CATEGORIES, n, seed=seed,
                             split=split, name="function_calling", prefix="fc")

    def sample_task(self) -> dict[str, Any]:
        if self.dataset:
            return self.dataset[int(self.np_random.integers(len(self.dataset)))]
        seed = int(self.np_random.integers(2**31 - 1))
        return self.make_tasks(1, seed=seed, categories=self.categories)[0]

    def setup(self, row: dict[str, Any]) -> None:
        row.update(normalize_row(row))
        if "ground_truth" not in row:
            if row.get("category") not in ("irrelevance", "relevance"):
                raise ValueError(f"FunctionCalling row {row.get('id')!r} has no ground_truth")
            row["ground_truth"] = []
        bfcl.parse_ground_truth(row["ground_truth"])  # malformed ground truth fails here, loudly
        bfcl.check_mode(row.get("category"), len(row["ground_truth"]))  # and unscorable categories
        self.check = {}
        self.last_parse = ParseResult(calls=[], text="")

    def episode_tools(self) -> list[Tool]:
        """The row's tools; a Java or JavaScript row's as BFCL shows them (every parameter a
        string of source code; the row keeps the language types the checker reads)."""
        tools = self.row.get("tools", [])
        language = bfcl.language_of(self.row.get("category"))
        if language is not None:
            tools = bfcl.presented_tools(tools, language)
        return [Tool.from_schema(schema) for schema in tools]

    def on_turn(self, parse: ParseResult, results: list[Any]) -> Turn:
        self.last_parse = parse
        return Turn(terminated=True)

    def evaluate(self) -> bool:
        result = bfcl.check_parsed([self.last_parse], self.row["ground_truth"],
                              self.row.get("category"), self.row.get("tools"),
                              strict_parse=self.strict_parse)
        self.check = {"valid": result.valid, "error": result.error,
                      "error_type": result.error_type}
        return result.valid

    def state_snapshot(self) -> dict[str, Any]:
        return dict(self.check)

    def oracle_action(self) -> str:
        tools = self.row.get("tools")
        calls = oracle_calls(self.row["ground_truth"], tools, self.row.get("category"))
        if not calls and bfcl.check_mode(self.row.get("category"), 0) == "relevance":
            calls = placeholder_call(tools or [])
        if not calls:
            return "None of the available functions can help with that."
        return self.render_calls(calls)
