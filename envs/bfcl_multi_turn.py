"""toolrl/BFCLMultiTurn-v0: one BFCL multi-turn entry per episode, on BFCL's own backends, scored
by BFCL's own multi-turn checker (`toolrl.bfcl_multi_turn`).

- ``reset`` instantiates the entry's backends (GorillaFileSystem, TradingBot, TravelAPI, ...)
  fresh from its ``initial_config``; the episode's calls run against them and the model sees
  their real outputs, formatted as BFCL's executor formats them. Two episodes share nothing,
  even of one entry (a GRPO group).
- The tools are BFCL's function docs of the involved classes, each ending with BFCL's Python
  hint, less the functions a ``miss_func`` entry holds back.
- The user turns come in order. The model calls tools for as many steps as it likes; a message
  without a well-formed call ends its turn (BFCL's FC handlers likewise skip a malformed call
  and end the turn on a message that decodes to none), and the next user turn follows. At a
  ``miss_func`` turn the held-back functions become callable and the user message is BFCL's:
  their docs, then "I have updated some more functions you can choose from. What about now?".
  A ``miss_param`` turn lacks what the call needs: the possible answer is no call (the model
  should ask), and the next turn supplies it.
- More than BFCL's ``MAXIMUM_STEP_LIMIT`` (20) steps with calls in one turn stop the entry, as
  BFCL force-terminates it.
- ``success`` is BFCL's verdict (``multi_turn_checker`` on the episode's calls as BFCL's
  pipeline decodes them); the final info and `state_snapshot` carry it (``bfcl``: the verdict,
  its error type, and per turn whether state and outputs agreed with the possible answer,
  `toolrl.bfcl_multi_turn.turn_agreement`), and `eval_metrics` sums them per category.
- The oracle plays the possible answer: a turn's calls in one message, then a message without
  calls; for a turn whose answer is empty, a question back.

Rows are BFCL's entries with their possible answer (``toolrl data convert --from
bfcl-multi-turn``, or `toolrl.data.load_bfcl_multi_turn`); a bare ``reset()`` and `make_tasks`
draw from the ``bfcl-eval`` wheel: training splits from the unused ``multi_turn_composite``
set (the 103 of its 200 entries whose possible answer the backends can play), ``val``/``test``
from the four scored categories (``categories`` overrides).
"""

from __future__ import annotations

import copy
import functools
import json
import random
from collections.abc import Sequence
from typing import Any

from toolrl import ParseResult, Tool, ToolCall, ToolEnv, ToolResult, Trajectory, Turn, data
from toolrl import bfcl_multi_turn as mt

ENV_ID = "toolrl/BFCLMultiTurn-v0"
_SPLITS = {"train": mt.TRAINING_CATEGORIES, "warm_start": mt.TRAINING_CATEGORIES,
           "val": mt.MULTI_TURN_CATEGORIES, "test": mt.MULTI_TURN_CATEGORIES}
ASK = "I need more information to do that. Could you tell me the missing details?"
DONE = "Done."


@functools.cache
def playable_rows(category: str) -> tuple[dict[str, Any], ...]:
    """A category's rows that pass the row check (`toolrl.data.check_rows`): all of the four
    scored categories; 103 of the composite set's 200 (the others' possible answers call
    functions or arguments the backends no longer have, or do not parse)."""
    rows = data.load_bfcl_multi_turn(category)
    bad = {p.index for p in data.check_rows(rows, category).blocking}
    return tuple(r for i, r in enumerate(rows) if i not in bad)


class _BackendTool(Tool):
    """A BFCL backend method: offered with BFCL's doc, its arguments checked by the backend
    itself (as in BFCL), so toolrl's schema validation only requires a JSON object."""

    def validate(self, arguments: Any) -> dict[str, Any] | None:
        return None if isinstance(arguments, dict) else super().validate(arguments)


@functools.cache
def _tool_templates(classes: tuple[str, ...]) -> tuple[Tool, ...]:
    """The tools of a set of classes, without an implementation (each episode binds its own
    backends); inline: a message's calls run in order, one after the other."""
    docs = {d["name"]: d for d in mt.function_docs(classes)}
    methods = mt.Backends.methods_of(classes)
    return tuple(_BackendTool.from_schema(
        {"name": name, "description": docs.get(name, {}).get("description", name),
         "parameters": docs.get(name, {}).get("parameters") or {"type": "object",
                                                                  "properties": {}}},
        inline=True) for name in methods)


class BFCLMultiTurnEnv(ToolEnv):
    """A BFCL multi-turn entry (module docstring).

    Args:
        categories: BFCL categories a bare ``reset()`` and `make_tasks` draw from (default:
            by split, module docstring).
        system_prompt: a system message before the first user turn (None: BFCL's FC handlers
            add none).
        max_turns: assistant messages before the episode is cut (default: enough for every
            user turn to use BFCL's step limit).
    """

    default_max_output_chars = 1 << 20  # BFCL shows outputs whole
    default_max_calls_per_turn = 64
    system_prompt = None
    per_task_tools = True

    def __init__(self, *, categories: Sequence[str] | None = None,
                 system_prompt: str | None = None, max_turns: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        mt.require_bfcl_eval()  # not installed: one line saying how, before anything else
        self.fixed_max_turns = max_turns
        self.categories = tuple(categories) if categories else None
        for category in self.categories or ():
            data.bfcl_multi_turn_file(category)  # an unknown category fails here
        self.instance_prompt = system_prompt
        self.entry: mt.Entry | None = None
        self.result: dict[str, Any] = {}

    # --- task rows -------------------------------------------------------------------------
    @classmethod
    def make_tasks(cls, n: int, seed: int = 0, split: str = "train",
                   categories: Sequence[str] | None = None, **kwargs: Any
                   ) -> list[dict[str, Any]]:
        """``n`` rows of the categories (default by ``split``: ``train``/``warm_start`` the
        unused composite set, ``val``/``test`` the four scored categories), shuffled by
        ``seed`` and cycled when ``n`` exceeds them (``n <= 0``: every row once, in order)."""
        if categories is None:
            if split not in _SPLITS:
                raise ValueError(f"unknown split {split!r}; valid: {', '.join(_SPLITS)}")
            categories = _SPLITS[split]
        rows = [r for c in categories for r in playable_rows(c)]
        if n <= 0:
            return rows
        rng = random.Random(f"bfcl_multi_turn:{split}:{seed}")
        out: list[dict[str, Any]] = []
        while len(out) < n:
            block = list(rows)
            rng.shuffle(block)
            out += block
        return copy.deepcopy(out[:n])

    def sample_task(self) -> dict[str, Any]:
        return self.make_tasks(1, seed=int(self.np_random.integers(2**31 - 1)), split="val",
                               categories=self.categories)[0]

    # --- the episode -----------------------------------------------------------------------
    def setup(self, row: dict[str, Any]) -> None:
        self.entry = mt.Entry.from_row(row)
        self.backends = mt.Backends(self.entry)
        self.expected = mt.ground_truth_calls(self.entry)
        self.offered = {d["name"]: d for d in mt.function_docs(self.entry.involved_classes)}
        self.hidden = self.entry.held_back()
        self.user_turn = 0
        self.steps = 0  # steps with calls in the current user turn
        self.calls: list[list[list[ToolCall]]] = [[]]  # per user turn, per step
        self.oracle_played = False
        self.forced = False
        self.result = {}
        if self.fixed_max_turns is None:
            self.max_turns = len(self.entry.turns) * (mt.max_steps() + 1)

    def initial_messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        messages = self._turn_messages(0)
        if self.instance_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.instance_prompt})
        return messages

    def _turn_messages(self, turn: int) -> list[dict[str, Any]]:
        entry = self.entry
        if turn in entry.missed_function:
            added = [self.offered[name] for name in entry.missed_function[turn]]
            self.hidden -= set(entry.missed_function[turn])
            return [{"role": "user", "content": mt.added_functions_message(added)}]
        return copy.deepcopy(entry.turns[turn])

    def episode_tools(self) -> list[Tool]:
        """Every public method of the involved classes runs (as in BFCL); the documented ones
        carry BFCL's doc."""
        tools = []
        for template in _tool_templates(self.entry.involved_classes):
            tool = copy.copy(template)  # the schema is checked once per class set, not per reset
            tool.fn = self._runner(template.name)
            tools.append(tool)
        return tools

    def _runner(self, name: str) -> Any:
        def run(**arguments: Any) -> str:
            return self.backends.execute(ToolCall(name, arguments))
        return run

    def tools_schema(self) -> list[dict[str, Any]]:
        """The functions offered now: BFCL's docs of the involved classes, less the ones held
        back (a ``miss_func`` turn adds them in its user message)."""
        tools = self.tools
        return [tools[name].schema for name in self.offered
                if name not in self.hidden and name in tools]

    def on_turn(self, parse: ParseResult, results: list[ToolResult]) -> Turn:
        if parse.calls:
            self.calls[-1].append(list(parse.calls))
            self.steps += 1
            if self.steps > mt.max_steps():  # BFCL force-terminates the entry
                self.forced = True
                return Turn(terminated=True)
            return Turn()
        self.user_turn += 1
        self.steps = 0
        self.oracle_played = False
        if self.user_turn >= len(self.entry.turns):
            return Turn(terminated=True)
        self.calls.append([])
        return Turn(messages=self._turn_messages(self.user_turn))

    def evaluate(self) -> bool:
        verdict = mt.checker_verdict(self.entry, self.calls)
        turns = mt.turn_agreement(self.entry, self.calls)
        self.result = {"id": self.entry.id, "category": self.entry.category,
                       **verdict.to_dict(), "turns_reached": len(self.calls),
                       "force_terminated": self.forced,
                       "per_turn": [t.to_dict() for t in turns]}
        return verdict.valid

    async def end_episode(self, reason: str) -> dict[str, Any]:
        end = await super().end_episode(reason)
        end["bfcl"] = copy.deepcopy(self.result)
        return end

    def state_snapshot(self) -> dict[str, Any]:
        if self.entry is None:
            return {}
        return {"bfcl": copy.deepcopy(self.result),
                "backends": json.loads(json.dumps(self.backends.state(), default=str))}

    # --- the oracle ------------------------------------------------------------------------
    def oracle_action(self) -> str:
        """The possible answer: the turn's calls in one message, then a message without calls
        (for a turn whose answer is empty, a question back)."""
        expected = self.expected[self.user_turn]
        if expected and not self.oracle_played:
            self.oracle_played = True
            return self.render_calls(expected)
        return DONE if expected else ASK

    @classmethod
    def eval_metrics(cls, trajectories: Sequence[Trajectory]) -> dict[str, Any] | None:
        """Per BFCL category: episodes, BFCL's accuracy, and per-turn agreement with the
        possible answer (turns whose state matched, whose outputs matched, empty-answer turns
        without a call); infrastructure failures left out and counted."""
        groups: dict[str, list[dict[str, Any]]] = {}
        failed: dict[str, int] = {}
        for t in trajectories:
            category = str((t.row or {}).get("category", "all"))
            if t.infra_failure is not None:
                failed[category] = failed.get(category, 0) + 1
                continue
            result = (t.final_state or {}).get("bfcl") or {}
            groups.setdefault(category, []).append({**result, "success": bool(t.success)})
        if not groups and not failed:
            return None
        out: dict[str, Any] = {}
        for category in sorted(set(groups) | set(failed)):
            results = groups.get(category, [])
            turns = [p for r in results for p in r.get("per_turn", [])]
            scored = [p for p in turns if p["state"] is not None]
            empty = [p for p in turns if p["held_back"] is not None]
            out[category] = {
                "n": len(results),
                "accuracy": sum(r["success"] for r in results) / len(results) if results
                else None,
                "turn_state_match": _mean([p["state"] for p in scored]),
                "turn_response_match": _mean([p["response"] for p in scored]),
                "asked_when_answer_empty": _mean([p["held_back"] for p in empty]),
                "force_terminated": sum(bool(r.get("force_terminated")) for r in results),
                "infra_failed": failed.get(category, 0),
            }
        return out


def _mean(values: list[bool]) -> float | None:
    return sum(values) / len(values) if values else None
