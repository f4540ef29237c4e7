"""The engine guard's wiring; the processes themselves are in
tests/faults/test_fault_engine_processes.py."""

from __future__ import annotations

import pickle

from toolrl.rollout import engine_guard


def test_install_wraps_vllms_process_entry_points_once_and_by_name():
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.executor.multiproc_executor import WorkerProc

    engine_guard.install()
    engine_guard.install()  # idempotent: the originals are kept, not the wrappers
    assert EngineCoreProc.run_engine_core is engine_guard.run_engine_core
    assert WorkerProc.worker_main is engine_guard.worker_main
    assert engine_guard._ORIGINALS["engine_core"] is not engine_guard.run_engine_core
    assert engine_guard._ORIGINALS["worker"].__module__.startswith("vllm.")
    # spawn pickles a process target by name: the child imports this module and runs the guard
    assert pickle.loads(pickle.dumps(EngineCoreProc.run_engine_core)) is \
        engine_guard.run_engine_core
    assert b"toolrl.rollout.engine_guard" in pickle.dumps(WorkerProc.worker_main)
