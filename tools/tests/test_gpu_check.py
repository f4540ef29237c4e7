"""The GPU check's dry mode (CPU, tiny shapes) runs every check's code path, so the check
cannot rot before a GPU is at hand; its copy of vLLM's packed-tensor module stays verbatim."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADER_END = "# --- end of header ---\n"


def test_the_dry_mode_runs_every_check_and_writes_the_report(tmp_path):
    out = subprocess.run([sys.executable, "tools/gpu_check/run.py", "--dry", "--out",
                          str(tmp_path), "--only", "scoring,ipc,memory,lora"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[" in out.stdout and "== ipc" in out.stdout  # progress is printed as it goes
    report = (tmp_path / "gpu_check.md").read_text()
    assert "DRY MODE" in report and "all checks passed" in report
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    titles = [s["title"] for s in data["sections"]]
    assert len(titles) == 4 and not any(s["failures"] for s in data["sections"])
    ipc = data["sections"][1]
    hub = next(row for row in ipc["tables"][0][1] if row[0].startswith("hub id"))
    assert hub[5] == 1 and hub[6] == "all match"  # the buffer grew for the large embedding
    scoring = data["sections"][0]["data"]
    for dtype in ("float32", "bfloat16"):
        for layout in ("padded", "packed", "shared_prefix"):
            assert scoring[f"{dtype}/{layout}"]["max"] < 0.01


def test_the_copy_of_vllms_packed_tensor_module_is_verbatim():
    packed = pytest.importorskip("vllm.distributed.weight_transfer.packed_tensor",
                                 reason="compares with the installed vLLM")
    copy = (ROOT / "tools" / "gpu_check" / "vllm_packed_tensor.py").read_text()
    assert copy.split(HEADER_END, 1)[1] == Path(packed.__file__).read_text()
