"""Which machine a number came from (issue 49).

`lscpu`'s model name is not enough: "AMD EPYC" has named both an AVX2 Zen and a Zen 5 with
AVX-512 here, whose deterministic runs and timings differ. A `Machine` records the CPU's
vendor, family and model, the ISA flags that change torch's and vLLM's kernels, the cores,
torch's thread count and the load average when the measurement started. Every benchmark report,
results file and `toolrl eval` result writes it through `this_machine`.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The flags that select different CPU kernels (oneDNN, vLLM's CPU attention, torch's GEMMs).
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx")


@dataclass(frozen=True)
class Machine:
    vendor: str  # e.g. GenuineIntel, AuthenticAMD
    family: int | None
    model: int | None
    model_name: str  # lscpu's model name ("AMD EPYC"): not an identity by itself
    flags: dict[str, bool] = field(default_factory=dict)  # KERNEL_FLAGS present or not
    cores: int = 0
    torch_threads: int | None = None
    load_at_start: float | None = None  # 1-minute load average when the measurement began
    system: str = ""

    @property
    def cpu(self) -> str:
        """``vendor family F model M [avx2 avx512f ...; no amx]``: what identifies the CPU."""
        have = [f for f, on in self.flags.items() if on]
        lack = [f for f, on in self.flags.items() if not on]
        isa = " ".join(have) + (f"; no {' '.join(lack)}" if lack else "")
        return f"{self.vendor} family {self.family} model {self.model} [{isa}]"

    def label(self) -> str:
        """One line for a report: the CPU identity, its name, cores, threads, load."""
        parts = [f"{self.cpu} ({self.model_name})", f"{self.cores} cores"]
        if self.torch_threads is not None:
            parts.append(f"torch threads {self.torch_threads}")
        parts.append(self.system)
        if self.load_at_start is not None:
            parts.append(f"load average at start {self.load_at_start:.1f}")
        return ", ".join(p for p in parts if p)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpu": self.cpu}


def _cpuinfo(text: str) -> dict[str, str]:
    """The first processor's ``key: value`` fields of /proc/cpuinfo."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


def parse_cpuinfo(text: str) -> tuple[str, int | None, int | None, str, dict[str, bool]]:
    """Vendor, family, model, model name and `KERNEL_FLAGS` from /proc/cpuinfo's text."""
    info = _cpuinfo(text)
    flags = set(info.get("flags", "").split())

    def number(key: str) -> int | None:
        with contextlib.suppress(ValueError):
            return int(info[key])
        return None

    present = {f: (any(x.startswith("amx") for x in flags) if f == "amx" else f in flags)
               for f in KERNEL_FLAGS}
    return (info.get("vendor_id", platform.machine()), number("cpu family"), number("model"),
            info.get("model name", platform.processor() or platform.machine()), present)


def this_machine(load_at_start: float | None = None, torch_threads: int | None = None
                 ) -> Machine:
    """This machine now. ``load_at_start``: the load average read when the measurement began
    (default: now); ``torch_threads``: default torch's current intra-op thread count."""
    try:
        vendor, family, model, name, flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        vendor, family, model, name, flags = platform.machine(), None, None, \
            platform.processor() or platform.machine(), {}
    if torch_threads is None:
        with contextlib.suppress(ImportError):  # lazy: torch is optional here (and heavy)
            import torch

            torch_threads = torch.get_num_threads()
    if load_at_start is None:
        with contextlib.suppress(OSError):
            load_at_start = os.getloadavg()[0]
    return Machine(vendor, family, model, name, flags, os.cpu_count() or 0, torch_threads,
                   load_at_start, f"{platform.system()} {platform.machine()}, Python "
                                  f"{platform.python_version()}")




def matmul_rate(dtype: str = "float32", n: int = 2048, seconds: float = 2.0) -> float:
    """The machine's bare matmul rate in FLOP/s: ``n x n`` by ``n x n`` GEMMs in ``dtype`` on
    torch's current threads, timed for about ``seconds`` after a warm-up. Measure it alone on
    the machine: load from other processes lowers it several times."""
    import torch  # lazy: this module describes the machine without loading torch

    kind = getattr(torch, dtype)
    a, b = torch.randn(n, n, dtype=kind), torch.randn(n, n, dtype=kind)
    torch.mm(a, b)  # warm-up: kernel selection, page faults
    reps, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and reps >= 3:
            return 2 * n**3 * reps / elapsed


def transformer_flops_per_token(params: int, layers: int, hidden: int, context: int,
                                training: bool) -> float:
    """FLOP per token of a decoder (Kaplan et al.'s count): ``2 N + 2 L C d`` forward (the
    weights, and attention over ``context`` positions), three times that with the backward."""
    forward = 2 * params + 2 * layers * context * hidden
    return 3 * forward if training else forward


__all__ = ["KERNEL_FLAGS", "Machine", "matmul_rate", "parse_cpuinfo", "this_machine",
           "transformer_flops_per_token"]
