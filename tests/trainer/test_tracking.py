"""Tracking writes JSONL, TensorBoard and PNG curves; secrets never reach the dumps."""

from __future__ import annotations

import json

from rich.console import Console

from toolrl.trainer.tracking import Tracker, plot_curves, read_metrics, redact, secret_values


def test_tracker_writes_every_destination(tmp_path):
    tracker = Tracker(tmp_path, "exp", config={"a": {"b": 1}}, total_steps=3,
                      console=Console(file=open(tmp_path / "console.txt", "w")))  # noqa: SIM115
    for step in range(1, 4):
        metrics = {"train/reward_mean": 0.1 * step, "train/success": 0.2 * step,
                   "timing/step_s": 1.0}
        if step % 2:
            metrics["val/success"] = 0.3 * step
        tracker.log(step, metrics)
    tracker.log_rollouts(2, [{"messages": [{"role": "user", "content": "hi"}]}])
    plots = tracker.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["val/success"] == 0.3 and "val/success" not in rows[1]
    assert list((tmp_path / "tensorboard").iterdir())
    assert {p.name for p in plots} == {"reward.png", "success.png"}
    assert all(p.stat().st_size > 1000 for p in plots)
    dumped = json.loads((tmp_path / "rollouts" / "step_2.jsonl").read_text())
    assert dumped["messages"][0]["content"] == "hi"
    assert "step    3" in (tmp_path / "console.txt").read_text()


def test_plot_curves_without_metrics_writes_nothing(tmp_path):
    assert plot_curves(tmp_path / "missing.jsonl", tmp_path / "plots") == []


def test_secret_values_are_redacted(tmp_path, monkeypatch):
    canary = "sk-canary-0123456789abcdef"
    monkeypatch.setenv("MY_SERVICE_API_KEY", canary)
    monkeypatch.setenv("HOME_DIRECTORY_NAME", "not-a-secret-value")
    assert canary in secret_values()
    assert "not-a-secret-value" not in secret_values()
    record = {"messages": [{"content": f"the key is {canary}"}], canary: [canary]}
    assert canary not in json.dumps(redact(record, secret_values()))
    tracker = Tracker(tmp_path, "exp", console=Console(file=open(tmp_path / "c.txt", "w")))  # noqa: SIM115
    tracker.log_rollouts(1, [record])
    tracker.close()
    assert canary not in (tmp_path / "rollouts" / "step_1.jsonl").read_text()


def test_console_and_plots_show_reward_components_finish_reasons_and_errors(tmp_path):
    out = tmp_path / "console.txt"
    tracker = Tracker(tmp_path, "exp", total_steps=2, console=Console(file=open(out, "w"),  # noqa: SIM115
                                                                       width=200))
    for step in (1, 2):
        tracker.log(step, {"train/reward_mean": 0.5, "train/success": 0.25,
                           "reward/total": 0.5, "reward/success": 0.25, "reward/format": 0.75,
                           "reward/format/calls": 0.5, "reward/errors/format": float(step - 1),
                           "reward/errors/success": 0.0, "reward/gate_open/format": 1.0,
                           "rollout/finish_terminated": 0.75, "rollout/finish_context": 0.25,
                           "rollout/finish_error": 0.0, "rollout/tool_errors_mean": 0.5,
                           "rollout/dropped_calls_mean": 8.0 * (step - 1),
                           "val/reward_mean": 0.4})
    plots = tracker.close()
    lines = out.read_text().splitlines()
    first, second = [i for i, line in enumerate(lines) if line.startswith("step")]
    assert lines[first + 1].split() == [
        "rewards:", "format=0.750", "success=0.250", "|", "finish:", "context=0.250", "|",
        "errors:", "tool/episode=0.500"]
    assert lines[second + 1].endswith(  # calls past max_calls_per_turn are never silent
        "errors: tool/episode=0.500 dropped_calls/episode=8.000 reward format=1")
    assert {p.name for p in plots} == {"reward.png", "success.png", "reward_components.png",
                                       "finish_reasons.png", "errors.png"}
