"""``toolrl train | eval``: experiments from a config file (and ``train --dry-run``)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable

from toolrl.controller.resources import ResourceError
from toolrl.reward import RewardConfigError
from toolrl.trainer import config, failures, health, progress, run, run_dir, stopping
from toolrl.trainer.dry_run import dry_run
from toolrl.trainer.evaluate import JOURNAL, run_evaluation


def train(args: argparse.Namespace) -> int:
    if args.dry_run:
        return run_experiment("train", args, lambda cfg: int(not dry_run(
            cfg, tasks=args.dry_run_tasks).ok))
    try:
        return _stoppable("train", "the step in flight is redone by trainer.resume=auto from "
                          "the last checkpoint", lambda: run_experiment("train", args,
                                                                        run.run_training))
    except stopping.RunStopped as e:  # at a step's end, with a checkpoint (stop_grace_s)
        print(f"toolrl train: {e}; workers and the local Ray cluster shut down "
              f"(trainer.resume=auto goes on from step {e.step})", file=sys.stderr)
        return 128 + e.signum


def evaluate(args: argparse.Namespace) -> int:
    """SIGTERM or SIGINT stops an evaluation at once, its workers and local Ray cluster shut
    down (Ray's own SIGTERM handler would abort the process and leave its agents running); the
    same command goes on from the chunks it journaled."""
    return _stoppable("eval", f"the same command goes on from the chunks finished in "
                              f"{args.output_dir}/{JOURNAL}",
                      lambda: run_experiment("eval", args, lambda cfg: run_evaluation(
                          cfg, args.model, args.output_dir,
                          save_transcripts=args.save_transcripts, trials=args.trials)))


def _stoppable(command: str, after: str, body: Callable[[], int]) -> int:
    """``body`` under `stopping.signals_stop_the_run`: a signal that interrupts it is one line
    on stderr (``after`` says what a rerun does) and exit 128 + the signal (130 for SIGINT,
    143 for SIGTERM)."""
    with stopping.signals_stop_the_run() as stop:
        try:
            return body()
        except KeyboardInterrupt:
            if stop.signal is None:
                raise
            sig = signal.Signals(stop.signal)
            print(f"toolrl {command}: stopped by {sig.name}; workers and the local Ray cluster "
                  f"shut down ({after})", file=sys.stderr)
            return 128 + sig.value


def run_experiment(command: str, args: argparse.Namespace,
                   experiment: Callable[[config.ExperimentConfig], object]) -> int:
    """Load the config, then run. Bad configs (env and reward ids and kwargs included),
    prompts over budget, pools that do not fit the cluster and a run dir in use are one clear
    line on stderr (exit 2) before any worker starts; a run stopped by its health check or by
    too many infrastructure failures is one line too (exit 1). ``--debug`` shows the
    traceback instead."""
    try:
        cfg = config.load_config(args.config, args.overrides)
        status = experiment(cfg)
    except (config.ConfigError, RewardConfigError, FileNotFoundError, ResourceError,
            run_dir.RunDirInUse) as e:
        if args.debug:
            raise
        print(f"toolrl {command}: {e}", file=sys.stderr)
        return 2
    except (health.UnhealthyRun, failures.InfraFailureError) as e:  # health, infra_failures
        if args.debug:
            raise
        print(f"toolrl {command}: stopped: {e}", file=sys.stderr)
        return 1
    except progress.StallError:  # trainer.watchdog: its one line is out already, stacks in stalls/
        if args.debug:
            raise
        return progress.EXIT_STALLED
    return status if isinstance(status, int) else 0
