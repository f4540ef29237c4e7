"""Find test files and the number of devices each one declares, by reading their source.

A file declares its need in either (or both) of two ways; the file needs the largest number
it declares anywhere, since the scheduler runs a whole file on one set of devices::

    DEVICES = 2                          # module level

    pytestmark = pytest.mark.devices(2)  # or on a class, a function, or a pytest.param

The source is parsed with `ast`, never imported, so collecting a whole suite takes
milliseconds and a file that fails to import still gets scheduled (and fails in its own run).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DEVICES_VARIABLE = "DEVICES"
MARKER = "devices"
SKIP_DIRS = frozenset({".git", ".venv", "venv", "__pycache__", "node_modules", ".tox", "build"})


class CollectError(ValueError):
    """A test path is missing or a device declaration cannot be read."""


@dataclass(frozen=True)
class TestFile:
    """One test file and the number of devices it needs."""

    __test__ = False  # not a pytest class, despite the name

    path: Path
    devices: int
    declared: bool  # False when the default need was used


def _int_literal(node: ast.expr, where: str) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
        return node.value
    raise CollectError(f"{where}: the device count must be a non-negative integer literal, "
                       f"got {ast.unparse(node)!r}")


def _is_devices_marker(func: ast.expr) -> bool:
    """``pytest.mark.devices`` or ``mark.devices`` (after ``from pytest import mark``)."""
    if not (isinstance(func, ast.Attribute) and func.attr == MARKER):
        return False
    owner = func.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "mark") or (
        isinstance(owner, ast.Name) and owner.id == "mark")


def declared_devices(path: Path) -> int | None:
    """The largest device count ``path`` declares, or None when it declares none.

    Raises:
        CollectError: a declaration whose count is not a non-negative int literal.
        SyntaxError: the file does not parse.
    """
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    counts: list[int] = []
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if value is not None and any(isinstance(t, ast.Name) and t.id == DEVICES_VARIABLE
                                     for t in targets):
            counts.append(_int_literal(value, f"{path}:{node.lineno} {DEVICES_VARIABLE}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_devices_marker(node.func):
            where = f"{path}:{node.lineno} @pytest.mark.{MARKER}"
            if len(node.args) != 1 or node.keywords:
                raise CollectError(f"{where}: takes exactly one argument, the device count")
            counts.append(_int_literal(node.args[0], where))
    return max(counts) if counts else None


def _is_test_file(path: Path) -> bool:
    name = path.name
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def find_test_files(paths: Iterable[str | Path]) -> list[Path]:
    """Test files under ``paths`` (files are taken as given), sorted, without duplicates."""
    found: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found[path] = None
        elif path.is_dir():
            for candidate in sorted(path.rglob("*.py")):
                rel_parts = candidate.relative_to(path).parts[:-1]
                if _is_test_file(candidate) and not any(
                        p in SKIP_DIRS or p.startswith(".") for p in rel_parts):
                    found[candidate] = None
        else:
            raise CollectError(f"no such test file or directory: {raw}")
    return list(found)


def collect(paths: Iterable[str | Path], default_devices: int = 1) -> list[TestFile]:
    """Every test file under ``paths`` with its declared need (``default_devices`` if none).

    A file that does not parse keeps the default: its own pytest run reports the error.
    """
    if default_devices < 0:
        raise CollectError(f"default_devices must be >= 0, got {default_devices}")
    files = []
    for path in find_test_files(paths):
        try:
            need = declared_devices(path)
        except SyntaxError:
            need = None
        files.append(TestFile(path, default_devices if need is None else need, need is not None))
    return files
