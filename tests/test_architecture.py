"""Architecture rules as tests: Ray stays inside the orchestration layers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Source trees scanned (everything that ships in the distribution).
SOURCE_DIRS = ("toolrl", "envs", "rewards")

# The only places allowed to import Ray: a directory (trailing slash) or one file.
ALLOWED_RAY_IMPORTERS = (
    "toolrl/controller/",
    "toolrl/workers/",
    "toolrl/rollout/worker.py",
    "toolrl/trainer/",
)


def ray_imports(path: Path) -> list[int]:
    """Line numbers of ``import ray[...]`` / ``from ray[...] import ...`` in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n == "ray" or n.startswith("ray.") for n in names):
            lines.append(node.lineno)
    return lines


def is_allowed(rel: str) -> bool:
    return any(rel.startswith(p) if p.endswith("/") else rel == p for p in ALLOWED_RAY_IMPORTERS)


def test_ray_is_imported_only_by_the_orchestration_layers():
    offenders = []
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not is_allowed(rel):
                offenders += [f"{rel}:{line}" for line in ray_imports(path)]
    assert not offenders, (f"Ray imported outside {ALLOWED_RAY_IMPORTERS}: {offenders}; keep "
                           f"Ray behind toolrl.controller and the worker modules")


def test_the_scanner_sees_every_import_form(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("import os\nimport ray\nimport ray.util as u\nfrom ray import remote\n"
                      "from ray.util import placement_group\nfrom . import ray\n"
                      "import raytracer\ndef f():\n    import ray.exceptions\n")
    assert ray_imports(sample) == [2, 3, 4, 5, 9]
    assert is_allowed("toolrl/controller/worker_group.py")
    assert is_allowed("toolrl/rollout/worker.py") and not is_allowed("toolrl/rollout/engine.py")
    assert not is_allowed("toolrl/core/env.py")
