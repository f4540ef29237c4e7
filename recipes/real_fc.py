"""The real-model recipe end to end (issue 34): `make real-fc`.

Phases, each a ``toolrl`` command whose progress shows as it runs, each timed:

1. ``data``: SmolLM2-135M-Instruct into models/ (`toolrl model fetch`), NESTFUL's first turns
   (`toolrl data convert --from nestful`, the nestful-wrapper wheel; the warm start's rows)
   split 9:1 into train/val by a hash of the id, from the bfcl-eval wheel (`--from bfcl`) the
   evaluation's rows (``bfcl_eval.jsonl``: BFCL v4's non-live categories, Java and
   JavaScript included, 1 in ``LIVE_EVAL`` of each live category held out by a hash of its id,
   and live_relevance) and the training's live rows (the other live rows, at most
   ``LIVE_CAP`` a category), and the contamination check of both training sets against the
   evaluation rows (a shared question in NESTFUL stops the recipe; live rows that share a
   question or a 13-word run are dropped: `toolrl data contamination --out`); half the clean
   live rows join
   NESTFUL's in the warm start (``sft_train.jsonl``, ``sft_val.jsonl``), the other half are
   RL's (``rl_train.jsonl``; ``rl_combined.jsonl`` adds two-call rows made of pairs of them,
   ``rl_unfit.jsonl`` also no-call rows whose tools do not fit the question);
2. ``machine``: the machine's identity and bare matmul rate in float32 and bfloat16, measured
   before the heavy phases, alone (``machine.json``: the compute account's denominators;
   redone every run, ~5 s);
3. ``train``: `toolrl train --config configs/real_fc.yaml` (the warm start, then GRPO);
4. ``eval_warm_start`` and ``eval_rl``: the warm-started and the final checkpoint on BFCL, in
   SmolLM2's whole context window (``EVAL_CONTEXT``: every row is played), the engine in one
   dtype for every evaluation of the ``--out`` (``--eval-dtype``, `eval_dtype`: by default
   bfloat16 where the machine's bare bf16 matmul is faster, pinned by the first evaluation);
5. with ``--sft-comparison``, ``sft_more`` and ``eval_sft_more``: the warm start trained for
   the RL steps' wall time on the gold calls of RL's rows instead (what RL is set beside);
6. ``eval_base``: `toolrl eval` of the imported model on the BFCL rows (last: the slowest
   evaluation, and not what RL is measured against);
7. ``report``: the machine, the warm start's (and the control's) held-out loss, BFCL's
   accuracy per category and its Non-Live (Java and JavaScript run), Live (held-out rows),
   Multi Turn and Overall columns for the three (four) checkpoints (``report.md``,
   ``bfcl.png``) with the wall time of every phase, and where the compute went
   (`compute_account`: tokens, FLOP per token, achieved FLOP/s and its share of the bare
   matmul rate, per phase).

    .venv/bin/python recipes/real_fc.py [--only data] [--bfcl-limit N] [--seed S]
        [--sft-comparison] [--multi-turn] [--warm-start-from OUT] [--eval-dtype auto]
        [--out outputs/real_fc] [-- key=value ...]   # overrides for train and eval
    .venv/bin/python recipes/real_fc.py --recorded benchmarks/results/real_fc.json

``--multi-turn`` also evaluates the warm start and the RL checkpoint on BFCL's four scored
multi-turn categories (``eval_multi_turn_*``, after ``eval_base``: 800 entries of up to 16
assistant messages each, hours on 2 cores), in SmolLM2's 8,192-token window
(``MULTI_TURN_CONTEXT``); the report merges each checkpoint's evaluations into one BFCL board.
``--warm-start-from OUT`` runs RL seeds from one warm start: the warm start and its evaluation
in ``OUT`` (and the base model's, once that run has it) are linked into this ``--out`` and
recorded as that run recorded them (`share_warm_start`); this run trains RL (and, with
``--sft-comparison``, its own control) and evaluates what it trained.

``--bfcl-limit N`` takes the first N questions of each category (a quick look, not BFCL's
number). Each phase starts with a line saying what it does; while a ``toolrl`` command prints
nothing for ``HEARTBEAT_S`` seconds a line says the phase's time so far and, when known, the
time left (from the command's own progress lines, or an earlier run's time of the phase).
``<out>/phases.json`` records each finished phase (wall time, finish time, the seed,
``--bfcl-limit`` and overrides that made it; ``PhaseRecord``): a rerun skips a recorded phase
whose output is still there and reports its recorded time, refuses one recorded with other
settings (use another ``--out``, or delete that phase's output), and goes on where a cut-off
run stopped (``toolrl train`` resumes from its own snapshots and checkpoints, ``toolrl eval``
from its journal of finished chunks). ``data`` is
redone every run (a minute; ``data/real_fc/`` is shared by every ``--out``); an output made
before ``phases.json`` existed is skipped too, its time unknown. Delete a phase's output, or
the whole ``--out``, to redo it. ``--recorded FILE`` only renders scores kept in the
repository (benchmarks/results/real_fc.json: the runs docs/guides/real-model.md reports) into
FILE's ``.md`` and ``docs/<stem>_bfcl.png`` (the guide's and the README's plot).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "real_fc.yaml"
MODEL = ROOT / "models" / "smollm2-135m-instruct"
DATA = ROOT / "data" / "real_fc"
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
# BFCL's non-live categories the evaluation runs: the five above (the table's columns) and
# Java and JavaScript, so BFCL's Non-Live Overall counts every column it has
NON_LIVE = (*CATEGORIES, "simple_java", "simple_javascript")
# BFCL's live categories (user-contributed questions, none of them a non-live one: the
# contamination check drops any that shares a question or a 13-word run), the same five kinds
# as the categories scored. 1 in LIVE_EVAL of each (by a hash of its id) is held out for the
# evaluation's Live columns (`hold_out_live`), with all of live_relevance, which nothing
# trains on; of the rest, at most LIVE_CAP of each are training rows (live_multiple's and
# live_irrelevance's would otherwise be most of them): half the warm start's, half RL's
LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
        "live_irrelevance")
LIVE_EVAL = 4
LIVE_CAP = 256
# two-call rows of each kind that `combine_calls` makes from RL's rows (rl_combined.jsonl: the
# RL rows of the parallel-call experiment in docs/guides/real-model.md)
COMBINED = 100
# no-call rows that `mismatch_tools` makes from RL's rows (rl_unfit.jsonl: rl_combined.jsonl's
# rows and these; what the policy must learn not to call, as BFCL's irrelevance asks)
MISMATCHED = 100
CHECKPOINTS = (("base", "eval_base"), ("warm start", "eval_warm_start"), ("RL", "eval_rl"),
               ("more SFT, RL's time", "eval_sft_more"))
# BFCL's four scored multi-turn categories (``--multi-turn``, `toolrl.core.bfcl_scores.MULTI_TURN`):
# 800 entries played through
# toolrl/BFCLMultiTurn-v0 with configs/bfcl_multi_turn.yaml's rollout, for the warm start and
# the RL checkpoint (``eval_multi_turn_*``; the report merges them into each one's board)
MULTI_TURN_CONFIG = ROOT / "configs" / "bfcl_multi_turn.yaml"
MULTI_TURN_EVALS = {"warm start": "eval_multi_turn_warm_start", "RL": "eval_multi_turn_rl"}
TOOLRL = str(Path(sys.executable).with_name("toolrl"))
# The evaluations' engine dtype (``--eval-dtype``). ``auto`` is bfloat16 where the machine's
# bare bf16 matmul (``machine.json``, measured alone before the phases) is at least
# EVAL_BF16_MARGIN times its float32 one, else float32 (the engine's CPU default). On an AMD
# EPYC family 25 model 17 (avx512_bf16, no AMX; bare bf16 2.35x fp32) 165 of the BFCL rows (1
# in 12) played 1.54x faster with a bf16 engine (173 -> 113 s) and scored the same (43 of 165;
# categories within 2 rows); on the Intel Xeon family 6 model 207 the bare bf16 matmul is half
# its fp32 one (benchmarks/results/real_fc_account.md). Every evaluation of one ``--out`` runs in
# one dtype, so its table compares checkpoints, not dtypes: the first evaluation pins it
# (EVAL_DTYPE); a folder whose evaluations began before the pin existed ran them in float32.
EVAL_DTYPES = ("auto", "float32", "bfloat16")
EVAL_BF16_MARGIN = 1.1
EVAL_DTYPE = "eval_dtype.json"


HEARTBEAT_S = 60.0  # a line while a command has been silent this long
PHASES = "phases.json"


class Terminated(BaseException):
    """SIGTERM reached the recipe (`stop_on_sigterm`)."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated


def stop_on_sigterm() -> None:
    """SIGTERM stops the recipe as Ctrl-C does: `run` asks the running command to stop and
    waits for it. Without it the recipe dies at once and the command's output pipe breaks
    under it (its next log line fails), instead of its own clean stop."""
    signal.signal(signal.SIGTERM, _terminated)


def run(*args: str) -> str:
    """A toolrl command, its output shown as it runs (with `PhaseClock.heartbeat` lines while it
    is silent); stops the recipe when it fails. Ctrl-C and SIGTERM (`stop_on_sigterm`) are passed
    on to the command once: the recipe waits for it to stop (`toolrl train`'s GRPO first
    finishes its step and checkpoints), then stops."""
    print(f"\n$ toolrl {' '.join(args)}", flush=True)
    clock = _clock or PhaseClock(args[0])
    lines: list[str] = []
    # its own process group: a Ctrl-C or a SIGTERM to the recipe's group reaches it once,
    # forwarded below (a second one tells `toolrl train` to stop without its checkpoint)
    proc = subprocess.Popen([TOOLRL, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, process_group=0)
    with clock.heartbeat():
        try:
            _echo(proc, lines, clock)
        except BaseException as stopped:
            _forward(proc, stopped)  # `toolrl train` stops at its step's end
            print(f"\nreal_fc: stopping; waiting for `toolrl {args[0]}` to stop", flush=True)
            while proc.returncode is None:
                try:
                    _echo(proc, lines)
                except (KeyboardInterrupt, Terminated) as again:  # the user insists: pass it on
                    _forward(proc, again)
            raise
    if proc.returncode != 0:
        sys.exit(f"real_fc: `toolrl {args[0]}` failed (exit {proc.returncode})")
    return "".join(lines)


def _forward(proc: subprocess.Popen[str], stopped: BaseException) -> None:
    """Ctrl-C reaches the command as SIGINT, anything else that stops the recipe as SIGTERM."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT if isinstance(stopped, KeyboardInterrupt)
                         else signal.SIGTERM)


def _echo(proc: subprocess.Popen[str], lines: list[str], clock: PhaseClock | None = None
          ) -> None:
    """Show and keep the command's lines until it exits."""
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
        if clock is not None:
            clock.saw(line)
    proc.wait()


# What the commands print about their progress (rich wraps lines and adds the logging call's
# file:line at the right of a log line's first line: `PhaseClock.saw` reads the last few lines
# joined, those removed)
_LOG_PATH = re.compile(r"\s+\S+\.py:\d+\s*$")
_WARM = re.compile(r"warm start step (\d+)/(\d+):.*?at most (\d+) min left")
_EVAL = re.compile(r"eval: (\d+)/(\d+) episodes,.*?(\d+(?:\.\d+)?) min")
_STEP = re.compile(r"(?<![\w/])step +(\d+)  ")  # the Tracker's step line: `step    5  ...`
_STEP_S = re.compile(r"timing/step_s=(\d+(?:\.\d+)?)")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


class PhaseClock:
    """One phase's time: spent so far (with ``before``, earlier cut-off attempts') and, when
    known, left: from what its command last said (the warm start's steps, GRPO's steps against
    ``grpo_steps``, eval's episodes), else from ``estimate``, an earlier run's time of it."""

    def __init__(self, name: str, before: float = 0.0, estimate: float | None = None,
                 grpo_steps: int | None = None, every: float | None = None) -> None:
        self.name, self.before, self.estimate, self.grpo_steps = name, before, estimate, grpo_steps
        self.every = HEARTBEAT_S if every is None else every
        self.start = self.heard = time.monotonic()  # heard: its last line, or last heartbeat
        self._tail: deque[str] = deque(maxlen=4)
        self._seen: set[tuple[str, int]] = set()
        self._step_s: dict[int, float] = {}
        self._said: tuple[float, float, str] | None = None  # seconds left, when, after what

    def spent(self) -> float:
        """Seconds of this phase so far, earlier attempts' included."""
        return self.before + time.monotonic() - self.start

    def saw(self, line: str) -> None:
        """A line of the command's output: what it says about its progress."""
        now = self.heard = time.monotonic()
        self._tail.append(_LOG_PATH.sub("", line).strip())
        text = " ".join(self._tail)
        for m in _WARM.finditer(text):
            if self._new("warm", int(m[1])):
                self._said = (60.0 * int(m[3]), now, f"warm start step {m[1]}/{m[2]}")
        for m in _EVAL.finditer(text):
            done, total = int(m[1]), int(m[2])
            if done and self._new("eval", done):
                self._said = (60.0 * float(m[3]) * (total - done) / done, now,
                              f"eval {done}/{total} episodes")
        steps = list(_STEP.finditer(text))
        for k, m in enumerate(steps):
            end = steps[k + 1].start() if k + 1 < len(steps) else len(text)
            step_s = _STEP_S.search(text, m.end(), end)
            if step_s and self.grpo_steps and self._new("grpo", int(m[1])):
                self._step_s[int(m[1])] = float(step_s[1])
                mean = sum(self._step_s.values()) / len(self._step_s)
                self._said = ((self.grpo_steps - int(m[1])) * mean, now,
                              f"GRPO step {m[1]}/{self.grpo_steps}")

    def _new(self, kind: str, at: int) -> bool:
        fresh = (kind, at) not in self._seen
        self._seen.add((kind, at))
        return fresh

    def left(self) -> str:
        """The time left as known, or ''."""
        if self._said is not None:
            seconds, when, after = self._said
            left = f"about {_minutes(max(seconds - (time.monotonic() - when), 0.0))} left"
            if self.grpo_steps and not self._step_s:  # the warm start's; GRPO not timed yet
                return f"{left} of the warm start (after {after}), then " \
                       f"{self.grpo_steps} GRPO steps, none timed yet"
            return f"{left} (after {after})"
        if self.estimate is not None:
            left = self.estimate - self.spent()
            return (f"about {_minutes(left)} left (an earlier run took "
                    f"{_minutes(self.estimate)})" if left > 0 else
                    f"past an earlier run's {_minutes(self.estimate)}")
        return ""

    def status(self) -> str:
        """The heartbeat line."""
        quiet = time.monotonic() - self.heard
        left = self.left()
        return (f"[real_fc] {self.name}: {_minutes(self.spent())} so far, nothing printed for "
                f"{_minutes(quiet)}" + (f"; {left}" if left else ""))

    @contextmanager
    def heartbeat(self) -> Iterator[None]:
        """While the block runs: `status` each ``every`` seconds nothing was printed."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(min(self.every, 1.0)):
                if time.monotonic() - self.heard >= self.every:
                    print(self.status(), flush=True)
                    self.heard = time.monotonic()

        thread = threading.Thread(target=beat, name=f"real_fc-{self.name}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


_clock: PhaseClock | None = None  # the phase running now (`PhaseRecord.run`)


class Phase(NamedTuple):
    """A step of the recipe: ``fn(*args)``; done once ``output`` exists (None: redone every run);
    ``redo`` is what to delete to redo it; ``what`` says what it does."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    output: Path | None
    redo: Path | None
    what: Callable[[], str]
    grpo_steps: int | None = None  # the GRPO steps it runs (`PhaseClock`'s time left)


class PhaseRecord:
    """``<out>/phases.json``: each finished phase (``phases``) with its wall time (earlier,
    cut-off attempts' included), finish time and the settings (seed, ``--bfcl-limit``,
    overrides) that made it; the time spent on phases cut off before they finished
    (``unfinished``). Rewritten atomically after each phase; ``path`` None keeps it in memory."""

    def __init__(self, path: Path | None, settings: Mapping[str, Any]) -> None:
        self.path, self.settings = path, dict(settings)
        data = json.loads(path.read_text()) if path is not None and path.exists() else {}
        self.finished: dict[str, dict[str, Any]] = data.get("phases", {})
        self.unfinished: dict[str, dict[str, Any]] = data.get("unfinished", {})
        self.times: dict[str, str] = {}  # this run's phase table, phase -> wall time

    def _settings(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        return {key: entry.get(key) for key in self.settings}

    def refuse_mismatches(self, phases: Sequence[Phase]) -> None:
        """Stop, naming each, when a phase whose output is here was recorded with other settings
        than this run's: its output is never reused by another configuration."""
        wrong = [p for p in phases if p.name in self.finished and p.output is not None
                 and p.output.exists() and "shared_from" not in self.finished[p.name]
                 and self._settings(self.finished[p.name]) != self.settings]
        if wrong:
            sys.exit("\n".join(
                f"real_fc: phase {p.name} was recorded in {self.path} with "
                f"{_show(self._settings(self.finished[p.name]))}, and this run has "
                f"{_show(self.settings)}: use another --out, or delete {p.redo} to redo it"
                for p in wrong))

    def run(self, phase: Phase) -> None:
        """Run ``phase`` unless it is done (recorded, or made before phases.json), timed with a
        `PhaseClock`; record it when it finishes, its time spent when it is cut off."""
        global _clock
        done = phase.output is not None and phase.output.exists()
        entry = self.finished.get(phase.name)
        if done and entry is not None:
            when = entry["finished"][:16].replace("T", " ")
            run = (f"the run in {_rel(Path(entry['shared_from']))}" if "shared_from" in entry
                   else "an earlier run")
            self.times[phase.name] = f"{_minutes(entry['seconds'])} ({run}, {when})"
            print(f"\n=== real_fc: {phase.name}: finished in {run} ({when}, "
                  f"{_minutes(entry['seconds'])}): skipped ===", flush=True)
            return
        if done:
            self.times[phase.name] = "not recorded (an earlier run)"
            print(f"\n=== real_fc: {phase.name}: {phase.output} exists (made before "
                  f"{PHASES} recorded phases): skipped ===", flush=True)
            return
        cut = self.unfinished.get(phase.name)
        cut = cut if cut is not None and self._settings(cut) == self.settings else None
        before = cut["seconds"] if cut else 0.0
        attempts = cut["attempts"] + 1 if cut else 1
        estimate = entry["seconds"] if entry is not None else None
        print(f"\n=== real_fc: {phase.name} ===\n{phase.what()}" + (
            f" (an earlier run took {_minutes(estimate)})" if estimate else "") + (
            f" ({_minutes(before)} spent before it was cut off)" if before else ""), flush=True)
        clock = _clock = PhaseClock(phase.name, before=before, estimate=estimate,
                                    grpo_steps=phase.grpo_steps)
        try:
            phase.fn(*phase.args)
        except BaseException:
            self.unfinished[phase.name] = {"seconds": round(clock.spent(), 1),
                                           "attempts": attempts,
                                           "stopped": _now(), **self.settings}
            self._save()
            print(f"\n=== real_fc: {phase.name} stopped after {_minutes(clock.spent())}: not "
                  f"finished; the same command goes on from here ===", flush=True)
            raise
        finally:
            _clock = None
        seconds = clock.spent()
        self.unfinished.pop(phase.name, None)
        self.finished[phase.name] = {"seconds": round(seconds, 1), "finished": _now(),
                                     "attempts": attempts, **self.settings}
        self._save()
        self.times[phase.name] = _minutes(seconds) + (
            f" ({attempts} attempts)" if attempts > 1 else "")
        print(f"=== real_fc: {phase.name} done in {self.times[phase.name]} ===", flush=True)

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({"phases": self.finished, "unfinished": self.unfinished},
                                  indent=2) + "\n")
        os.replace(tmp, self.path)


# What seeds of RL from one warm start share (``--warm-start-from``): the warm start and its
# evaluation, which the source must have finished; the base model's evaluation, and the warm
# start's multi-turn one, when the source has run them (else this run does)
SHARED = ("warm_start", "eval_warm_start")
_SHARED_OUTPUT = {"warm_start": "config.json", "eval_warm_start": "results.json"}


def share_warm_start(out: Path, source: Path, record: PhaseRecord) -> None:
    """Seeds of RL from one warm start: ``out``'s warm start and its evaluation are
    ``source``'s (a run of this recipe that finished them), linked into ``out``, and so are the
    base model's and the warm start's multi-turn evaluations where ``source`` finished them;
    their phases are recorded as ``source`` recorded them, with where they came from. Stops,
    naming what is missing, when ``source`` has not finished the warm start or its
    evaluation."""
    missing = [str(_rel(source / name / file)) for name, file in _SHARED_OUTPUT.items()
               if not (source / name / file).exists()]
    if missing:
        sys.exit(f"real_fc: --warm-start-from {_rel(source)} has not finished "
                 f"{', '.join(missing)}: run the recipe with --out {_rel(source)} first")
    out.mkdir(parents=True, exist_ok=True)
    if (source / EVAL_DTYPE).exists():  # their evaluations' dtype is this run's (`eval_dtype`)
        theirs = json.loads((source / EVAL_DTYPE).read_text())
        if not (out / EVAL_DTYPE).exists():
            (out / EVAL_DTYPE).write_text(json.dumps(theirs, indent=2) + "\n")
        elif json.loads((out / EVAL_DTYPE).read_text())["dtype"] != theirs["dtype"]:
            sys.exit(f"real_fc: {_rel(out)}'s evaluations run in another dtype than "
                     f"{_rel(source)}'s: use another --out")
    for name in SHARED:
        link = out / name
        if link.is_symlink() and link.resolve() == (source / name).resolve():
            continue
        if link.exists() or link.is_symlink():
            sys.exit(f"real_fc: {_rel(link)} exists and is not {_rel(source / name)}'s: use "
                     f"another --out")
        link.symlink_to(source / name, target_is_directory=True)
    multi = MULTI_TURN_EVALS["warm start"]
    for name in ("eval_base", multi):  # shared too when the source ran them
        if (source / name / "results.json").exists() and not (out / name).exists():
            (out / name).symlink_to(source / name, target_is_directory=True)
    theirs = PhaseRecord(source / PHASES, {}).finished
    for name in ("eval_base", "eval_warm_start", multi):
        if name in theirs and (out / name).is_symlink():
            record.finished[name] = {**theirs[name], "shared_from": str(source)}


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def _show(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in settings.items())


def config_value(key: str, overrides: Sequence[str]) -> Any:
    """``key`` of configs/real_fc.yaml with ``overrides`` (None when it cannot be read)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.select(OmegaConf.merge(OmegaConf.load(CONFIG),
                                                OmegaConf.from_dotlist(list(overrides))), key)
    except Exception:  # only for what a phase says it will do
        return None


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _rows(path: Path) -> str:
    """How many rows ``path`` holds ("the" when it is not there)."""
    if not path.exists():
        return "the"
    return f"{sum(1 for line in path.read_text().splitlines() if line.strip()):,}"


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def split_rows(source: Path, train: Path, val: Path, every: int = 10) -> tuple[int, int]:
    """One row in ``every`` (by a hash of its id) to ``val``, the rest to ``train``."""
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    held = [r for r in rows if int(hashlib.sha256(r["id"].encode()).hexdigest(), 16) % every
            == 0]
    kept = [r for r in rows if r not in held]
    for path, part in ((train, kept), (val, held)):
        _write_rows(path, part)
    return len(kept), len(held)


def cap_per_category(source: Path, out: Path, cap: int) -> dict[str, int]:
    """At most ``cap`` rows of each ``category`` (those first by a hash of their id)."""
    from toolrl.data.loader import load_rows

    rows = sorted(load_rows(source), key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
    kept: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        part = kept.setdefault(row["category"], [])
        if len(part) < cap:
            part.append(row)
    _write_rows(out, [r for part in kept.values() for r in part])
    return {category: len(part) for category, part in kept.items()}


def _bucket(row: dict[str, Any], n: int, salt: str = "half") -> int:
    return int(hashlib.sha256(f"{salt}:{row['id']}".encode()).hexdigest(), 16) % n


def hold_out_live(source: Path, held_out: Path, rest: Path, every: int = LIVE_EVAL
                  ) -> tuple[int, int]:
    """One live row in ``every`` of each category (by a hash of its id, independent of
    `split_live`'s) to ``held_out``, the evaluation's live rows; the others to ``rest``, from
    which the training rows come. Returns both counts."""
    from toolrl.data.loader import load_rows

    rows = load_rows(source)
    held = [r for r in rows if _bucket(r, every, salt="eval") == 0]
    kept = [r for r in rows if _bucket(r, every, salt="eval") != 0]
    _write_rows(held_out, held)
    _write_rows(rest, kept)
    return len(held), len(kept)


def split_live(source: Path, data: Path = DATA) -> dict[str, int]:
    """Half of the clean live rows (by a hash of the id) join NESTFUL's in the warm start,
    so it also sees several calls in one turn and no call at all; 1 in 20 of them are held
    out for its held-out loss. The other half are RL's rows."""
    from toolrl.data.loader import load_rows

    rows = load_rows(source)
    parts = {"sft_train": [r for r in rows if _bucket(r, 2) == 0 and _bucket(r, 20) != 0],
             "sft_val": [r for r in rows if _bucket(r, 20) == 0],
             "rl_train": [r for r in rows if _bucket(r, 2) == 1]}
    nestful = {"sft_train": load_rows(data / "nestful_train.jsonl"),
               "sft_val": load_rows(data / "nestful_val.jsonl"), "rl_train": []}
    for name, part in parts.items():
        _write_rows(data / f"{name}.jsonl", nestful[name] + part)
    return {name: len(part) for name, part in parts.items()}


def _one_call_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """RL's rows with one user message and one gold call: what `combine_calls` and
    `mismatch_tools` make new rows of."""
    return [r for r in rows if len(r.get("ground_truth") or []) == 1
            and [m["role"] for m in r["messages"]] == ["user"]]


def _tool_names(row: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in row["tools"]}


def combine_calls(rows: list[dict[str, Any]], per_kind: int, seed: int = 0,
                  max_tools_chars: int = 3000) -> list[dict[str, Any]]:
    """Rows that need two calls in one turn, made from pairs of RL's one-call rows (one user
    message, one gold call): their questions joined, their tools together, both gold calls
    expected (in either order). Ids ``synth_parallel:<a>+<b>`` (category ``live_parallel``):
    the two rows offer the same tools (BFCL's parallel: one function, two calls);
    ``synth_parallel_multiple:<a>+<b>`` (``live_parallel_multiple``): different functions.
    Only RL's own rows go in, so nothing here is new to the contamination check."""
    import random

    single = _one_call_rows(rows)
    rng = random.Random(seed)
    by_tools: dict[str, list[dict[str, Any]]] = {}
    for r in single:
        by_tools.setdefault(json.dumps(r["tools"], sort_keys=True), []).append(r)
    same = [(a, b) for group in by_tools.values() for i, a in enumerate(group)
            for b in group[i + 1:]]
    names = {id(r): _tool_names(r) for r in single}
    different = [(a, b) for a in single for b in single  # whose tools fit a prompt together
                 if names[id(a)].isdisjoint(names[id(b)])
                 and len(json.dumps(a["tools"] + b["tools"])) <= max_tools_chars]
    out = []
    for kind, pairs in (("synth_parallel", same), ("synth_parallel_multiple", different)):
        for a, b in rng.sample(pairs, min(per_kind, len(pairs))):
            first, second = a["messages"][0]["content"].strip(), b["messages"][0]["content"]
            tools = a["tools"] + [t for t in b["tools"] if t not in a["tools"]]
            out.append({"id": f"{kind}:{a['id']}+{b['id']}", "env": a["env"],
                        "source": "bfcl", "category": kind.replace("synth", "live"),
                        "messages": [{"role": "user", "content": f"{first}\nAlso: {second}"}],
                        "tools": tools, "ground_truth": a["ground_truth"] + b["ground_truth"]})
    return out


def _name_words(row: dict[str, Any]) -> set[str]:
    return {w for name in _tool_names(row) for w in re.split(r"[^a-z0-9]+", name.lower())
            if len(w) > 2}


def mismatch_tools(rows: list[dict[str, Any]], n: int, seed: int = 0,
                   max_tools_chars: int = 3000) -> list[dict[str, Any]]:
    """Rows where no offered tool fits, made the way BFCL's irrelevance rows are: the question of
    one of RL's one-call rows with the tools of another whose function names share no word
    with its own (``get_weather`` and ``weather_now`` do: never paired), no call expected.
    Ids ``synth_irrelevance:<question's row>+<tools' row>`` (category ``live_irrelevance``).
    Only RL's own rows go in, so nothing here is new to the contamination check."""
    import random

    single = [r for r in _one_call_rows(rows) if len(json.dumps(r["tools"])) <= max_tools_chars]
    words = {id(r): _name_words(r) for r in single}
    pairs = [(a, b) for a in single for b in single if words[id(a)].isdisjoint(words[id(b)])
             and _tool_names(a).isdisjoint(_tool_names(b))]
    return [{"id": f"synth_irrelevance:{a['id']}+{b['id']}", "env": a["env"], "source": "bfcl",
             "category": "live_irrelevance", "messages": a["messages"], "tools": b["tools"],
             "ground_truth": []}
            for a, b in random.Random(seed).sample(pairs, min(n, len(pairs)))]


def data_phase(bfcl_limit: int | None) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    run("model", "fetch", "smollm2-135m-instruct", "--out", str(MODEL))
    run("data", "convert", "--from", "nestful", "--out", str(DATA / "nestful.jsonl"))
    n_train, n_val = split_rows(DATA / "nestful.jsonl", DATA / "nestful_train.jsonl",
                                DATA / "nestful_val.jsonl")
    print(f"NESTFUL rows: {n_train} train, {n_val} val")
    wheel = Path(run("data", "wheel", "bfcl-eval").strip().splitlines()[-1])

    def convert(categories: Sequence[str], out: Path) -> None:
        files = [str(next(wheel.rglob(f"data/BFCL_v4_{c}.json"))) for c in categories]
        if bfcl_limit:  # the first N of each category: one conversion per file
            parts = []
            for f in files:
                part = DATA / f"bfcl_{Path(f).stem}.jsonl"
                run("data", "convert", "--from", "bfcl", f, "--limit", str(bfcl_limit),
                    "--out", str(part))
                parts.append(part.read_text())
            out.write_text("".join(parts))
        else:
            run("data", "convert", "--from", "bfcl", *files, "--out", str(out))

    bfcl = DATA / "bfcl.jsonl"
    convert(NON_LIVE, bfcl)
    live, relevance = DATA / "bfcl_live.jsonl", DATA / "bfcl_live_relevance.jsonl"
    convert(LIVE, live)
    convert(("live_relevance",), relevance)
    from toolrl.core.bfcl_scores import MULTI_TURN

    convert(MULTI_TURN, DATA / "bfcl_multi_turn.jsonl")
    held, rest = hold_out_live(live, DATA / "bfcl_live_held_out.jsonl",
                               DATA / "bfcl_live_rest.jsonl")
    evaluation = DATA / "bfcl_eval.jsonl"
    evaluation.write_text(bfcl.read_text() + (DATA / "bfcl_live_held_out.jsonl").read_text()
                          + relevance.read_text())
    print(f"evaluation rows ({_rel(evaluation)}): non-live {_rows(bfcl)}, live held out {held} "
          f"(1 in {LIVE_EVAL} a category) and live_relevance {_rows(relevance)}")
    run("data", "contamination", str(DATA / "nestful.jsonl"), "--eval", str(evaluation))
    counts = cap_per_category(DATA / "bfcl_live_rest.jsonl", DATA / "bfcl_live_capped.jsonl",
                              LIVE_CAP)
    print(f"BFCL live rows for training ({rest} not held out, at most {LIVE_CAP} a category): "
          f"{counts}")
    run("data", "contamination", str(DATA / "bfcl_live_capped.jsonl"), "--eval",
        str(evaluation), "--out", str(DATA / "bfcl_live_clean.jsonl"))
    print(f"clean live rows: {split_live(DATA / 'bfcl_live_clean.jsonl')} "
          f"(sft_* also hold NESTFUL's train and val rows)")
    from toolrl.data.loader import load_rows

    rl = load_rows(DATA / "rl_train.jsonl")
    pairs = combine_calls(rl, COMBINED)
    _write_rows(DATA / "rl_combined.jsonl", rl + pairs)
    print(f"rl_combined.jsonl: RL's {len(rl)} rows and {len(pairs)} two-call rows made of them")
    unfit = mismatch_tools(rl, MISMATCHED)
    _write_rows(DATA / "rl_unfit.jsonl", rl + pairs + unfit)
    print(f"rl_unfit.jsonl: rl_combined.jsonl's rows and {len(unfit)} no-call rows whose tools "
          f"do not fit the question")
    # what the warm start and RL train on, in one file: the multi-turn evaluation's config
    # trains on other rows, and BFCL's figures leave out what the checkpoint trained on
    (DATA / "trained_on.jsonl").write_text((DATA / "sft_train.jsonl").read_text()
                                           + (DATA / "rl_unfit.jsonl").read_text())


# The evaluation's context: SmolLM2's whole window, so every BFCL row is played as BFCL plays
# it. Training's 1,536-token prompt budget would leave out 72 of the 1,974 rows (57 of them
# live_multiple's, whose tool lists run to 6,254 tokens), and a score over the rows that fit
# is not BFCL's.
WINDOW = ("rollout.engine.max_model_len=8192", "rollout.max_total_tokens=8192")
EVAL_CONTEXT = (*WINDOW, "rollout.max_prompt_tokens=8032")


def eval_dtype(run_dir: Path, asked: str = "auto") -> str:
    """The engine dtype of every evaluation in ``run_dir``: the one pinned there
    (``EVAL_DTYPE``), else pinned now: float32 where evaluations began before pins existed,
    ``asked`` where it names a dtype, else (``auto``) the machine's choice (`choose_eval_dtype`).
    Stops, saying why, when ``asked`` names another dtype than the folder's evaluations ran in."""
    pin = run_dir / EVAL_DTYPE
    if asked not in EVAL_DTYPES:
        sys.exit(f"real_fc: --eval-dtype must be one of {', '.join(EVAL_DTYPES)}, got {asked!r}")
    if pin.exists():
        pinned = json.loads(pin.read_text())
    elif evaluated(run_dir):
        pinned = {"dtype": "float32", "reason": "its evaluations began before the recipe "
                  "pinned a dtype, in the engine's CPU default"}
    elif asked != "auto":
        pinned = {"dtype": asked, "reason": "--eval-dtype"}
    else:
        pinned = choose_eval_dtype(run_dir / "machine.json")
    if asked not in ("auto", pinned["dtype"]):
        sys.exit(f"real_fc: the evaluations in {_rel(run_dir)} run in {pinned['dtype']} "
                 f"({pinned['reason']}): --eval-dtype {asked} would mix dtypes in one table; "
                 f"use another --out")
    if not pin.exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        pin.write_text(json.dumps(pinned, indent=2) + "\n")
        print(f"evaluations in {_rel(run_dir)}: the engine in {pinned['dtype']} "
              f"({pinned['reason']})", flush=True)
    return pinned["dtype"]


def evaluated(run_dir: Path) -> bool:
    """Whether an evaluation of ``run_dir`` has begun (its folder exists, linked or not)."""
    names = [name for _, name in CHECKPOINTS] + list(MULTI_TURN_EVALS.values())
    return any((run_dir / name).exists() or (run_dir / name).is_symlink() for name in names)


def choose_eval_dtype(machine: Path) -> dict[str, str]:
    """``auto``: bfloat16 where ``machine``'s (``machine.json``) bare bf16 matmul rate is at
    least ``EVAL_BF16_MARGIN`` times its float32 one, with the reason; float32 without it."""
    if not machine.exists():
        return {"dtype": "float32", "reason": "no machine.json: the bare matmul rates were not "
                "measured"}
    rates = json.loads(machine.read_text()).get("matmul_flop_per_s", {})
    fp32, bf16 = rates.get("float32"), rates.get("bfloat16")
    if not fp32 or not bf16:
        return {"dtype": "float32", "reason": "machine.json has no float32 and bfloat16 rates"}
    ratio = bf16 / fp32
    dtype = "bfloat16" if ratio >= EVAL_BF16_MARGIN else "float32"
    return {"dtype": dtype, "reason": f"the bare bf16 matmul ran {ratio:.2f}x the float32 one "
            f"on this machine ({bf16 / 1e9:.0f} against {fp32 / 1e9:.0f} GFLOP/s), "
            f"{'at least' if dtype == 'bfloat16' else 'under'} the {EVAL_BF16_MARGIN:g}x asked"}


def evaluate(model: Path, out: Path, overrides: list[str], dtype: str = "auto") -> None:
    if (out / "results.json").exists():
        print(f"{out}/results.json exists: skipped")
        return
    # the engine on every core: the config's rollout.engine.cpu_threads is "all"
    run("eval", "--config", str(CONFIG), "--model", str(model), "--output-dir", str(out),
        f"data.val_file={DATA / 'bfcl_eval.jsonl'}", *EVAL_CONTEXT, *overrides,
        f"rollout.engine.dtype={eval_dtype(out.parent, dtype)}")


# The multi-turn evaluation's context: SmolLM2's whole window. The first prompt (the tools of
# 2-3 classes and the first user turn) runs to ~5.4k tokens outside long_context, whose
# entries need up to 71k (benchmarks/results/bfcl_multi_turn.md): those that do not fit are
# failures, as BFCL counts an entry the model could not take
MULTI_TURN_CONTEXT = (*WINDOW, "rollout.max_prompt_tokens=6144", "rollout.engine.cpu_threads=all",
                      "rollout.engine.kv_cache_gib=2.0")


def evaluate_multi_turn(model: Path, out: Path, seed: int, dtype: str = "auto") -> None:
    """``model`` on BFCL's four scored multi-turn categories through toolrl/BFCLMultiTurn-v0
    (configs/bfcl_multi_turn.yaml's rollout: 16 assistant messages of <= 192 tokens at most);
    BFCL's figures leave out rows sharing text with what the recipe trained on
    (``trained_on.jsonl``)."""
    if (out / "results.json").exists():
        print(f"{out}/results.json exists: skipped")
        return
    run("eval", "--config", str(MULTI_TURN_CONFIG), "--model", str(model), "--output-dir",
        str(out), f"data.val_file={DATA / 'bfcl_multi_turn.jsonl'}",
        f"data.train_file={DATA / 'trained_on.jsonl'}", *MULTI_TURN_CONTEXT, f"seed={seed}",
        f"rollout.engine.dtype={eval_dtype(out.parent, dtype)}")


def rl_seconds(out: Path) -> float:
    """The RL steps' summed wall time (``timing/step_s`` of the run's metrics; the workers'
    and the engine's start-up not counted)."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return sum(json.loads(line).get("timing/step_s", 0.0) for line in lines if line.strip())


def control_steps(seconds: float, warm_start_metrics: Path, default: int) -> int:
    """The SFT control's steps: as many as the warm start's pace (its wall time per step,
    held-out checks included) fits in ``seconds``, so that the control's cosine schedule ends
    when its time does and neither a step cap nor an undecayed schedule cuts it short;
    ``default`` when the warm start recorded no pace."""
    if not warm_start_metrics.exists():
        return default
    m = json.loads(warm_start_metrics.read_text())
    if not m.get("warm_start/seconds") or not m.get("warm_start/steps"):
        return default
    return max(1, math.ceil(seconds / (m["warm_start/seconds"] / m["warm_start/steps"])))


def sft_more(out: Path, overrides: list[str]) -> None:
    """What RL is set beside: the warm start trained on, instead, the gold calls of RL's own
    rows (``data.train_file``) for as long as the RL steps took (`control_steps` sizes its
    schedule to that time); the warm start's settings, held-out rows and early stopping."""
    dest = out / "sft_more"
    if (dest / "config.json").exists():
        print(f"{dest} exists: skipped")
        return
    from toolrl.trainer.config import load_config
    from toolrl.trainer.warm_start import sft, warm_start_transcripts

    train_file = load_config(CONFIG, overrides).data.train_file
    cfg = load_config(CONFIG, [*overrides, f"warm_start.train_file={train_file}"])
    ws, start = cfg.warm_start, out / "warm_start"
    transcripts, held_out = warm_start_transcripts(cfg, str(start))
    seconds = rl_seconds(out)
    steps = control_steps(seconds, start / "warm_start_metrics.json", ws.steps)
    print(f"more SFT from {start} on {train_file}'s gold calls for {seconds:.0f} s (its schedule "
          f"spans {steps} steps, what the warm start's pace fits in that time)", flush=True)
    metrics = sft(start, transcripts, dest, steps=steps, lr=ws.lr,
                  batch_size=ws.batch_size, seed=cfg.seed, stop_loss=ws.stop_loss,
                  val_transcripts=held_out, eval_every=ws.eval_every if held_out else 0,
                  patience=ws.patience, seconds=seconds, save_every=ws.save_every,
                  compute_dtype=cfg.actor.param_dtype or "float32")  # as the warm start
    (dest / "warm_start_metrics.json").write_text(json.dumps(
        {"base_model": str(start), "rl_seconds": seconds, **metrics}, indent=2))


def machine_phase(out: Path) -> None:
    """The machine's identity and its bare matmul rate in float32 and bfloat16
    (`toolrl.machine.matmul_rate`), measured before the other phases start, so alone on the
    machine: the denominators of the report's compute account (``machine.json``)."""
    from toolrl.machine import matmul_rate, this_machine

    machine = this_machine()
    rates = {dtype: matmul_rate(dtype) for dtype in ("float32", "bfloat16")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "machine.json").write_text(json.dumps(
        {"machine": machine.to_dict(), "label": machine.label(), "matmul_flop_per_s": rates},
        indent=2))
    print(f"{machine.label()}: bare 2048^3 matmul " + ", ".join(
        f"{rate / 1e9:.0f} GFLOP/s in {dtype}" for dtype, rate in rates.items()), flush=True)


class Account(NamedTuple):
    """One phase's compute: tokens it processed, FLOP per token, seconds, and the dtype its
    matmuls ran in."""

    phase: str
    tokens: float
    flop: float
    seconds: float
    dtype: str


def compute_account(out: Path) -> list[Account]:
    """Each phase's compute from what its command recorded: the warm start's and the SFT
    control's ``warm_start_metrics.json`` (training steps only, held-out checks excluded), the
    RL run's ``perf/*`` metrics summed over its steps (update, log-prob passes, rollout) and
    each evaluation's ``results.json`` ``perf``. Training computes in what it recorded
    (``warm_start/compute_dtype``, the RL run's ``compute_dtype.json``: ``actor.param_dtype``,
    or what ``auto`` timed faster); the RL rollout's engine in ``rollout.engine.dtype``, each
    evaluation's in what its ``results.json`` says (float32 before it said)."""
    rows: list[Account] = []
    engine_dtype = "float32"
    if (out / "config.yaml").exists():
        import yaml

        engine = yaml.safe_load((out / "config.yaml").read_text())["rollout"]["engine"]
        engine_dtype = "bfloat16" if engine.get("dtype") == "bfloat16" else "float32"
    for name, label in (("warm_start", "warm start"), ("sft_more", "SFT control")):
        path = out / name / "warm_start_metrics.json"
        m = json.loads(path.read_text()) if path.exists() else {}
        if m.get("warm_start/train_s"):
            rows.append(Account(label, m["warm_start/tokens"], m["warm_start/flop_per_token"]
                                * m["warm_start/tokens"], m["warm_start/train_s"],
                                m.get("warm_start/compute_dtype", "float32")))
    from toolrl.workers.compute_dtype import COMPUTE_DTYPE_FILE

    actor_dtype = "float32"
    if (out / COMPUTE_DTYPE_FILE).exists():
        actor_dtype = json.loads((out / COMPUTE_DTYPE_FILE).read_text())["dtype"]
    if (out / "metrics.jsonl").exists():
        steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                 if line.strip()]
        for key, timing, label, dtype in (
                ("update", "update", "RL update", actor_dtype),
                ("log_prob", "log_probs", "RL log-prob passes", actor_dtype),
                ("rollout", "rollout", "RL rollout", engine_dtype)):
            done = [r for r in steps if f"perf/{key}_flop_per_s" in r]
            if done:
                seconds = sum(r[f"timing/{timing}_s"] for r in done)
                rows.append(Account(label, sum(r[f"perf/{key}_tokens"] for r in done),
                                    sum(r[f"perf/{key}_flop_per_s"] * r[f"timing/{timing}_s"]
                                        for r in done), seconds, dtype))
    evals = [(f"eval ({label})", name) for label, name in CHECKPOINTS]
    evals += [(f"eval multi-turn ({label})", name) for label, name in MULTI_TURN_EVALS.items()]
    for label, name in evals:
        path = out / name / "results.json"
        perf = json.loads(path.read_text()).get("perf", {}) if path.exists() else {}
        if perf.get("flop_per_s"):
            rows.append(Account(label, perf["tokens"],
                                perf["flop_per_s"] * perf["seconds"], perf["seconds"],
                                json.loads(path.read_text()).get("engine_dtype", "float32")))
    return rows


def account_table(rows: Sequence[Account], rates: Mapping[str, float]) -> list[str]:
    """The markdown lines of the compute account: per phase its tokens, FLOP per token,
    seconds, achieved GFLOP/s and the share of the bare matmul rate in its dtype."""
    lines = ["| phase | tokens | GFLOP per token | seconds | achieved GFLOP/s | dtype | "
             "share of the bare matmul rate |", "|---|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        achieved = r.flop / r.seconds
        rate = rates.get(r.dtype)
        share = f"{achieved / rate:.2f}" if rate else "not measured"
        lines.append(f"| {r.phase} | {r.tokens:,.0f} | {r.flop / max(r.tokens, 1) / 1e9:.3f} | "
                     f"{r.seconds:.0f} | {achieved / 1e9:.1f} | {r.dtype} | {share} |")
    return lines


def report(out: Path, times: dict[str, str]) -> str:
    """The markdown table (per category and BFCL's non-live average) and ``bfcl.png`` of this
    run's checkpoints (``report.md`` beside them), with ``times`` (phase -> its wall time, as
    `PhaseRecord.times` says it)."""
    results: dict[str, Any] = {}
    for label, name in CHECKPOINTS:
        board = checkpoint_board(out, (name, MULTI_TURN_EVALS.get(label)))
        if board is not None:
            results[label] = board
    machine = json.loads((out / "machine.json").read_text()) \
        if (out / "machine.json").exists() else {}
    head = [f"Machine: {machine['label']}."] if machine.get("label") else []
    if head and (out / EVAL_DTYPE).exists():
        pinned = json.loads((out / EVAL_DTYPE).read_text())
        head.append(f"Evaluations: the engine in {pinned['dtype']} ({pinned['reason']}).")
    text = "\n".join([*head, *warm_start_lines(out), ""]) + "\n" if head else ""
    text += render(results, times, out / "bfcl.png")
    rows = compute_account(out)
    if rows:
        rates = machine.get("matmul_flop_per_s", {})
        text += "\n".join([
            "", "Where the compute went (`compute_account`): tokens each phase processed, "
            "FLOP per token by Kaplan et al.'s count (6 N and attention for training, 2 N for "
            "the forward-only passes; rollout and evaluation count every token once, so they "
            "are lower bounds), the achieved rate, and its share of the machine's bare "
            "2048^3 matmul rate in the same dtype, measured alone before the phases ran"
            + (f" ({machine['label']}: " + ", ".join(
                f"{v / 1e9:.0f} GFLOP/s {k}" for k, v in rates.items()) + ")"
               if machine else " (not measured in this run: no machine.json)") + ".", "",
            *account_table(rows, rates), ""])
    (out / "report.md").write_text(text)
    return text


def checkpoint_board(out: Path, names: Sequence[str | None]) -> dict[str, Any] | None:
    """One checkpoint's BFCL board over every evaluation of it in ``out`` (``names``: its
    single-turn and its multi-turn one), BFCL's summaries computed over them all; None when
    none has run. With the single-turn evaluation alone it is that evaluation's own board."""
    found = [json.loads((out / n / "results.json").read_text())["bfcl"] for n in names
             if n is not None and (out / n / "results.json").exists()]
    if len(found) <= 1:
        return found[0] if found else None
    return board_of_counts({c: [v["correct"], v["n"]] for board in found
                            for c, v in board["per_category"].items()})


def warm_start_lines(out: Path) -> list[str]:
    """What RL and the SFT control start from, and where the control ended: each one's best
    held-out loss (the gold calls of ``warm_start.val_file``, in float32) with its step, the
    steps it ran and why it stopped, and the dtype it trained in."""
    lines = []
    for name, label in (("warm_start", "Warm start"), ("sft_more", "SFT control")):
        path = out / name / "warm_start_metrics.json"
        if not path.exists():
            continue
        m = json.loads(path.read_text())
        if m.get("warm_start/val_loss_best") is None:
            continue
        lines.append(f"{label}: held-out loss {m['warm_start/val_loss_best']:.4f} (best, at step "
                     f"{m['warm_start/best_step']} of {m['warm_start/steps']:.0f}; stopped: "
                     f"{m['warm_start/stopped']}; trained in "
                     f"{m.get('warm_start/compute_dtype', 'float32')}).")
    return lines


def board_of_counts(counts: dict[str, list[int]]) -> dict[str, Any]:
    """A ``results.json``-shaped BFCL board from ``{category: [correct, total]}``."""
    from toolrl.core.bfcl_scores import leaderboard

    return {"per_category": {c: {"accuracy": k / n, "correct": k, "total": n}
                             for c, (k, n) in counts.items()},
            **leaderboard(counts)}


def recorded(path: Path, markdown: Path, png: Path) -> str:
    """The table and plot of scores recorded in ``path`` (a JSON file: ``checkpoints``, each a
    ``label`` and its ``counts`` {category: [correct, total]}; ``times`` {phase: text}; ``notes``
    lines), for results kept in the repository when their run folders are long gone."""
    data = json.loads(path.read_text())
    results = {c["label"]: board_of_counts(c["counts"]) for c in data["checkpoints"]}
    text = render(results, data.get("times", {}), png, title=data.get("title"))
    def rel(p: Path) -> Path:
        return p.relative_to(ROOT) if p.is_relative_to(ROOT) else p

    lines = [f"# {data['title']}", "", *data.get("notes", []), "", text,
             f"Rendered by `recipes/real_fc.py --recorded {rel(path)}` "
             f"(the plot: `{rel(png)}`)."]
    markdown.write_text("\n".join(lines) + "\n")
    return text


def render(results: dict[str, Any], times: dict[str, str], png: Path,
           title: str | None = None) -> str:
    """The markdown table of ``{label: BFCL board}`` (per category, the mean of the five and
    BFCL's Non-Live Overall) and the times, and the bar plot to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from toolrl.core.bfcl_scores import LIVE_AST_SIZES, MULTI_TURN

    summaries = (("non_live", "Non-Live Overall Acc"), ("live", "Live Overall Acc"),
                 ("multi_turn", "Multi Turn Overall Acc"), ("overall", "Overall Acc"))
    whole = {"live": set(LIVE_AST_SIZES), "multi_turn": set(MULTI_TURN)}  # none run: not run
    columns = [*CATEGORIES, "mean of the five", *NON_LIVE[len(CATEGORIES):],
               *(name for _, name in summaries)]
    lines = ["| checkpoint | " + " | ".join(columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for label, board in results.items():
        accs = [board["per_category"][c]["accuracy"] if c in board["per_category"] else None
                for c in CATEGORIES]
        cells = [f"{100 * a:.1f}" if a is not None else "-" for a in accs]
        known = [a for a in accs if a is not None]
        cells.append(f"{100 * sum(known) / len(known):.1f}" if known else "-")
        cells += [f"{100 * board['per_category'][c]['accuracy']:.1f}"
                  if c in board["per_category"] else "not run" for c in NON_LIVE[len(CATEGORIES):]]
        missing = set(board.get("missing", ()))
        for key, name in summaries:
            value = board.get(key, {}).get(name, "-")
            if key in whole and missing >= whole[key]:
                value = "not run"  # BFCL's 0, which reads as a score
            cells.append(f"{100 * value:.1f}" if isinstance(value, float) else str(value))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "The summaries are BFCL's own (`toolrl.core.bfcl_scores.leaderboard`): "
              "Non-Live Overall Acc the mean of its four AST summaries, where Simple AST "
              "averages Python, Java and JavaScript, irrelevance not part of it; Live Overall "
              "Acc over the live rows held out from training, weighted by entries; Multi Turn "
              "Overall Acc the mean of BFCL's four multi-turn categories; Overall Acc "
              "BFCL's formula. As in BFCL, these overall columns count a category that was not "
              "run (multi-turn, agentic) as 0; a checkpoint evaluated on no live (multi-turn) "
              "row reads 'not run' under Live (Multi Turn). The mean of the five is the plain "
              "mean of the five Python categories in the table."]
    not_run: dict[tuple[str, ...], list[str]] = {}  # categories not run -> the checkpoints
    for label, board in results.items():
        cats = tuple(sorted(c for c in board.get("missing", ()) if c in (
            *NON_LIVE, *LIVE_AST_SIZES, "live_irrelevance", "live_relevance", *MULTI_TURN)))
        if cats:
            not_run.setdefault(cats, []).append(label)
    for cats, labels in not_run.items():
        which = "" if len(labels) == len(results) else f" for {'; '.join(labels)}"
        lines += ["", f"Not run here{which} (BFCL counts them 0): {', '.join(cats)}."]
    if times:
        lines += ["", "| phase | wall time |", "|---|---|"]
        lines += [f"| {phase} | {when} |" for phase, when in times.items()]
    text = "\n".join(lines) + "\n"
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(len(results), 1)
    for k, (label, board) in enumerate(results.items()):
        values = [100 * board["per_category"].get(c, {}).get("accuracy", 0.0)
                  for c in CATEGORIES]
        ax.bar([i + k * width for i in range(len(CATEGORIES))], values, width, label=label)
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(CATEGORIES))],
                  CATEGORIES)
    ax.set_ylabel("BFCL accuracy (%)")
    ax.set_title(textwrap.fill(title or "SmolLM2-135M-Instruct on BFCL v4 non-live", 90))
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["data"], default=None, help="stop after a phase")
    parser.add_argument("--bfcl-limit", type=int, default=None,
                        help="the first N questions of each BFCL category")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-comparison", action="store_true",
                        help="also train the warm start on RL's rows' gold calls for the RL "
                             "steps' wall time, and evaluate it")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "real_fc")
    parser.add_argument("--multi-turn", action="store_true",
                        help="also evaluate the warm start and the RL checkpoint on BFCL's four "
                             "scored multi-turn categories (800 entries; hours on 2 cores)")
    parser.add_argument("--warm-start-from", type=Path, default=None, metavar="OUT",
                        help="seeds of RL from one warm start: use the warm start of the run "
                             "in OUT (an earlier --out), and its base and warm-start "
                             "evaluations, instead of training and evaluating them again")
    parser.add_argument("--eval-dtype", choices=EVAL_DTYPES, default="auto",
                        help="the evaluations' engine dtype (auto: bfloat16 where this "
                             "machine's bare bf16 matmul is >= 1.1x its float32 one); one per "
                             "--out, pinned by its first evaluation")
    parser.add_argument("--recorded", type=Path, default=None,
                        help="only render the scores recorded in this JSON file (e.g. "
                             "benchmarks/results/real_fc.json) into its .md and a plot in "
                             "docs/")
    parser.add_argument("overrides", nargs="*", help="key=value for train and eval")
    args = parser.parse_args(argv)
    if args.recorded:
        source = args.recorded.resolve()
        print(recorded(source, source.with_suffix(".md"),
                       ROOT / "docs" / f"{source.stem}_bfcl.png"))
        return 0
    out = args.out.resolve()
    overrides = [f"seed={args.seed}", f"trainer.output_dir={out}",
                 f"warm_start.output={out / 'warm_start'}", *args.overrides]
    data = Phase("data", data_phase, (args.bfcl_limit,), None, None, lambda: (
        f"the model, NESTFUL's and BFCL's rows and the contamination check into {_rel(DATA)} "
        f"(redone every run: every --out shares them)"))
    if args.only == "data":
        PhaseRecord(None, {}).run(data)
        return 0
    phases = [data, *recipe_phases(out, overrides, args.multi_turn, args.seed,
                                   args.eval_dtype)]
    shared = args.warm_start_from.resolve() if args.warm_start_from else None
    if shared == out:
        sys.exit("real_fc: --warm-start-from names this run's own --out")
    record = PhaseRecord(out / PHASES, {"seed": args.seed, "bfcl_limit": args.bfcl_limit,
                                        "overrides": list(args.overrides),
                                        "warm_start_from": str(shared) if shared else None})
    record.refuse_mismatches(phases)
    out.mkdir(parents=True, exist_ok=True)
    if shared is not None:
        share_warm_start(out, shared, record)
    if (out / EVAL_DTYPE).exists() or evaluated(out):  # a clash stops here, not after training
        eval_dtype(out, args.eval_dtype)
    for phase in phases:
        if args.sft_comparison or phase.name not in ("sft_more", "eval_sft_more"):
            record.run(phase)
    print("\n" + report(out, record.times))
    print(f"report: {out / 'report.md'}, plot: {out / 'bfcl.png'}")
    return 0


def recipe_phases(out: Path, overrides: list[str], multi_turn: bool = False, seed: int = 0,
                  dtype: str = "auto") -> list[Phase]:
    """The phases after ``data``, in order (``eval_base``, then with ``multi_turn`` the
    multi-turn evaluations, last); the evaluations' engine in ``dtype`` (`eval_dtype`)."""
    def evaluation(name: str, model: Path) -> Phase:
        def what() -> str:
            return (f"toolrl eval of {_rel(model)} on {_rows(DATA / 'bfcl_eval.jsonl')} BFCL rows "
                    f"into {_rel(out / name)}")

        return Phase(name, evaluate, (model, out / name, overrides, dtype),
                     out / name / "results.json",
                     out / name, what)

    def multi_turn_evaluation(name: str, model: Path) -> Phase:
        def what() -> str:
            return (f"toolrl eval of {_rel(model)} on BFCL's "
                    f"{_rows(DATA / 'bfcl_multi_turn.jsonl')} multi-turn entries into "
                    f"{_rel(out / name)} (hours on 2 cores)")

        return Phase(name, evaluate_multi_turn, (model, out / name, seed, dtype),
                     out / name / "results.json", out / name, what)

    def training() -> str:
        warm = (f"reuses the warm start in {_rel(out / 'warm_start')}"
                if (out / "warm_start" / "config.json").exists() else
                f"the warm start (SFT, at most {config_value('warm_start.steps', overrides)} "
                f"steps) into {_rel(out / 'warm_start')}")
        return (f"toolrl train: {warm}, then {steps} GRPO steps into {_rel(out)}; a cut-off run "
                f"goes on from its last snapshot or checkpoint")

    steps = config_value("trainer.total_steps", overrides)
    return [Phase("machine", machine_phase, (out,), None, None, lambda: (
                "the machine's identity and bare matmul rate (float32, bfloat16), measured "
                "before the other phases, alone (redone every run: a resumed run may be on "
                "another machine)")),
            Phase("train", run, ("train", "--config", str(CONFIG), *overrides),
                  out / "final_hf" / "config.json", out, training,
                  grpo_steps=steps if isinstance(steps, int) else None),
            evaluation("eval_warm_start", out / "warm_start"),
            evaluation("eval_rl", out / "final_hf"),
            Phase("sft_more", sft_more, (out, overrides), out / "sft_more" / "config.json",
                  out / "sft_more", lambda: (
                      f"the warm start trained on RL's rows' gold calls for the RL steps' wall "
                      f"time into {_rel(out / 'sft_more')}")),
            evaluation("eval_sft_more", out / "sft_more"),
            # last: what RL is measured against comes first, and the imported model, which
            # calls nothing and runs every answer to its token cap, is the slowest to evaluate
            evaluation("eval_base", MODEL),
            *([multi_turn_evaluation(name, model) for name, model in (
                (MULTI_TURN_EVALS["warm start"], out / "warm_start"),
                (MULTI_TURN_EVALS["RL"], out / "final_hf"))] if multi_turn else [])]


if __name__ == "__main__":
    stop_on_sigterm()
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # said by PhaseRecord.run
        sys.exit(130)
    except Terminated:
        sys.exit(143)
