"""`toolrl train`: the trainer of ``trainer.mode`` (`Trainer` or `PipelineTrainer`), fit, and
everything shut down (the one place that knows both, so neither imports the other's module
back)."""

from __future__ import annotations

from toolrl.trainer.config import ExperimentConfig
from toolrl.trainer.pipeline import PipelineTrainer
from toolrl.trainer.trainer import Trainer


def run_training(cfg: ExperimentConfig) -> dict[str, float]:
    """Build the workers, train ``trainer.total_steps`` steps, shut everything down; returns
    the final metrics."""
    trainer = PipelineTrainer(cfg) if cfg.trainer.mode == "pipeline" else Trainer(cfg)
    try:
        return trainer.fit()
    finally:
        trainer.close()
