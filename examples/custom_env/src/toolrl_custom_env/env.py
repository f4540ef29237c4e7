"""custom/UnitConvert-v0: convert a quantity with a ``convert`` tool, then ``submit``."""

from __future__ import annotations

import random
from typing import Any, Literal

import toolrl

FACTORS = {("km", "mi"): 0.621371, ("mi", "km"): 1.609344, ("kg", "lb"): 2.204623,
           ("lb", "kg"): 0.453592, ("m", "ft"): 3.280840, ("ft", "m"): 0.3048}


class UnitConvertEnv(toolrl.SubmitAnswer):
    """Unit conversion: one tool call, one submit; success = answer within 0.1%.

    A `toolrl.SubmitAnswer` env: its episode ends with a ``submit`` call (``self.submitted``)
    or a message without any call."""

    system_prompt = "Convert with the convert tool, then call submit with the result."
    default_max_turns = 4

    @classmethod
    def make_tasks(cls, n: int, seed: int = 0, split: str = "train",
                   **kwargs: Any) -> list[dict[str, Any]]:
        rng = random.Random(f"unit-convert:{split}:{seed}")
        rows = []
        for i in range(n):
            (a, b), value = rng.choice(sorted(FACTORS)), rng.randint(1, 500)
            rows.append({"id": f"units-{split}-{seed}-{i}", "question":
                         f"How many {b} is {value} {a}?", "ground_truth":
                         round(value * FACTORS[a, b], 4), "convert": [value, a, b]})
        return rows

    def setup(self, row: dict[str, Any]) -> None:
        self.submitted: float | None = None

    @toolrl.tool(inline=True)
    def convert(self, value: float, from_unit: Literal["km", "mi", "kg", "lb", "m", "ft"],
                to_unit: Literal["km", "mi", "kg", "lb", "m", "ft"]) -> float:
        """Convert a value between units.

        Args:
            value: the quantity
            from_unit: its unit
            to_unit: the unit wanted
        """
        if (from_unit, to_unit) not in FACTORS:
            raise ValueError(f"cannot convert {from_unit} to {to_unit}")
        return round(value * FACTORS[from_unit, to_unit], 4)

    submit = toolrl.submit_tool(float)

    def evaluate(self) -> bool:
        truth = float(self.row["ground_truth"])
        return self.submitted is not None and abs(self.submitted - truth) <= 1e-3 * abs(truth)

    def oracle_action(self) -> str:
        value, a, b = self.row["convert"]
        if self.turn == 0:
            call = toolrl.ToolCall("convert", {"value": value, "from_unit": a, "to_unit": b})
        else:
            call = toolrl.ToolCall("submit", {"answer": self.row["ground_truth"]})
        return self.render_calls([call])
