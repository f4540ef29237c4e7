"""Helpers shared by the benchmark scripts: machine label, result files, timing, bench envs.

Benchmarks import this module by name (``import benchlib``): a script's own directory is on
``sys.path``, and Ray adds the driver script's directory to its workers' path too, so
`register_bench_envs` can run in every Ray worker as a ``worker_process_setup_hook``.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
PLOTS_DIR = BENCH_DIR / "plots"
MODELS_DIR = ROOT / "models"  # git-ignored: tiny models and warm-started copies
SCRATCH = Path(tempfile.gettempdir()) / "toolrl-bench"  # logs and raw results of runs
TURNS_ENV_ID = "toolrl-bench/Turns-v0"

BENCH_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}


def set_bench_env() -> None:
    """Offline hubs, quiet Ray, a small vLLM CPU KV cache (unless already set)."""
    for key, value in BENCH_ENV.items():
        os.environ.setdefault(key, value)


# --- machine and results ---------------------------------------------------------------------
# The load when this benchmark process started (the report's, not the end's).
with contextlib.suppress(OSError):
    START_LOAD: float | None = os.getloadavg()[0]


def machine_label(**versions: str) -> str:
    """One line naming the machine the absolute numbers came from: the CPU's vendor, family,
    model and kernel-selecting ISA flags, cores, torch's threads and the load at start
    (`toolrl.machine`), then the versions given."""
    from toolrl.machine import this_machine

    parts = [this_machine(load_at_start=START_LOAD).label(),
             f"measured {time.strftime('%Y-%m-%d')}"]
    parts += [f"{k} {v}" for k, v in versions.items()]
    return ", ".join(parts)


def command_line(script: str, argv: Sequence[str]) -> str:
    """The command that reproduces a run, relative to the repository root."""
    return " ".join([".venv/bin/python", f"benchmarks/{script}", *argv]).strip()


def write_result(path: Path, text: str) -> Path:
    """Print ``text`` and write it to ``path`` (creating benchmarks/results/)."""
    print(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
             align: Sequence[str] | None = None) -> str:
    """A markdown table; numbers right-aligned unless ``align`` says otherwise."""
    rows = [list(r) for r in rows]
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def timed_alternating(fns: Sequence[Callable[[], Any]], reps: int, warmup: int = 1,
                      desc: str | None = None) -> list[list[float]]:
    """Time several functions in turn (a, b, c, a, b, c, ...) so that load from other
    processes hits them alike; returns the seconds of every repetition, per function. With
    ``desc``, a progress bar on stderr counts the calls (warm-up included)."""
    from tqdm import tqdm

    with tqdm(total=(warmup + reps) * len(fns), desc=desc, disable=desc is None,
              file=sys.stderr) as bar:
        for _ in range(warmup):
            for fn in fns:
                fn()
                bar.update()
        out: list[list[float]] = [[] for _ in fns]
        for _ in range(reps):
            for fn, times in zip(fns, out, strict=True):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
                bar.update()
    return out


def save_raw(name: str, data: Any) -> Path:
    """Raw results of a run as JSON in the scratch dir (not in the tree)."""
    path = SCRATCH / "raw" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


def save_plot(fig: Any, name: str) -> Path:
    """Save a matplotlib figure as benchmarks/plots/<name>.png."""
    PLOTS_DIR.mkdir(parents=True, exist_ok=True)
    path = PLOTS_DIR / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def actor_threads(trainer: Any) -> str:
    """The torch threads of a `Trainer`'s actor processes: Ray sets OMP_NUM_THREADS in each
    actor to its CPU share, ``resources.cpus_per_process`` (rounded down, at least 1)."""
    return str(max(1, int(trainer.cfg.resources.cpus_per_process)))


# --- models ----------------------------------------------------------------------------------
def tiny_model(size: str = "small", path: Path | None = None) -> Path:
    """The tiny model of ``size`` (built once, cached under models/)."""
    from toolrl.models.tiny import build_tiny_model

    default = MODELS_DIR / ("tiny" if size == "small" else f"tiny-{size}")
    return build_tiny_model(path or default, seed=0, size=size)


def warm_started_calculator_model(steps: int, out: Path | None = None,
                                  base: Path | None = None) -> Path:
    """The small tiny model after ``steps`` of SFT on Calculator oracle transcripts (cached):
    a model that emits the call format, so tool episodes really run (in toolrl and in TRL)."""
    out = out or MODELS_DIR / f"bench-calculator-warm-{steps}"
    if (out / "config.json").exists():
        return out
    from toolrl.envs.calculator import CalculatorEnv
    from transformers import AutoTokenizer

    from toolrl.trainer.warm_start import oracle_transcripts, sft

    base = base or tiny_model("small")
    tokenizer = AutoTokenizer.from_pretrained(base)
    rows = CalculatorEnv.make_tasks(2048, seed=0, split="warm_start", difficulty=1)
    transcripts = oracle_transcripts("toolrl/Calculator-v0", rows, tokenizer, max_len=512)
    tmp = out.with_name(out.name + ".partial")
    sft(str(base), transcripts, tmp, steps=steps, lr=3e-3, batch_size=16, seed=0)
    tmp.rename(out)
    return out


# --- a bench env with a controlled number of turns ---------------------------------------------
def register_bench_envs() -> type:
    """Register ``toolrl-bench/Turns-v0``: every assistant message is one call of the ``step``
    tool, and the episode ends after the row's ``turns`` turns (any model, random or trained,
    plays exactly that many turns). Returns the env class. Idempotent; usable as a Ray worker
    setup hook."""
    from toolrl.core.env import ToolEnv, Turn
    from toolrl.core.parse import FORMATS, ToolCallFormat
    from toolrl.core.registration import register_env
    from toolrl.core.tools import tool
    from toolrl.core.types import ParseResult, ToolCall

    if "toolrl-bench/every-message-is-a-call" not in FORMATS:
        @FORMATS.register("toolrl-bench/every-message-is-a-call")
        class EveryMessageIsACall(ToolCallFormat):
            name = "toolrl-bench/every-message-is-a-call"

            def _parse(self, text: str) -> ParseResult:
                return ParseResult(calls=[ToolCall("step", {})], text="")

    if "TurnsEnv" not in globals():
        class TurnsEnv(ToolEnv):
            """Each turn runs one real tool call; ends after the row's ``turns`` turns."""

            tool_format = "toolrl-bench/every-message-is-a-call"
            default_max_turns = 64

            @classmethod
            def make_tasks(cls, n: int, seed: int = 0, split: str = "train", turns: int = 2,
                           **kwargs: Any) -> list[dict[str, Any]]:
                return [{"id": f"turns-{split}-{seed}-{i}", "turns": turns,
                         "question": f"Task {i}: take {turns} steps, then report."}
                        for i in range(n)]

            @tool
            def step(self) -> str:
                """Take one step."""
                return "ok"

            def on_turn(self, parse: ParseResult, results: list[Any]) -> Turn:
                return Turn(terminated=self.turn >= int((self.row or {}).get("turns", 1)))

            def evaluate(self) -> bool:
                return True

        TurnsEnv.__module__ = __name__
        globals()["TurnsEnv"] = TurnsEnv
    register_env(TURNS_ENV_ID, globals()["TurnsEnv"])
    return globals()["TurnsEnv"]


# --- subprocess protocol (the step-alternating peers) ------------------------------------------
class Channel:
    """A line-JSON channel to a worker process: the worker's stdout carries only protocol
    lines (its own prints go to stderr, see `worker_channel`)."""

    def __init__(self, name: str, cmd: Sequence[str], log: Path, env: dict[str, str] | None = None,
                 cwd: Path = ROOT) -> None:
        self.name = name
        self.log_path = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, cwd=cwd, text=True, bufsize=1,
                                     env={**os.environ, **(env or {})}, start_new_session=True)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float) -> dict[str, Any]:
        """The next message; raises with the log's tail if the worker died or went silent."""
        import selectors

        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.name}: no message within {timeout:.0f} s"
                                       f"{self.tail()}")
                if sel.select(timeout=min(left, 5.0)):
                    line = self.proc.stdout.readline()
                    if not line:
                        self.proc.wait(timeout=30)
                        raise RuntimeError(f"{self.name} exited ({self.proc.returncode})"
                                           f"{self.tail()}")
                    message = json.loads(line)
                    if message.get("event") == "error":
                        raise RuntimeError(f"{self.name} failed: {message.get('error')}"
                                           f"{self.tail()}")
                    return message
        finally:
            sel.close()

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n--- " + str(self.log_path) + " (tail) ---\n" + "\n".join(text)

    def close(self, timeout: float = 120.0) -> None:
        """Ask the worker to stop; kill its whole session if it does not."""
        import signal

        if self.proc.poll() is None:
            try:
                self.send({"cmd": "stop"})
                self.proc.wait(timeout=timeout)
            except Exception:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._log.close()


def worker_channel() -> tuple[Callable[[dict[str, Any]], None], Callable[[], dict[str, Any]]]:
    """In a worker: (send, receive) over the original stdout / stdin; everything else the
    process (and its children) prints goes to stderr from now on."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: dict[str, Any]) -> None:
        proto.write(json.dumps(message) + "\n")
        proto.flush()

    def receive() -> dict[str, Any]:
        line = sys.stdin.readline()
        if not line:
            return {"cmd": "stop"}
        return json.loads(line)

    return send, receive
