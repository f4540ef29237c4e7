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


def test_make_tiny_model_from_a_config_json(tmp_path):
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen2", "vocab_size": 151936,
                                  "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 1, "num_attention_heads": 4,
                                  "num_key_value_heads": 2}))
    out = tmp_path / "m"
    res = subprocess.run([sys.executable, "-m", "toolrl.cli", "make-tiny-model", "--out",
                          str(out), "--config-json", str(config), "--dtype", "float32"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    built = AutoConfig.from_pretrained(out)
    assert (built.vocab_size, built.hidden_size, str(built.dtype)) == (151936, 64, "torch.float32")
    bad = subprocess.run([sys.executable, "-m", "toolrl.cli", "make-tiny-model", "--out",
                          str(tmp_path / "x"), "--config-json", str(tmp_path / "missing.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cannot read" in bad.stderr


def test_unknown_subcommand_is_a_clear_error():
    res = subprocess.run([sys.executable, "-m", "toolrl.cli", "frobnicate"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "invalid choice" in res.stderr
