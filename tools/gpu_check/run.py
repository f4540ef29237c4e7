"""The one-command GPU check: ``python tools/gpu_check/run.py --out DIR`` (or
``python -m tools.gpu_check --out DIR``) from the repository root.

On a CUDA machine with only torch, transformers and pytest (no vLLM, no Ray) it checks what
toolrl's GPU routes rest on and writes ``DIR/gpu_check.md`` (and ``DIR/gpu_check.json``):

- scoring: every layout of `toolrl.workers.scoring` (padded, packed, shared-prefix) against
  transformers' log-probs at the Qwen2.5-0.5B shape, fp32 and bf16, with their speed; packed
  on both attention routes (torch's varlen kernel in bf16, the block-diagonal mask);
- ipc: `IpcPush` with vLLM's packed CUDA IPC producer into a consumer process at the
  Qwen2.5-1.5B shape: checksums, bucket counts, no leak over 20 pushes, the hub-id case;
- memory: device memory after an actor update, with and without ``torch.cuda.empty_cache``;
- lora: a LoRA actor (PEFT under FSDP2, bf16): adapter off = base, merged export = actor,
  DCP resume = the uninterrupted step;
- pytest: collection of the whole tree and the GPU tests that need neither vLLM nor Ray.

Without CUDA (or with ``--dry``) the same code runs on the CPU at a tiny shape: a test in the
suite runs it, so the check cannot rot before a GPU is at hand.

toolrl's imports need a few small pure-Python packages the GPU box lacks (tensordict and its
pyvers and cloudpickle, lazy_loader; pytest-timeout for the suite's marks; peft and
accelerate for the LoRA check): ``python tools/gpu_check/run.py --stage`` copies them from
this environment into ``tools/gpu_check/_carry/site`` (ignored by git, ~12 MiB), which
travels with the tree; this script puts it on ``sys.path`` when it is there.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CARRY = HERE / "_carry" / "site"
# what toolrl's scoring / weight-transfer imports need beyond torch + transformers
# (pytest-timeout: the suite's timeout marks are errors under --strict-markers without it;
# peft and accelerate: the LoRA check)
CARRY_PACKAGES = ("tensordict", "pyvers", "cloudpickle", "lazy_loader", "pytest_timeout",
                  "peft", "accelerate")
BUDGET_S = 450.0  # the whole check stays under 8 minutes on one H100


def bootstrap() -> None:
    for path in (CARRY, ROOT):
        if path.is_dir() and str(path) not in sys.path:
            sys.path.insert(0, str(path))


def stage(packages: tuple[str, ...] = CARRY_PACKAGES, into: Path = CARRY) -> list[str]:
    """Copy ``packages`` (pure Python) and their dist-info (versions, pytest's plugin entry
    points) from this interpreter's environment into ``into``."""
    import importlib.metadata
    import importlib.util

    into.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise SystemExit(f"--stage: {name} is not installed here")
        source = Path(spec.origin).parent if spec.submodule_search_locations else \
            Path(spec.origin)
        if any(source.rglob("*.so")) if source.is_dir() else source.suffix == ".so":
            raise SystemExit(f"--stage: {name} has compiled parts; it cannot travel as is")
        target = into / source.name
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
        for dist_name in importlib.metadata.packages_distributions().get(name, []):
            info = Path(str(importlib.metadata.distribution(dist_name)._path))  # type: ignore[attr-defined]
            if info.is_dir():
                shutil.copytree(info, into / info.name, dirs_exist_ok=True)
        copied.append(name)
    return copied


def environment(device: object) -> list[str]:
    import torch
    import transformers

    lines = [f"python {platform.python_version()}, torch {torch.__version__}, transformers "
             f"{transformers.__version__}, CUDA {torch.version.cuda}"]
    if getattr(device, "type", "") == "cuda":
        props = torch.cuda.get_device_properties(device)
        lines.append(f"device: {props.name}, {props.total_memory / (1 << 30):.1f} GiB")
    else:
        lines.append("device: CPU (dry mode)")
    for name in ("vllm", "ray", "tensordict", "peft"):
        try:
            module = __import__(name)
            lines.append(f"{name} {getattr(module, '__version__', '?')} importable")
        except ImportError:
            lines.append(f"{name}: not installed")
    return lines


def render(sections: list, env: list[str], elapsed: float, dry: bool) -> str:
    from tools.gpu_check.checks import fmt

    failed = [f for s in sections for f in s.failures]
    out = ["# toolrl GPU check", "",
           f"{'DRY MODE (CPU, tiny shapes): ' if dry else ''}"
           f"{'all checks passed' if not failed else f'{len(failed)} failure(s)'}; "
           f"{elapsed:.0f} s. Written by `tools/gpu_check/run.py`.", ""]
    out += [f"- {line}" for line in env]
    for sec in sections:
        out += ["", f"## {sec.title}", ""]
        for header, rows in sec.tables:
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            out += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
            out.append("")
        out += [f"- {note}" for note in sec.notes]
        out += [f"- **FAIL**: {f}" for f in sec.failures]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    bootstrap()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for gpu_check.md / gpu_check.json")
    parser.add_argument("--dry", action="store_true",
                        help="CPU at tiny shapes (the default when CUDA is not available)")
    parser.add_argument("--only", default="", help="comma-separated checks (default: all)")
    parser.add_argument("--stage", action="store_true",
                        help=f"copy {', '.join(CARRY_PACKAGES)} into {CARRY.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.stage:
        copied = stage()
        size = sum(p.stat().st_size for p in CARRY.rglob("*") if p.is_file()) / (1 << 20)
        print(f"staged {', '.join(copied)} into {CARRY} ({size:.1f} MiB); carry "
              f"{CARRY.parent.relative_to(ROOT)}")
        return 0
    if args.out is None:
        parser.error("--out is required")

    import torch

    from tools.gpu_check.checks import CHECKS, Context, Section

    dry = args.dry or not torch.cuda.is_available()
    device = torch.device("cpu") if dry else torch.device("cuda", torch.cuda.current_device())
    start = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {message}", flush=True)

    ctx = Context(device=device, dry=dry, log=log)
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = set(names) - set(CHECKS)
    if unknown:
        parser.error(f"unknown checks {sorted(unknown)}; choose from {list(CHECKS)}")
    env = environment(device)
    for line in env:
        log(line)
    sections = []
    for name in names:
        if time.monotonic() - start > BUDGET_S:
            sections.append(Section(name, notes=[f"not run: the {BUDGET_S:.0f} s budget is "
                                                 f"spent"]))
            continue
        log(f"== {name}")
        try:
            sec = CHECKS[name](ctx)
        except ImportError as e:
            sec = Section(name, notes=[f"skipped: {e} (stage the carry: --stage)"])
            sec.failures.append(f"{name}: import failed: {e}")
        except Exception as e:
            sec = Section(name, failures=[f"{name} raised {type(e).__name__}: {e}"],
                          notes=["```", *traceback.format_exc().splitlines()[-15:], "```"])
        sections.append(sec)
        log(f"{name}: {'ok' if not sec.failures else 'FAIL: ' + '; '.join(sec.failures)}")
    elapsed = time.monotonic() - start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.md").write_text(render(sections, env, elapsed, dry))
    (args.out / "gpu_check.json").write_text(json.dumps(
        {"dry": dry, "elapsed_s": elapsed, "environment": env,
         "sections": [{"title": s.title, "failures": s.failures, "data": s.data,
                       "tables": s.tables, "notes": s.notes} for s in sections]},
        indent=1, default=str))
    failed = sum(len(s.failures) for s in sections)
    log(f"report: {args.out / 'gpu_check.md'} ({failed} failure(s))")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
