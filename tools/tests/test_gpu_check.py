"""The GPU check's dry mode (CPU, tiny shapes) runs every check's code path, so the check
cannot rot before a GPU is at hand; its copy of vLLM's packed-tensor module stays verbatim."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
        # packed:varlen: the varlen route with the CPU stand-in for torch's CUDA-only kernel
        for layout in ("padded", "packed", "packed:varlen", "shared_prefix"):
            assert scoring[f"{dtype}/{layout}"]["max"] < 0.01
        assert scoring[f"{dtype}/packed_route"] == "mask"  # auto on the CPU
        assert scoring[f"{dtype}/auto_took_varlen"] is False  # so the auto layout shares prompts


def test_the_scoring_check_times_the_packed_layout_on_both_routes_where_it_can():
    from tools.gpu_check.checks import packed_variants

    def labels(route, dtype, cuda):
        return [label for label, _ in packed_variants(route, dtype, cuda)]

    assert labels("varlen", torch.bfloat16, True) == [
        "padded", "packed (varlen)", "packed (mask, forced)", "shared_prefix", "auto"]
    assert labels("mask", torch.float32, True) == [  # torch's kernel takes no fp32
        "padded", "packed (mask)", "shared_prefix", "auto"]
    assert labels("mask", torch.float32, False) == [  # dry mode: the stand-in kernel
        "padded", "packed (mask)", "packed (varlen, forced)", "shared_prefix", "auto"]
    assert packed_variants("mask", torch.float32, False)[2][1] == "varlen"


def test_the_copy_of_vllms_packed_tensor_module_is_verbatim():
    packed = pytest.importorskip("vllm.distributed.weight_transfer.packed_tensor",
                                 reason="compares with the installed vLLM")
    copy = (ROOT / "tools" / "gpu_check" / "vllm_packed_tensor.py").read_text()
    assert copy.split(HEADER_END, 1)[1] == Path(packed.__file__).read_text()
