"""The README's first command on a fresh clone, as a new user runs it.

The repo's files as a clone has them (``git ls-files``: tracked and not-ignored files, so no
``models/``, ``outputs/`` or ``.venv``) are copied into an empty folder, and there
``toolrl train --dry-run`` and then ``make demo`` (this interpreter's venv, the install step
taken as done) run the quickstart to its first GRPO step and that step's validation. The model
hub is a loopback server that records every request, with the offline switches off: a model
path taken for a hub id, a retry or a HEAD request shows up as a request, and fails the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the demo's own config, shortened to one GRPO step (and its validation) on a short warm start
SHORT = ["trainer.total_steps=1", "trainer.val_every=1", "trainer.save_every=0",
         "warm_start.steps=20", "warm_start.num_transcripts=64", "data.train_size=64",
         "data.val_size=16", "trainer.log_rollouts=0"]


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_hub():
    """A loopback 'hub' that answers 404 to everything and records what was asked."""
    handler = type("Handler", (_Recorder,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen
    finally:
        server.shutdown()
        server.server_close()


def clone_files(dest: Path) -> Path:
    """Copy what a fresh clone of this checkout holds into ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def online_env(hub: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOOLRL_TINY_MODEL")}
    return {**env, "HF_ENDPOINT": hub, "COLUMNS": "160", "PYTHONUNBUFFERED": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_the_readme_commands_on_a_fresh_clone(tmp_path, fake_hub):
    hub, requests = fake_hub
    tree = clone_files(tmp_path / "clone")
    assert not (tree / "models").exists() and not (tree / "outputs").exists()
    env = online_env(hub)

    dry = subprocess.run(["toolrl", "train", "--config", "configs/quickstart.yaml",
                          "--dry-run"], cwd=tree, env=env, capture_output=True, text=True,
                         timeout=300)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "no problems found" in dry.stdout, dry.stdout[-3000:]
    assert requests == [], requests

    venv = Path(sys.executable).parent.parent
    demo = subprocess.run(["make", "-o", str(venv / ".toolrl-installed"), "demo",
                           f"VENV={venv}", f"ARGS={' '.join(SHORT)}"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=800)
    log = demo.stdout + demo.stderr
    assert demo.returncode == 0, log[-5000:]
    assert requests == [], requests  # nothing asked the hub
    assert (tree / "models" / "tiny" / "config.json").is_file()  # the demo built its model
    assert "building a small model" in log
    rows = [json.loads(line) for line in
            (tree / "outputs" / "quickstart" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward_mean" in r]
    assert steps and steps[0]["step"] == 1 and "timing/step_s" in steps[0], rows
    assert any("val/success" in r for r in rows), rows


def test_a_missing_model_is_one_line_and_asks_no_hub(tmp_path, fake_hub):
    """A config naming a model that is neither local nor in the hub cache, with the hub
    offline: exit 2, one line naming model.path, no request."""
    hub, requests = fake_hub
    config = tmp_path / "missing.yaml"
    config.write_text(f"model:\n  path: nobody/no-such-model\n"
                      f"trainer:\n  output_dir: {tmp_path / 'run'}\n")
    env = {**online_env(hub), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache")}
    run = subprocess.run(["toolrl", "train", "--config", str(config)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "model.path='nobody/no-such-model'" in run.stderr
    assert "HF_HUB_OFFLINE" in run.stderr and requests == []
    assert not (tmp_path / "run").exists()
