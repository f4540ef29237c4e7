"""The generic Registry: decorator, lookup, duplicates, unknown names, entry points."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest

from toolrl.registry import PluginImportError, Registry, RegistryError


def test_decorator_and_lookup():
    reg: Registry = Registry("widget")

    @reg.register("double")
    def double(x):
        return 2 * x

    assert reg.get("double") is double
    assert "double" in reg
    assert reg.names() == ["double"]
    reg.register("triple", lambda x: 3 * x)
    assert reg.get("triple")(2) == 6


def test_duplicate_name_is_an_error():
    reg: Registry = Registry("widget")
    reg.register("a", len)
    reg.register("a", len)  # the same object again is harmless
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("a", abs)


def test_unknown_name_lists_known_names():
    reg: Registry = Registry("widget")
    reg.register("alpha", len)
    reg.register("beta", abs)
    with pytest.raises(RegistryError, match=r"unknown widget 'gamma'.*alpha, beta"):
        reg.get("gamma")


def test_bad_names_are_rejected():
    reg: Registry = Registry("widget")
    with pytest.raises(RegistryError):
        reg.register("", len)


class _FakeDist:
    name = "fake-plugin-dist"


def _entry_point(name: str, value: str, group: str) -> metadata.EntryPoint:
    ep = metadata.EntryPoint(name=name, value=value, group=group)
    ep._for(_FakeDist())  # type: ignore[attr-defined]
    return ep


def test_entry_point_discovery_is_lazy(monkeypatch, tmp_path):
    mod = tmp_path / "toolrl_test_plugin_ok.py"
    mod.write_text("def scorer(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [_entry_point("plus_one", "toolrl_test_plugin_ok:scorer", "toolrl.test")]
    calls = []

    def fake_entry_points(group):
        calls.append(group)
        return eps if group == "toolrl.test" else []

    monkeypatch.setattr(metadata, "entry_points", fake_entry_points)
    reg: Registry = Registry("scorer", group="toolrl.test")
    reg.register("local", len)
    assert reg.get("local") is len
    assert calls == []  # a hit never scans entry points
    assert reg.get("plus_one")(1) == 2
    assert calls == ["toolrl.test"]
    reg.get("plus_one")
    assert calls == ["toolrl.test"]  # scanned once


def test_failing_plugin_reraises_with_its_name(monkeypatch, tmp_path):
    mod = tmp_path / "toolrl_test_plugin_bad.py"
    mod.write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [_entry_point("broken", "toolrl_test_plugin_bad:thing", "toolrl.test2")]
    monkeypatch.setattr(metadata, "entry_points", lambda group: eps)
    reg: Registry = Registry("scorer", group="toolrl.test2")
    with pytest.raises(PluginImportError, match=r"'broken'.*fake-plugin-dist.*boom at import"):
        reg.get("broken")
    sys.modules.pop("toolrl_test_plugin_bad", None)


def test_module_entry_point_registers_by_import(monkeypatch, tmp_path):
    reg: Registry = Registry("scorer", group="toolrl.test3")
    monkeypatch.setitem(sys.modules, "toolrl_test_registry_target", type(sys)("t"))
    sys.modules["toolrl_test_registry_target"].REG = reg
    mod = tmp_path / "toolrl_test_plugin_mod.py"
    mod.write_text("import toolrl_test_registry_target as t\nt.REG.register('from_module', len)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [_entry_point("pkg", "toolrl_test_plugin_mod", "toolrl.test3")]
    monkeypatch.setattr(metadata, "entry_points", lambda group: eps)
    assert reg.get("from_module") is len
    assert "pkg" not in reg.names()  # the module itself is not an item
    sys.modules.pop("toolrl_test_plugin_mod", None)


def test_a_broken_plugin_fails_alone(monkeypatch, tmp_path):
    """One plugin raising at import: the others still load, the broken one is named with its
    error by `failures`, by a lookup of its own name and by an unknown name's error."""
    (tmp_path / "toolrl_test_plugin_broken.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "toolrl_test_plugin_fine.py").write_text("def scorer(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [_entry_point("broken", "toolrl_test_plugin_broken:thing", "toolrl.test4"),
           _entry_point("fine", "toolrl_test_plugin_fine:scorer", "toolrl.test4")]
    monkeypatch.setattr(metadata, "entry_points", lambda group: eps)
    reg: Registry = Registry("scorer", group="toolrl.test4")
    assert reg.names() == ["fine"] and reg.get("fine")(3) == 3
    (message,) = reg.failures().values()
    assert "'broken'" in message and "fake-plugin-dist" in message
    assert "ModuleNotFoundError: No module named 'no_such_dependency_xyz'" in message
    with pytest.raises(PluginImportError, match="no_such_dependency_xyz"):
        reg.get("broken")
    with pytest.raises(RegistryError, match=r"unknown scorer 'other'.*fine.*failed to import"):
        reg.get("other")
    sys.modules.pop("toolrl_test_plugin_fine", None)
