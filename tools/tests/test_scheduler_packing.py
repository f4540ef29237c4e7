"""The device scheduler end to end on CPU: a simulated inventory, real pytest subprocesses.

Generated test files record the devices they were given and when they ran, then sleep; the
assertions check the schedule itself (no device shared, freed devices refilled at once, wall
time near the optimal packing), the kill of a hung file with its children, and Ctrl+C.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from tools.gpu_scheduler import FileStatus, SchedulerOptions, collect, run_files
from tools.gpu_scheduler.environment import REPO_ROOT

pytestmark = pytest.mark.slow

RECORDING_FILE = '''
import json, os, subprocess, sys, time
{marker}

def test_work():
    record = {{"name": {name!r}, "pid": os.getpid(), "start": time.time(),
              "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "tmpdir": os.environ.get("TMPDIR"),
              "ray_tmpdir": os.environ.get("RAY_TMPDIR"),
              "has_ray_address": "RAY_ADDRESS" in os.environ, "children": []}}
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    for kind in {children!r}:
        # "group": an ordinary child; "session": one that escapes the process group
        child = subprocess.Popen(sleeper, start_new_session=(kind == "session"))
        record["children"].append(child.pid)
    started = os.path.join({record_dir!r}, {name!r} + ".started")
    with open(started + ".tmp", "w") as f:  # whole or absent: the test polls for it
        json.dump(record, f)
    os.replace(started + ".tmp", started)
    time.sleep({sleep})
    record["end"] = time.time()
    with open(os.path.join({record_dir!r}, {name!r} + ".json"), "w") as f:
        json.dump(record, f)
'''


def write_test_file(folder: Path, name: str, devices: int, sleep: float, record_dir: Path,
                    children: tuple[str, ...] = (), style: str = "marker") -> Path:
    marker = (f"import pytest\npytestmark = pytest.mark.devices({devices})" if style == "marker"
              else f"DEVICES = {devices}")
    path = folder / f"test_{name}.py"
    path.write_text(RECORDING_FILE.format(marker=marker, name=name, sleep=sleep,
                                          record_dir=str(record_dir), children=children))
    return path


def load_records(record_dir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in record_dir.glob("*.json")}


def gone(pid: int) -> bool:
    """Dead or a zombie (an orphan the init process has not reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def optimal_makespan(jobs: list[tuple[int, float]], devices: int) -> float:
    """Shortest schedule of rigid jobs (need, duration) on ``devices`` interchangeable devices.

    The serial schedule-generation scheme (each job, in list order, at its earliest feasible
    start) produces every active schedule, and some active schedule is optimal, so the minimum
    over all orders is the optimum.
    """
    best = float("inf")
    for order in itertools.permutations(jobs):
        placed: list[tuple[float, float, int]] = []
        for need, dur in order:
            for t in sorted({0.0, *(end for _, end, _ in placed)}):
                points = [t] + [s for s, _, _ in placed if t < s < t + dur]
                if all(need + sum(n for s, e, n in placed if s <= p < e) <= devices
                       for p in points):
                    placed.append((t, t + dur, need))
                    break
        best = min(best, max(e for _, e, _ in placed))
    return best


def assert_no_device_shared(intervals: list[tuple[str, float, float, tuple[str, ...]]]) -> None:
    for (a, s1, e1, d1), (b, s2, e2, d2) in itertools.combinations(intervals, 2):
        if set(d1) & set(d2):
            assert e1 <= s2 or e2 <= s1, f"{a} and {b} held device(s) {set(d1) & set(d2)} at once"


def test_packing_fills_freed_devices_at_once(tmp_path, monkeypatch):
    folder, records = tmp_path / "suite", tmp_path / "records"
    folder.mkdir()
    records.mkdir()
    # Optimal: full alone, then `long` on two devices while the four singles run two by two
    # beside it. A scheduler that waits for a whole "wave" loses a single's duration.
    spec = {"full": (4, 1.0), "long": (2, 5.0), "one_a": (1, 1.0), "one_b": (1, 1.0),
            "one_c": (1, 1.0), "one_d": (1, 1.0)}
    for name, (need, sleep) in spec.items():
        write_test_file(folder, name, need, sleep, records,
                        style="constant" if name == "one_b" else "marker")
    monkeypatch.setenv("RAY_ADDRESS", "")  # must not reach the children
    files = collect([folder])
    assert {f.path.stem: f.devices for f in files} == {
        f"test_{k}": need for k, (need, _) in spec.items()}
    out = io.StringIO()
    results, _ = run_files(
        files, SchedulerOptions(devices=("0", "1", "2", "3"), timeout_s=120, heartbeat_s=0,
                                loopback_guard=False, cwd=tmp_path),
        Console(file=out, width=200))

    assert [r.status for r in results] == [FileStatus.PASSED] * len(spec), out.getvalue()
    summary = out.getvalue()
    for name in spec:
        assert re.search(rf"suite/test_{name}\.py\s.*passed", summary), summary
    recs = load_records(records)
    by_name = {r.path.stem.removeprefix("test_"): r for r in results}
    for name, (need, _) in spec.items():
        rec, res = recs[name], by_name[name]
        assert rec["cvd"] == ",".join(res.devices) and len(res.devices) == need
        assert not rec["has_ray_address"]  # removed, never set to ""
        assert rec["tmpdir"] == rec["ray_tmpdir"] and not Path(rec["tmpdir"]).exists()
        assert res.start <= rec["start"] <= rec["end"] <= res.end
    assert len({rec["tmpdir"] for rec in recs.values()}) == len(spec)

    # No device is held by two files at once: as seen by the files and by the scheduler.
    assert_no_device_shared([(n, recs[n]["start"], recs[n]["end"], by_name[n].devices)
                             for n in spec])
    assert_no_device_shared([(n, r.start, r.end, r.devices) for n, r in by_name.items()])

    # Work-conserving: right after any file ends, no pending file fits on the idle devices.
    eps = 1.0  # the scheduler's reaction time, generous for a loaded machine
    for ended in by_name.values():
        t = ended.end + eps
        busy = sum(len(r.devices) for r in by_name.values() if r.start <= t < r.end)
        for name, r in by_name.items():
            if r.start > t:
                assert len(r.devices) > 4 - busy, f"{name} waited with {4 - busy} devices free"

    # Wall time close to the best packing of the durations this run measured.
    measured = [(len(r.devices), r.duration_s) for r in results]
    best = optimal_makespan(measured, devices=4)
    span = max(r.end for r in results) - min(r.start for r in results)
    # each start may lag the end that freed its devices by the reaction time above
    assert span <= best + eps * len(spec), f"makespan {span:.2f}s, optimal {best:.2f}s"


def test_a_hung_file_is_killed_with_its_children_and_its_devices_reused(tmp_path):
    folder, records = tmp_path / "suite", tmp_path / "records"
    folder.mkdir()
    records.mkdir()
    write_test_file(folder, "hang", 2, 300, records, children=("group", "session"))
    write_test_file(folder, "leaky", 1, 0.2, records, children=("session",))
    write_test_file(folder, "after", 1, 0.2, records)
    results, _ = run_files(
        collect([folder]),
        # the timeout is every file's: under a loaded suite a pytest child's start alone has
        # taken more than 8 s, and the files that must pass get the time to start
        SchedulerOptions(devices=("0", "1"), timeout_s=30, heartbeat_s=0, kill_grace_s=1,
                         loopback_guard=False),
        Console(file=io.StringIO(), width=200))
    by_name = {r.path.stem.removeprefix("test_"): r for r in results}
    hang, leaky, after = by_name["hang"], by_name["leaky"], by_name["after"]
    assert hang.status is FileStatus.TIMED_OUT and hang.returncode is None
    assert leaky.status is FileStatus.PASSED and after.status is FileStatus.PASSED

    started = json.loads((records / "hang.started").read_text())
    leaked = load_records(records)["leaky"]
    pids = [started["pid"], *started["children"], *leaked["children"]]
    assert len(pids) == 4 and all(gone(pid) for pid in pids), [
        (p, psutil.Process(p).status()) for p in pids if not gone(p)]
    # The devices of the killed file went to the next files, only after the kill.
    assert set(leaky.devices) | set(after.devices) <= set(hang.devices) == {"0", "1"}
    assert min(leaky.start, after.start) >= hang.end


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_reports_every_file_and_leaves_no_process(tmp_path):
    folder, records, tmproot = tmp_path / "suite", tmp_path / "records", tmp_path / "tmproot"
    for d in (folder, records, tmproot):
        d.mkdir()
    for name in ("hang_a", "hang_b", "hang_c"):
        write_test_file(folder, name, 1, 300, records, children=("group", "session"))
    log = tmp_path / "scheduler.out"
    env = {**os.environ, "TMPDIR": str(tmproot), "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "tools.gpu_scheduler", "suite", "--devices", "2",
           "--timeout", "120", "--heartbeat", "1", "--kill-grace", "1"]
    with open(log, "w") as out:
        # Ctrl+C as from a terminal: a runner started in the background (or a library loaded
        # earlier in this process) may have left SIGINT ignored, which the child would inherit.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=tmp_path, start_new_session=True,
                                preexec_fn=_default_sigint)
    beat = re.compile(r"^heartbeat (\d+): suite/(test_\w+)\.py running", re.M)
    try:
        # Both running files are inside their test (a heartbeat counts from the launch, and a
        # loaded machine can take many seconds to start pytest in them) and report at least two
        # heartbeats, then Ctrl+C. The deadline only bounds a hang.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            seen = Counter(name for _, name in beat.findall(log.read_text()))
            if (len(seen) == 2 and min(seen.values()) >= 2
                    and len(list(records.glob("*.started"))) == 2):
                break
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()
        started = [json.loads(p.read_text()) for p in records.glob("*.started")]
        assert len(started) == 2, log.read_text()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    text = log.read_text()
    assert rc == 130, text
    rows = {m.group(1): m.group(2) for m in
            re.finditer(r"suite/test_(hang_\w)\.py\s*│.*│\s*(interrupted|not started|passed|"
                        r"failed|timed out)\s*│", text)}
    ran = {rec["name"] for rec in started}
    assert rows == {name: "interrupted" if name in ran else "not started"
                    for name in ("hang_a", "hang_b", "hang_c")}, text

    pids = [pid for rec in started for pid in (rec["pid"], *rec["children"])]
    assert len(pids) == 6 and all(gone(pid) for pid in pids)
    # The scheduler's scratch (per-file temp dirs, logs) is gone; imports may leave caches.
    assert not list(tmproot.glob("toolrl-sched-*"))
    assert not list(tmproot.glob("**/test_hang_*.log"))

    # One heartbeat per interval per running file: no (tick, file) twice, ticks increasing.
    beats = [(int(tick), name) for tick, name in beat.findall(text)]
    assert beats and max(Counter(beats).values()) == 1
    for name in ran:
        ticks = [tick for tick, n in beats if n == f"test_{name}"]
        assert len(ticks) >= 2 and ticks == sorted(ticks)
