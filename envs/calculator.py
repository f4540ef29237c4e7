"""toolrl/Calculator-v0: arithmetic problems solved with calculator tools, answered by submit().

Made for very small models: a one-line system prompt, six tools with terse schemas
(add, sub, mul, div, pow, submit), and small numbers at difficulty 1. Difficulty d means d
operations chained on a running value ("Start with 4. Add 3. Multiply by 2. What is the
result?"); difficulty 1 questions are one operation, phrased plainly ("What is 4 plus 3?") or
as a short word problem. Operands are drawn so that no other tool gives a step's result
(never ``2 + 2`` or ``5 * 1``): a right answer means the right tool. The outcome is the
submitted answer equal to the truth (relative tolerance 1e-6).

The scripted oracle (``oracle_action``, used by the warm start) follows the plan; with
``oracle="random_op"`` it keeps the operands but draws each operation at random (among those
whose result stays a small integer) and submits what the tools return: transcripts in the
exact call format that are usually wrong, for a warm start that teaches the format and leaves
choosing the operation to RL. With ``think=True`` the oracle reasons first, in a ``<think>``
block before each action (``<think>\\nadd 4 3\\n</think>\\n\\n``, then the call): the
transcripts of a thinking model (DeepSeek-R1 style), whose template drops that reasoning from
later turns.

Row fields: ``id``, ``question``, ``ground_truth`` (the answer), ``plan`` (the operations
``[op, a, b]`` whose results chain), ``difficulty``, ``category`` (``d1`` .. ``d4``).
"""

from __future__ import annotations

import operator
import random
from typing import Any

from toolrl import OracleUnavailable, SubmitAnswer, ToolCall, submit_tool, tool

SYSTEM_PROMPT = "Use the tools to compute, then call submit with the answer."
OPS = ("add", "sub", "mul", "div", "pow")
_APPLY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
          "div": operator.truediv, "pow": operator.pow}
_PLAIN = {"add": "What is {a} plus {b}?", "sub": "What is {a} minus {b}?",
          "mul": "What is {a} times {b}?", "div": "What is {a} divided by {b}?",
          "pow": "What is {a} to the power of {b}?"}
_WORD = {
    "add": ["{name} has {a} apples and gets {b} more. How many apples now?",
            "A box holds {a} pens. {b} pens are added. How many pens are in the box?"],
    "sub": ["{name} has {a} coins and spends {b}. How many coins are left?",
            "A bus carries {a} people. {b} get off. How many are still on the bus?"],
    "mul": ["{name} buys {a} bags with {b} sweets each. How many sweets in total?",
            "There are {a} rows of {b} chairs. How many chairs?"],
    "div": ["{name} shares {a} cards equally among {b} friends. How many cards each?",
            "{a} eggs are packed {b} per box. How many boxes?"],
    "pow": ["What is {a} raised to the power {b}?"],
}
_STEP = {"add": "Add {b}.", "sub": "Subtract {b}.", "mul": "Multiply by {b}.",
         "div": "Divide by {b}.", "pow": "Raise to the power {b}."}
ORACLES = ("plan", "random_op")
_NAMES = ("Ann", "Ben", "Cara", "Dan", "Eve", "Finn", "Gus", "Hana")


def _num(x: float) -> float | int:
    """Integral floats as ints (``7`` reads better than ``7.0`` and round-trips exactly)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return int(x)
    return x


def _operand(rng: random.Random, op: str, value: int | None) -> tuple[int, int] | None:
    """(a, b) for ``op`` on the running ``value`` (None: pick a fresh a), or None if impossible."""
    if op == "add":
        a = rng.randint(0, 20) if value is None else value
        return a, rng.randint(0, 20)
    if op == "sub":
        a = rng.randint(0, 20) if value is None else value
        return a, rng.randint(0, 20 if value is None else max(a, 0) + 5)
    if op == "mul":
        a = rng.randint(0, 12) if value is None else value
        if abs(a) > 200:
            return None
        return a, rng.randint(0, 9)
    if op == "div":
        if value is None:
            b = rng.randint(1, 10)
            return b * rng.randint(0, 12), b
        divisors = [d for d in range(2, 11) if value % d == 0]
        return (value, rng.choice(divisors)) if divisors and value != 0 else None
    if op == "pow":
        a = rng.randint(0, 5) if value is None else value
        if abs(a) > 12:
            return None
        return a, rng.randint(0, 3) if value is None else 2
    raise ValueError(f"unknown op {op!r}")


def _unambiguous(op: str, a: int, b: int) -> bool:
    """Whether ``op`` is the only tool that turns (a, b) into its result: a task that another
    tool also answers (``2 + 2``, ``5 * 1``, ``0 / 3``) cannot tell a right choice of tool
    from a lucky one."""
    result = _APPLY[op](a, b)
    for other in OPS:
        if other == op or (other == "div" and b == 0) or (other == "pow" and abs(b) > 64):
            continue
        if abs(_APPLY[other](a, b) - result) <= 1e-9 * max(1.0, abs(result)):
            return False
    return True


def random_op_plan(rng: random.Random, plan: list[list[Any]]) -> list[list[Any]]:
    """``plan`` with each operation redrawn at random; operands kept, results chained."""
    out: list[list[Any]] = []
    value: int | None = None
    for _, a, b in plan:
        a = a if value is None else value
        choices = []
        for op in OPS:
            if (op == "div" and b == 0) or (op == "pow" and (b > 3 or abs(a) > 12)):
                continue
            result = _APPLY[op](a, b)
            if float(result).is_integer() and abs(result) <= 10_000:
                choices.append((op, int(result)))
        op, value = rng.choice(choices)  # "add" is always among them
        out.append([op, a, b])
    return out


def make_task(rng: random.Random, difficulty: int, style: str = "mixed") -> dict[str, Any]:
    """One task with ``difficulty`` chained operations."""
    if not 1 <= difficulty <= 4:
        raise ValueError(f"difficulty must be 1..4, got {difficulty}")
    plan: list[list[Any]] = []
    value: int | None = None
    while len(plan) < difficulty:
        op = rng.choice(OPS)
        for _ in range(20):  # operands that only this operation answers
            ab = _operand(rng, op, value)
            if ab is not None and _unambiguous(op, *ab):
                break
        else:
            continue
        a, b = ab
        value = int(_num(_APPLY[op](a, b)))
        plan.append([op, a, b])
    if difficulty == 1:
        op, a, b = plan[0]
        word = style == "word" or (style == "mixed" and rng.random() < 0.5)
        template = rng.choice(_WORD[op]) if word else _PLAIN[op]
        question = template.format(a=a, b=b, name=rng.choice(_NAMES))
    else:
        steps = " ".join(_STEP[op].format(b=b) for op, _, b in plan)
        question = f"Start with {plan[0][1]}. {steps} What is the result?"
    return {"question": question, "ground_truth": value, "plan": plan,
            "difficulty": difficulty, "category": f"d{difficulty}"}


class CalculatorEnv(SubmitAnswer):
    """Arithmetic with tools; the episode ends when ``submit`` is called (or on plain text)."""

    system_prompt = SYSTEM_PROMPT
    default_max_turns = 8

    def __init__(self, *, difficulty: int | list[int] = 1, style: str = "mixed",
                 oracle: str = "plan", think: bool = False, **kwargs: Any) -> None:
        if oracle not in ORACLES:
            raise ValueError(f"Calculator oracle must be one of {ORACLES}, got {oracle!r}")
        super().__init__(**kwargs)
        self.difficulty = difficulty
        self.style = style
        self.oracle = oracle
        self.think = bool(think)
        self._oracle_plan: list[list[Any]] | None = None

    @classmethod
    def make_tasks(cls, n: int, seed: int = 0, split: str = "train",
                   difficulty: int | list[int] = 1, style: str = "mixed",
                   **kwargs: Any) -> list[dict[str, Any]]:
        """``n`` tasks; ``difficulty`` is one level or a list drawn from uniformly."""
        rng = random.Random(f"calculator:{split}:{seed}")
        levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
        rows = []
        for i in range(n):
            row = make_task(rng, rng.choice(levels), style)
            rows.append({"id": f"calc-{split}-{seed}-{i}", **row})
        return rows

    def sample_task(self) -> dict[str, Any]:
        seed = int(self.np_random.integers(2**31 - 1))
        return self.make_tasks(1, seed=seed, difficulty=self.difficulty, style=self.style)[0]

    def setup(self, row: dict[str, Any]) -> None:
        if "ground_truth" not in row:
            raise ValueError("a Calculator row needs 'ground_truth' (the numeric answer)")
        self.submitted = None
        plan = row.get("plan")
        if plan is not None and self.oracle == "random_op":
            plan = random_op_plan(random.Random(f"oracle:{row.get('id')}:{plan}"), plan)
        self._oracle_plan = plan

    # --- tools -----------------------------------------------------------------------------
    @tool(inline=True)
    def add(self, a: float, b: float) -> float:
        """a + b"""
        return _num(a + b)

    @tool(inline=True)
    def sub(self, a: float, b: float) -> float:
        """a - b"""
        return _num(a - b)

    @tool(inline=True)
    def mul(self, a: float, b: float) -> float:
        """a * b"""
        return _num(a * b)

    @tool(inline=True)
    def div(self, a: float, b: float) -> float:
        """a / b"""
        return _num(a / b)

    @tool(inline=True)
    def pow(self, a: float, b: float) -> float:
        """a ** b"""
        if abs(b) > 64 or abs(a) > 1e9:
            raise ValueError("operands too large for pow")
        return _num(float(a) ** b)

    submit = submit_tool(float)

    # --- episode logic ---------------------------------------------------------------------
    def evaluate(self) -> bool:
        if self.submitted is None:
            return False
        truth = float(self.row["ground_truth"])
        try:
            submitted = float(self.submitted)
        except OverflowError:  # an integer beyond float range (valid JSON): not the answer
            return False
        return abs(submitted - truth) <= 1e-6 * max(1.0, abs(truth))

    def oracle_action(self) -> str:
        plan = self._oracle_plan
        if plan is None:
            raise OracleUnavailable("this Calculator row has no 'plan'")
        if self.turn < len(plan):
            op, a, b = plan[self.turn]
            return self.render_calls([ToolCall(op, {"a": a, "b": b})],
                                     self._thought(f"{op} {a} {b}"))
        answer = self.row["ground_truth"] if self.oracle == "plan" else \
            _num(_APPLY[plan[-1][0]](plan[-1][1], plan[-1][2]))
        return self.render_calls([ToolCall("submit", {"answer": answer})],
                                 self._thought(f"submit {answer}"))

    def _thought(self, text: str) -> str:
        return f"<think>\n{text}\n</think>\n\n" if self.think else ""
