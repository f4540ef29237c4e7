"""Experiment tracking: console, JSONL metrics, TensorBoard, optional wandb/mlflow, PNG curves.

One `Tracker` per run writes into the run directory:

    metrics.jsonl            one JSON object per step ({"step": N, "train/...": ..., ...})
    rollouts/step_<N>.jsonl  sample trajectories of that step
    tensorboard/             event files (always)
    plots/*.png              reward / success curves, written by `close()`

Backends are a registry (`TRACKERS`), so a user can add one by name.
"""

from __future__ import annotations

import abc
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from toolrl.registry import Registry

Backend = Callable[..., "TrackerBackend"]
TRACKERS: Registry[Backend] = Registry("tracker", group="toolrl.trackers")

# Environment variables whose values must never reach logs or dumps.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names look like keys or tokens (8+ chars)."""
    environ = os.environ if environ is None else environ
    return sorted({v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= 8},
                  key=len, reverse=True)


def redact(obj: Any, secrets: Iterable[str]) -> Any:
    """Replace every occurrence of a secret value inside strings of a JSON-like object."""
    secrets = list(secrets)
    if not secrets:
        return obj
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, "***")
        return obj
    if isinstance(obj, Mapping):
        return {redact(k, secrets): redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v, secrets) for v in obj]
    return obj


class TrackerBackend(abc.ABC):
    """One destination for metrics."""

    @abc.abstractmethod
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record the metrics of one step."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Flush and release resources."""


@TRACKERS.register("jsonl")
class JsonlBackend(TrackerBackend):
    def __init__(self, run_dir: Path, **_: Any) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._fh = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._fh.write(json.dumps({"step": step, **metrics}, default=_jsonable) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


@TRACKERS.register("tensorboard")
class TensorBoardBackend(TrackerBackend):
    def __init__(self, run_dir: Path, **_: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: heavy (torch, tensorboard)

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            if isinstance(value, int | float) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@TRACKERS.register("wandb")
class WandbBackend(TrackerBackend):
    def __init__(self, run_dir: Path, experiment_name: str, config: Mapping[str, Any],
                 **_: Any) -> None:
        import wandb  # lazy: optional, not a dependency of toolrl

        self.run = wandb.init(project="toolrl", name=experiment_name, dir=str(run_dir),
                              config=dict(config))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


@TRACKERS.register("mlflow")
class MlflowBackend(TrackerBackend):
    def __init__(self, run_dir: Path, experiment_name: str, config: Mapping[str, Any],
                 **_: Any) -> None:
        import mlflow  # lazy: optional, not a dependency of toolrl

        mlflow.set_experiment(experiment_name)
        self.mlflow = mlflow
        self.run = mlflow.start_run()
        mlflow.log_params({k: str(v)[:250] for k, v in _flatten(config).items()})

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()
                                 if isinstance(v, int | float)}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


# The lines shown on the console for each step, in this order, when present.
CONSOLE_KEYS = ("train/reward_mean", "train/success", "val/success", "val/reward_mean",
                "actor/loss", "actor/grad_norm", "timing/step_s")


def reward_components(metrics: Mapping[str, Any]) -> list[str]:
    """The per-component reward keys of a metrics row: ``reward/<alias>`` (one level; not the
    total, error counts or gate rates)."""
    return sorted(k for k in metrics if k.startswith("reward/") and k.count("/") == 1
                  and k != "reward/total")


def console_details(metrics: Mapping[str, Any]) -> str:
    """The second console line of a step: each reward component, the finish reasons other than
    ``terminated`` (fractions of the batch), and the error counts that are not zero."""
    parts = []
    rewards = [f"{k.removeprefix('reward/')}={_fmt(metrics[k])}"
               for k in reward_components(metrics)]
    if rewards:
        parts.append("rewards: " + " ".join(rewards))
    finish = [f"{k.removeprefix('rollout/finish_')}={_fmt(v)}" for k, v in sorted(metrics.items())
              if k.startswith("rollout/finish_") and k != "rollout/finish_terminated" and v]
    if finish:
        parts.append("finish: " + " ".join(finish))
    errors = [f"reward {k.removeprefix('reward/errors/')}={v:g}"
              for k, v in sorted(metrics.items()) if k.startswith("reward/errors/") and v]
    if metrics.get("rollout/dropped_calls_mean"):  # calls past max_calls_per_turn
        errors.insert(0, f"dropped_calls/episode={_fmt(metrics['rollout/dropped_calls_mean'])}")
    if metrics.get("rollout/tool_errors_mean"):
        errors.insert(0, f"tool/episode={_fmt(metrics['rollout/tool_errors_mean'])}")
    if errors:
        parts.append("errors: " + " ".join(errors))
    return "  |  ".join(parts)


class Tracker:
    """Fan metrics out to the configured backends and the console; write curves at the end."""

    def __init__(self, run_dir: str | os.PathLike, experiment_name: str,
                 config: Mapping[str, Any] | None = None,
                 backends: Iterable[str] = ("jsonl", "tensorboard"), total_steps: int = 0,
                 console: Console | None = None, start_step: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "rollouts").mkdir(exist_ok=True)
        self.console = console or Console()
        self._secrets = secret_values()
        config = redact(dict(config or {}), self._secrets)
        self.backends = [TRACKERS.get(name)(run_dir=self.run_dir, experiment_name=experiment_name,
                                            config=config) for name in backends]
        self.history: list[dict[str, float]] = []
        self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  console=self.console, transient=False,
                                  disable=not self.console.is_terminal)
        self._task = self._progress.add_task(experiment_name, total=total_steps or None,
                                             completed=start_step)
        self._progress.start()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record one step's metrics everywhere and print a one-line summary (names and
        string values with secrets redacted)."""
        clean = redact({k: _jsonable(v) for k, v in metrics.items()}, self._secrets)
        self.history.append({"step": step, **clean})
        for backend in self.backends:
            backend.log(step, clean)
        shown = "  ".join(f"{k.split('/', 1)[-1] if k.startswith('train/') else k}="
                          f"{_fmt(clean[k])}" for k in CONSOLE_KEYS if k in clean)
        self._progress.console.print(f"step {step:>4}  {shown}", markup=False, highlight=False)
        details = console_details(clean)
        if details:
            self._progress.console.print(f"           {details}", markup=False,
                                         highlight=False)
        self._progress.update(self._task, completed=step)

    def log_rollouts(self, step: int, records: Iterable[Mapping[str, Any]]) -> Path:
        """Dump sample trajectories of one step as JSONL (secrets redacted)."""
        path = self.run_dir / "rollouts" / f"step_{step}.jsonl"
        with path.open("w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(redact(record, self._secrets), default=_jsonable) + "\n")
        return path

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print on the run's console (string arguments with secrets redacted)."""
        self._progress.console.print(*redact(list(args), self._secrets), **kwargs)

    def close(self) -> list[Path]:
        """Stop the progress bar, close backends, and write the curves as PNG."""
        self._progress.stop()
        for backend in self.backends:
            backend.close()
        return plot_curves(self.run_dir / "metrics.jsonl", self.run_dir / "plots")


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl file."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(metrics_path: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """Write reward and success curves (train and validation) as PNG files."""
    import matplotlib  # lazy: matplotlib is heavy (~0.5 s), for the curves only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib, after its backend is chosen

    rows = read_metrics(metrics_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    keys = sorted({k for r in rows for k in r})
    panels = [("reward.png", "reward", ["train/reward_mean", "val/reward_mean"]),
              ("success.png", "success rate", ["train/success", "val/success"]),
              ("reward_components.png", "mean raw score",
               sorted({k for r in rows for k in reward_components(r)})),
              ("finish_reasons.png", "fraction of episodes",
               [k for k in keys if k.startswith("rollout/finish_")]),
              ("errors.png", "count (tool errors: per episode)",
               [k for k in keys if k.startswith("reward/errors/")
                or k in ("rollout/tool_errors_mean", "rollout/dropped_calls_mean")])]
    for name, ylabel, keys in panels:
        series = {k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), int | float)]
                  for k in keys}
        if not any(series.values()):
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
        for key, points in series.items():
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o" if len(points) < 30 else None, label=key)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / name)
        plt.close(fig)
        written.append(out_dir / name)
    return written


def _flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, RuntimeError):
            pass
    if isinstance(value, Path):
        return str(value)
    return value


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
