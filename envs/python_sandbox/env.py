"""toolrl/PythonSandbox-v0: a ``run_python(code)`` tool in an isolated subprocess.

Tasks need real computation (sums of squares, n-th primes, digit sums of factorials, divisor
counts, Fibonacci numbers modulo m); the agent runs code, reads the output, and calls
``submit(answer)``. Success = the exact answer. Each run gets its own temporary directory, CPU
and memory limits, a wall-clock timeout, an output cap and no network (see sandbox.py and
launcher.py). The env refuses to start where the kernel cannot isolate the code.

Row fields: ``id``, ``category``, ``question``, ``ground_truth`` (an integer), ``code`` (a
program that prints the answer, used by the scripted policy).
"""

from __future__ import annotations

import math
import random
from typing import Any

from toolrl.envs.python_sandbox.sandbox import (
    Limits,
    SandboxUnavailable,
    isolation_error,
)
from toolrl.envs.python_sandbox.sandbox import run_python as run_sandboxed

from toolrl import SubmitAnswer, ToolCall, ToolFailure, make_tasks_by_kind, submit_tool, tool

SYSTEM_PROMPT = "Use run_python to compute the answer (print it), then call submit with it."


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _nth_prime(n: int) -> int:
    count, candidate = 0, 1
    while count < n:
        candidate += 1
        if all(candidate % p for p in range(2, math.isqrt(candidate) + 1)):
            count += 1
    return candidate


def _fib_mod(n: int, m: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) % m
    return a


def make_task(rng: random.Random, kind: str) -> dict[str, Any]:
    if kind == "sum_squares":
        n = rng.randint(50, 500)
        question = f"What is the sum of the squares of the integers from 1 to {n}?"
        answer, code = n * (n + 1) * (2 * n + 1) // 6, \
            f"print(sum(i * i for i in range(1, {n} + 1)))"
    elif kind == "nth_prime":
        n = rng.randint(50, 300)
        question = f"What is the {_ordinal(n)} prime number?"
        answer = _nth_prime(n)
        code = ("primes = []\nk = 1\n"
                f"while len(primes) < {n}:\n    k += 1\n"
                "    if all(k % p for p in primes if p * p <= k):\n        primes.append(k)\n"
                "print(primes[-1])")
    elif kind == "factorial_digit_sum":
        n = rng.randint(20, 90)
        question = f"What is the sum of the digits of {n}! (the factorial of {n})?"
        answer = sum(map(int, str(math.factorial(n))))
        code = f"import math\nprint(sum(map(int, str(math.factorial({n})))))"
    elif kind == "divisor_count":
        n = rng.randint(1000, 200_000)
        question = f"How many positive divisors does {n} have?"
        answer = sum(1 for d in range(1, n + 1) if n % d == 0)
        code = f"n = {n}\nprint(sum(1 for d in range(1, n + 1) if n % d == 0))"
    elif kind == "fib_mod":
        n, m = rng.randint(50, 2000), rng.choice([97, 1000, 10007])
        question = (f"With F(0) = 0 and F(1) = 1, what is the Fibonacci number F({n}) "
                    f"modulo {m}?")
        answer = _fib_mod(n, m)
        code = (f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, (a + b) % {m}\nprint(a)")
    else:
        raise ValueError(f"unknown PythonSandbox task kind {kind!r}")
    return {"category": kind, "question": question, "ground_truth": answer, "code": code}


class PythonSandboxEnv(SubmitAnswer):
    """Compute answers with sandboxed Python.

    Args:
        limits: resource limits of each ``run_python`` call (`Limits`).
    """

    system_prompt = SYSTEM_PROMPT
    default_max_turns = 6
    KINDS = ("sum_squares", "nth_prime", "factorial_digit_sum", "divisor_count", "fib_mod")

    def __init__(self, *, limits: Limits | dict[str, Any] | None = None, **kwargs: Any) -> None:
        problem = isolation_error()
        if problem is not None:
            raise SandboxUnavailable(
                f"PythonSandbox-v0 refuses to run code without isolation: {problem}. It needs "
                f"Linux mount/network/PID namespaces (root, or unprivileged user namespaces "
                f"enabled: sysctl kernel.unprivileged_userns_clone=1).")
        super().__init__(**kwargs)
        self.limits = limits if isinstance(limits, Limits) else Limits(**(limits or {}))

    make_tasks = make_tasks_by_kind(make_task, name="python_sandbox", prefix="py")

    def setup(self, row: dict[str, Any]) -> None:
        if "ground_truth" not in row:
            raise ValueError("a PythonSandbox row needs 'ground_truth'")
        self.submitted = None

    @tool
    async def run_python(self, code: str) -> str:
        """Run a Python program in a sandbox and return what it prints.

        Args:
            code: the program; print the values you need
        """
        result = await run_sandboxed(code, self.limits)
        if result.sandbox_error is not None:
            raise ToolFailure("sandbox_unavailable", result.sandbox_error)
        if result.timed_out:
            raise ToolFailure("timeout", f"the program ran longer than {self.limits.wall_s:g} s "
                                         f"and was killed")
        out = result.stdout
        if result.stderr:
            out += ("\n" if out and not out.endswith("\n") else "") + "[stderr]\n" + result.stderr
        if result.output_exceeded:
            out += f"\n[output over {self.limits.max_output_bytes} bytes: the program was killed]"
        elif result.exit_code:
            reason = {128 + 24: " (CPU time limit)", 128 + 9: " (killed: CPU or memory limit)"
                      }.get(result.exit_code, "")
            out += f"\n[exit code {result.exit_code}{reason}]"
        return out

    submit = submit_tool(float)

    def evaluate(self) -> bool:
        try:
            return self.submitted is not None and float(self.submitted) == float(
                self.row["ground_truth"])
        except OverflowError:  # an integer beyond float range (valid JSON): not the answer
            return False

    def oracle_action(self) -> str:
        if self.turn == 0 and self.row.get("code"):
            return self.render_calls([ToolCall("run_python", {"code": self.row["code"]})])
        return self.render_calls([ToolCall("submit", {"answer": self.row["ground_truth"]})])
