"""`toolrl train`: the `Trainer` (its schedule by ``trainer.mode``), fit, and everything shut
down."""

from __future__ import annotations

from toolrl.controller.cluster import shutdown_ray
from toolrl.trainer.config import ExperimentConfig
from toolrl.trainer.trainer import Trainer


def run_training(cfg: ExperimentConfig) -> dict[str, float]:
    """Build the workers, train ``trainer.total_steps`` steps, shut everything down; returns
    the final metrics."""
    trainer = Trainer(cfg)
    try:
        return trainer.fit()
    finally:
        try:
            trainer.close()
        finally:
            shutdown_ray(started_only=True)  # a local cluster it started: all of it
