"""Controller overhead: a worker-group call against the same work done with plain Ray actors.

Measures, on a local Ray cluster with 2 workers:
1. median wall time of a trivial call (ONE_TO_ALL, returns None), 200 calls;
2. median round trip of a 256 x 1024 int64 batch with 256 per-sample dicts (NonTensorStack)
   split over the 2 workers and collected back (DP_SPLIT);
3. how long after a worker is killed mid-call the pending call raises `WorkerDiedError`.
The peer for 1 and 2 is hand-written Ray (``actor.method.remote`` + ``ray.get``, manual split
and concat), so the ratio is the controller's own cost.

    .venv/bin/python benchmarks/bench_controller.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import benchlib
import ray
import torch
from tensordict import TensorDict

from toolrl.batch import concat, get_non_tensor, set_non_tensor, split
from toolrl.controller import (
    Dispatch,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    WorkerDiedError,
    init_ray,
    remote,
    shutdown_ray,
)

RESULTS = Path(__file__).resolve().parent / "results" / "controller.md"


class Bench(Worker):
    @remote()
    def noop(self) -> None:
        return None

    @remote(Dispatch.DP_SPLIT)
    def echo(self, batch: TensorDict) -> TensorDict:
        return batch

    @remote()
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@ray.remote
class PlainActor:
    def noop(self) -> None:
        return None

    def echo(self, batch: TensorDict) -> TensorDict:
        return batch


def make_batch(rows: int = 256, width: int = 1024) -> TensorDict:
    td = TensorDict({"input_ids": torch.randint(0, 32000, (rows, width), dtype=torch.int64)},
                    batch_size=[rows])
    set_non_tensor(td, "rows", [{"id": i, "messages": [{"role": "user", "content": f"task {i}"}],
                                 "tools": [{"name": "add", "parameters": {"a": "int"}}]}
                                for i in range(rows)])
    return td


def timed_pair(fa, fb, reps: int) -> tuple[list[float], list[float]]:
    """Time two functions alternately, so load from other processes hits both alike."""
    fa(), fb()  # warm-up
    out_a, out_b = [], []
    for _ in range(reps):
        for fn, out in ((fa, out_a), (fb, out_b)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return out_a, out_b


def death_latency(pool: RayResourcePool) -> float:
    group = RayWorkerGroup(pool, Bench, name="doomed")
    try:
        pending = group.call_async(Bench.sleep, 120.0)
        time.sleep(0.5)
        t = time.perf_counter()
        os.kill(group.pids[-1], signal.SIGKILL)
        try:
            pending.get(timeout=60)
        except WorkerDiedError:
            return time.perf_counter() - t
        raise RuntimeError("the killed worker went unnoticed")
    finally:
        group.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    calls, batch_reps = (50, 5) if args.quick else (200, 20)

    init_ray(num_cpus=4)
    pool = RayResourcePool([2], name="bench", cpus_per_process=0.5)
    group = RayWorkerGroup(pool, Bench, call_timeout_s=600)
    actors = [PlainActor.options(num_cpus=0.5).remote() for _ in range(2)]
    batch = make_batch()
    try:
        ctl_call, ray_call = timed_pair(
            lambda: group.call(Bench.noop),
            lambda: ray.get([a.noop.remote() for a in actors], timeout=60), calls)

        def ctl_roundtrip() -> TensorDict:
            return group.call(Bench.echo, batch)

        def ray_roundtrip() -> TensorDict:
            shards = split(batch, 2)
            return concat(ray.get([a.echo.remote(s) for a, s in zip(actors, shards, strict=True)],
                                  timeout=60))

        out = ctl_roundtrip()
        assert torch.equal(out["input_ids"], batch["input_ids"])
        assert get_non_tensor(out, "rows") == get_non_tensor(batch, "rows")
        ctl_batch, ray_batch = timed_pair(ctl_roundtrip, ray_roundtrip, batch_reps)
    finally:
        group.shutdown()
        for a in actors:
            ray.kill(a)
    dead = death_latency(pool)
    load = os.getloadavg()[0]
    pool.release()
    shutdown_ray()

    def ms(xs: list[float]) -> float:
        return statistics.median(xs) * 1e3

    quick = " --quick" if args.quick else ""
    mib = batch["input_ids"].numel() * 8 / 2**20
    rows = [
        (f"trivial call, 2 workers (median of {calls})", ms(ctl_call), ms(ray_call)),
        (f"{mib:.0f} MiB int64 [256x1024] + 256 dicts, DP_SPLIT to 2 and back "
         f"(median of {batch_reps})", ms(ctl_batch), ms(ray_batch)),
    ]
    machine = benchlib.machine_label(ray=ray.__version__, torch=torch.__version__)
    lines = [
        "# Controller overhead",
        "",
        f"Machine: {machine}. "
        f"Local Ray cluster (4 logical CPUs), 2 workers. Load average at the end: "
        f"{load:.1f} (both columns are timed alternately, so compare ratios).",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_controller.py{quick}`",
        "",
        "| measurement | RayWorkerGroup (ms) | plain Ray actors (ms) | ratio |",
        "|---|---:|---:|---:|",
        *[f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f}x |" for name, a, b in rows],
        "",
        f"A worker killed (SIGKILL) mid-call: the pending call raised `WorkerDiedError` "
        f"{dead * 1e3:.0f} ms after the kill.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
