"""The `toolrl` console script."""

from __future__ import annotations

import shutil
import subprocess
import sys

from transformers import AutoConfig


def test_make_tiny_model_via_console_script(tmp_path):
    exe = shutil.which("toolrl")
    cmd = [exe] if exe else [sys.executable, "-m", "toolrl.cli"]
    out = tmp_path / "m"
    res = subprocess.run([*cmd, "make-tiny-model", "--out", str(out), "--size", "medium"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert AutoConfig.from_pretrained(out).hidden_size == 256
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("user data")
    again = subprocess.run([*cmd, "make-tiny-model", "--out", str(other)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "not a tiny-model directory" in again.stderr
    assert (other / "keep.txt").read_text() == "user data"


def test_unknown_subcommand_is_a_clear_error():
    res = subprocess.run([sys.executable, "-m", "toolrl.cli", "frobnicate"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "invalid choice" in res.stderr
