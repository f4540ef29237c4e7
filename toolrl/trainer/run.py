"""`toolrl train`: the trainer of ``trainer.mode`` (`Trainer`, `PipelineTrainer` or
`AsyncTrainer`), fit, and
everything shut down (the one place that knows both, so neither imports the other's module
back)."""

from __future__ import annotations

from toolrl.controller.cluster import shutdown_ray
from toolrl.trainer.async_mode import AsyncTrainer
from toolrl.trainer.config import ExperimentConfig
from toolrl.trainer.pipeline import PipelineTrainer
from toolrl.trainer.trainer import Trainer

TRAINERS = {"sync": Trainer, "pipeline": PipelineTrainer, "async": AsyncTrainer}


def run_training(cfg: ExperimentConfig) -> dict[str, float]:
    """Build the workers, train ``trainer.total_steps`` steps, shut everything down; returns
    the final metrics."""
    trainer = TRAINERS[cfg.trainer.mode](cfg)
    try:
        return trainer.fit()
    finally:
        try:
            trainer.close()
        finally:
            shutdown_ray(started_only=True)  # a local cluster it started: all of it
