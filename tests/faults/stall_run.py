"""One stalled run for tests/faults/test_fault_stalls.py, in a process of its own: the stall
watchdog interrupts its driver's main thread and, if that does not stop it within the grace,
ends the process (``os._exit``). In pytest's own process either would end the test runner.

Usage: ``python stall_run.py CONFIG OVERRIDE...``. Prints ``STALL_ERROR <line>`` on stdout
when the run ends with `StallError`, ``FINISHED`` when it trains to its end; anything else
leaves with its own exit status.
"""

from __future__ import annotations

import sys

from trainer_runs import ROOT, register_test_rewards

from toolrl.trainer.config import load_config
from toolrl.trainer.progress import StallError
from toolrl.trainer.run import run_training


def main(config: str, overrides: list[str]) -> int:
    register_test_rewards()
    try:
        run_training(load_config(ROOT / config, overrides))
    except StallError as e:
        print(f"STALL_ERROR {e}", flush=True)
        return 0
    print("FINISHED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
