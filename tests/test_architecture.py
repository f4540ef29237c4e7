"""Architecture rules as tests: every layering rule of the design map (DESIGN.md, "Dependencies
point one way"), checked on the import statements of the source tree.

- Ray stays inside the orchestration layers (controller, workers, the rollout worker, trainer).
- ``core`` (envs, tools, parsing, the episode record) knows no Ray, workers, rollout, trainer
  or reward composition; ``reward`` builds on ``core`` alone.
- ``algo`` is pure math on tensors: torch and its own modules, nothing else of toolrl.
- ``controller`` is generic orchestration: it knows no RL (only itself and the batch carrier).
- ``weights`` (the one home of weight transfer: buckets, routes, vLLM's worker extension, the
  engine's end, the canary) knows no other toolrl layer and imports no Ray, tensordict or
  transformers; vLLM only inside functions (``# lazy``), so it imports without vLLM. ``rollout``
  and ``workers`` use it; ``rollout`` never imports ``workers``, ``trainer`` or the reward
  composition.
- Plugins (built-in envs and rewards, the examples) use only the public API: ``toolrl`` itself
  (names in ``toolrl.__all__``) and their own package.
- No import cycles between toolrl's modules; the product imports no development tool.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import toolrl

ROOT = Path(__file__).resolve().parents[1]

# Source trees scanned (everything that ships in the distribution), by installed prefix.
SOURCE_DIRS = {"toolrl": "toolrl", "envs": "toolrl.envs", "rewards": "toolrl.rewards"}

# The only places allowed to import Ray: a directory (trailing slash) or one file.
ALLOWED_RAY_IMPORTERS = (
    "toolrl/controller/",
    "toolrl/workers/",
    "toolrl/rollout/worker.py",
    "toolrl/trainer/",
)


@dataclass(frozen=True)
class Import:
    module: str  # the absolute module named by the statement
    names: tuple[str, ...]  # for ``from m import a, b``: ("a", "b"); else ()
    line: int
    type_checking: bool  # inside ``if TYPE_CHECKING:`` (never runs)


def imports_of(path: Path, package: str) -> list[Import]:
    """Every import statement of a file, relative ones resolved against ``package``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            guarded |= {id(n) for child in node.body for n in ast.walk(child)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(a.name, (), node.lineno, id(node) in guarded) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            out.append(Import(module, tuple(a.name for a in node.names), node.lineno,
                              id(node) in guarded))
    return out


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [SOURCE_DIRS[rel.parts[0]], *rel.with_suffix("").parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(top: str) -> list[Path]:
    return sorted((ROOT / top).rglob("*.py"))


def modules() -> dict[str, Path]:
    return {module_name(p): p for top in SOURCE_DIRS for p in source_files(top)}


def package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def toolrl_imports(rel_dir: str) -> list[tuple[str, Import]]:
    """``(file, import)`` for every toolrl import under ``toolrl/<rel_dir>/``."""
    out = []
    for path in source_files(f"toolrl/{rel_dir}"):
        name = module_name(path)
        for imp in imports_of(path, package_of(name, path)):
            if imp.module == "toolrl" or imp.module.startswith("toolrl."):
                out.append((path.relative_to(ROOT).as_posix(), imp))
    return out


def layer_violations(rel_dir: str, allowed: tuple[str, ...],
                     forbidden_libraries: tuple[str, ...] = ()) -> list[str]:
    """Imports of ``toolrl/<rel_dir>/`` outside ``allowed`` toolrl packages, or of a forbidden
    third-party library."""
    bad = []
    for rel, imp in toolrl_imports(rel_dir):
        targets = [imp.module] if imp.module != "toolrl" else [f"toolrl.{n}" for n in imp.names]
        for target in targets:
            if not any(target == a or target.startswith(a + ".") for a in allowed):
                bad.append(f"{rel}:{imp.line} imports {target}")
    for path in source_files(f"toolrl/{rel_dir}"):
        for imp in imports_of(path, package_of(module_name(path), path)):
            if imp.module.split(".")[0] in forbidden_libraries:
                bad.append(f"{path.relative_to(ROOT).as_posix()}:{imp.line} imports {imp.module}")
    return bad


# --- Ray --------------------------------------------------------------------------------------
def ray_imports(path: Path) -> list[int]:
    """Line numbers of ``import ray[...]`` / ``from ray[...] import ...`` in a file."""
    return [imp.line for imp in imports_of(path, "x")
            if imp.module == "ray" or imp.module.startswith("ray.")]


def is_allowed(rel: str) -> bool:
    return any(rel.startswith(p) if p.endswith("/") else rel == p for p in ALLOWED_RAY_IMPORTERS)


def test_ray_is_imported_only_by_the_orchestration_layers():
    offenders = []
    for top in SOURCE_DIRS:
        for path in source_files(top):
            rel = path.relative_to(ROOT).as_posix()
            if not is_allowed(rel):
                offenders += [f"{rel}:{line}" for line in ray_imports(path)]
    assert not offenders, (f"Ray imported outside {ALLOWED_RAY_IMPORTERS}: {offenders}; keep "
                           f"Ray behind toolrl.controller and the worker modules")


def test_the_scanner_sees_every_import_form(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("import os\nimport ray\nimport ray.util as u\nfrom ray import remote\n"
                      "from ray.util import placement_group\nfrom . import ray\n"
                      "import raytracer\ndef f():\n    import ray.exceptions\n"
                      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from ..core import env\n")
    assert ray_imports(sample) == [2, 3, 4, 5, 9]
    relative = [i for i in imports_of(sample, "toolrl.rollout") if i.module.startswith("toolrl")]
    assert relative == [Import("toolrl.rollout", ("ray",), 6, False),
                        Import("toolrl.core", ("env",), 12, True)]
    assert is_allowed("toolrl/controller/worker_group.py")
    assert is_allowed("toolrl/rollout/worker.py") and not is_allowed("toolrl/rollout/engine.py")
    assert not is_allowed("toolrl/core/env.py")


# --- layers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("layer,allowed,libraries", [
    ("core", ("toolrl.core", "toolrl.registry"), ("ray", "torch", "tensordict", "vllm")),
    ("reward", ("toolrl.core", "toolrl.registry", "toolrl.reward"),
     ("ray", "torch", "tensordict", "vllm")),
    ("algo", ("toolrl.algo", "toolrl.registry"), ("ray", "tensordict", "vllm", "transformers")),
    ("controller", ("toolrl.controller", "toolrl.batch"), ("vllm", "transformers")),
    ("weights", ("toolrl.weights",), ("ray", "tensordict", "transformers")),
    ("rollout", ("toolrl.rollout", "toolrl.core", "toolrl.weights", "toolrl.controller",
                 "toolrl.batch", "toolrl.registry"), ()),
])
def test_each_layer_imports_only_what_it_may_know(layer, allowed, libraries):
    bad = layer_violations(layer, allowed, libraries)
    assert not bad, f"toolrl/{layer} may import only {allowed} of toolrl, none of {libraries}: " \
                    f"{bad}"


def top_level_imports(path: Path) -> list[str]:
    """Modules a file imports when it is imported (module level, ``TYPE_CHECKING`` aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.append(node.module or "")
    return out


def test_weights_imports_vllm_only_lazily():
    """vLLM's worker extension and the engine's routes call vLLM, but only inside functions:
    the trainer and the actors import ``toolrl.weights`` where no vLLM is installed."""
    bad = [f"{path.relative_to(ROOT).as_posix()} imports {m}"
           for path in source_files("toolrl/weights") for m in top_level_imports(path)
           if m.split(".")[0] == "vllm"]
    assert not bad, f"toolrl/weights imports vLLM at module level: {bad}"


def test_the_layer_check_catches_a_violation(tmp_path, monkeypatch):
    fake = tmp_path / "toolrl" / "algo"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("import torch\nfrom toolrl.workers.actor import ActorWorker\n"
                                 "from toolrl import batch\nimport tensordict\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert layer_violations("algo", ("toolrl.algo",), ("tensordict",)) == [
        "toolrl/algo/bad.py:2 imports toolrl.workers.actor",
        "toolrl/algo/bad.py:3 imports toolrl.batch", "toolrl/algo/bad.py:4 imports tensordict"]


# --- plugins use only the public API ------------------------------------------------------------
PLUGIN_TREES = {  # tree -> the package it may import freely (its own)
    "envs": "toolrl.envs", "rewards": "toolrl.rewards",
    "examples/custom_env/src": "toolrl_custom_env",
    "examples/custom_reward": "toolrl_custom_reward", "examples/two_stage_rollout": "two_stage",
    "examples/openai_agent": "calculator_agent",
    "examples/anthropic_agent": "calculator_agent",
    "examples/agents_sdk_agent": "calculator_agent",
}


def plugin_violations(tree: str, own: str) -> list[str]:
    bad = []
    public = set(toolrl.__all__)
    for path in sorted((ROOT / tree).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for imp in imports_of(path, own):
            if imp.module == "toolrl":
                bad += [f"{rel}:{imp.line} imports toolrl.{n} (not in toolrl.__all__)"
                        for n in imp.names if n not in public]
            elif imp.module.startswith("toolrl.") and not (
                    imp.module == own or imp.module.startswith(own + ".")):
                bad.append(f"{rel}:{imp.line} imports {imp.module}")
    return bad


@pytest.mark.parametrize("tree", sorted(PLUGIN_TREES))
def test_plugins_use_only_the_public_api(tree):
    bad = plugin_violations(tree, PLUGIN_TREES[tree])
    assert not bad, f"{tree} must import only from `toolrl` (as a third-party plugin): {bad}"


def test_the_public_api_resolves_every_name():
    lazy = {n for n in toolrl.__all__ if n not in ("Registry", "RegistryError", "__version__")}
    assert lazy == set(toolrl._lazy)  # one list of names, loaded lazily
    for name in toolrl.__all__:
        assert getattr(toolrl, name) is not None, name
    assert dir(toolrl) == sorted(toolrl.__all__)


# --- cycles and development tools ----------------------------------------------------------------
def import_graph() -> dict[str, set[str]]:
    """Module -> the toolrl modules it imports at run time (``TYPE_CHECKING`` blocks and the
    ``toolrl`` package facade excluded: product code imports the defining module)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges = set()
        for imp in imports_of(path, package_of(name, path)):
            if imp.type_checking:
                continue
            for target in [imp.module, *(f"{imp.module}.{n}" for n in imp.names)]:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target not in (name, "toolrl"):
                    edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_between_modules():
    found = cycles(import_graph())
    assert not found, f"import cycles (a module that needs one of its importers): {found}"
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_product_imports_no_development_tool():
    bad = [f"{m}:{imp.line}" for m, path in modules().items()
           for imp in imports_of(path, package_of(m, path)) if imp.module.split(".")[0] == "tools"]
    assert not bad and not (ROOT / "toolrl" / "testing").exists(), bad
