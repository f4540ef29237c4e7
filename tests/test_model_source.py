"""One rule tells a local model folder from a hub id (`toolrl.models.source`), side by side on
the cases a user writes, and a hub id that cannot be had fails at once without asking the hub."""

from __future__ import annotations

import pytest

from toolrl.models import source
from toolrl.models.source import ModelNotFoundError, locate_model, require_model


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A fresh working tree (no models/), the hub offline, an empty hub cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "cache"))
    source.hub_reachable.cache_clear()
    yield tmp_path
    source.hub_reachable.cache_clear()


def test_the_rule_side_by_side(tree):
    assert locate_model("models/tiny").kind == "hub"  # fresh tree: could be a hub id ...
    assert locate_model("models/tiny", build_if_missing=True).kind == "build"  # ... unless built
    assert locate_model("./models/tiny").kind == "local"
    assert locate_model(str(tree / "models" / "tiny")).kind == "local"
    assert locate_model("~/no/such/model").kind == "local"
    assert locate_model("a/b/c").kind == "local"
    assert locate_model("Qwen/Qwen2.5-0.5B").kind == "hub"
    assert locate_model("gpt2").kind == "hub"
    (tree / "Qwen").mkdir()  # a local folder claims the org part
    assert locate_model("Qwen/Qwen2.5-0.5B").kind == "local"
    (tree / "models" / "tiny").mkdir(parents=True)
    assert locate_model("models/tiny").kind == "local"
    assert locate_model("models/tiny", build_if_missing=True).kind == "local"  # exists: kept


def test_missing_local_and_unreachable_hub_are_one_line(tree):
    with pytest.raises(ModelNotFoundError, match=r"model\.path='\./models/tiny' does not "
                       r"exist as a local folder.*build_tiny_if_missing=true"):
        require_model("./models/tiny")
    with pytest.raises(ModelNotFoundError) as info:
        require_model("nobody/no-such-model")
    text = str(info.value)
    assert "\n" not in text and "model.path='nobody/no-such-model'" in text
    assert "HF_HUB_OFFLINE is set" in text
    with pytest.raises(ModelNotFoundError, match=r"^--model="):
        require_model("nobody/no-such-model", key="--model")
    assert require_model("models/tiny", build_if_missing=True) == "models/tiny"


def test_a_cached_hub_id_resolves_to_its_snapshot_offline(tree):
    snapshot = tree / "cache" / "models--org--model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tree / "cache" / "models--org--model" / "refs").mkdir()
    (tree / "cache" / "models--org--model" / "refs" / "main").write_text("abc123")
    assert require_model("org/model") == str(snapshot)


def test_hub_reachable_asks_once_and_only_when_online(tree, monkeypatch):
    calls = []

    def head(url, timeout):
        calls.append((url, timeout))
        raise __import__("httpx").ConnectError("unreachable")

    monkeypatch.setattr("httpx.head", head)
    assert not source.hub_reachable() and calls == []  # offline: nothing is asked
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    source.hub_reachable.cache_clear()
    assert not source.hub_reachable() and not source.hub_reachable()
    assert len(calls) == 1 and calls[0][1] == source.HUB_TIMEOUT_S
    with pytest.raises(ModelNotFoundError, match="no answer within 3 s"):
        require_model("nobody/no-such-model")


def test_the_default_model_is_built_and_a_hub_id_is_not(tree):
    """A config without a model section builds toolrl's tiny model at models/tiny (a fresh
    tree has no models/); a hub id, or another path, is never built unless asked."""
    from toolrl.trainer.config import load_config

    assert load_config(None).model.build_tiny_if_missing is True
    assert load_config(None, ["model.path=Qwen/Qwen2.5-0.5B"]).model.build_tiny_if_missing \
        is False
    assert load_config(None, ["model.path=Qwen/Qwen2.5-0.5B",
                              "model.build_tiny_if_missing=true"]).model.build_tiny_if_missing


@pytest.mark.parametrize("config", ["quickstart.yaml", "quickstart_async.yaml",
                                    "quickstart_pipeline.yaml", "tau2_airline.yaml",
                                    "function_calling_mixed.yaml", "ppo_calculator.yaml"])
def test_a_shipped_config_builds_only_its_own_tiny_model(tree, config):
    """Overriding model.path on a shipped tiny-model config loads that path: a hub id stays a
    hub id and a missing folder is an error, never a random model built in its place."""
    from pathlib import Path

    from toolrl.trainer.config import ConfigError, load_config

    shipped = Path(__file__).resolve().parents[1] / "configs" / config
    assert load_config(shipped).model.build_tiny_if_missing is True
    hub = load_config(shipped, ["model.path=acme/no-such-model"]).model
    assert locate_model(hub.path, hub.build_tiny_if_missing).kind == "hub"
    with pytest.raises(ConfigError, match=r"model\.path='\./nothere' does not exist"):
        load_config(shipped, ["model.path=./nothere"])
    assert not (tree / "nothere").exists() and not (tree / "acme").exists()
