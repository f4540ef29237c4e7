"""One validation pass: every config mistake comes out of `load_config` as one `ConfigError` line
that names its key path, never as a bare ValueError of a component's ``__post_init__``.

Two guards: every field a section's ``__post_init__`` checks has a bad value below that must
come out keyed (file and overrides alike), so a new check without a case fails
`test_every_checked_field_has_a_bad_value_case`; and a section method other than
``__post_init__`` that raises (a check the pass would not run) must be one the pass reaches,
named in `REACHED_BY_THE_PASS`, or `test_no_section_check_outside_the_pass` fails.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from dataclasses import fields, is_dataclass

import pytest
from omegaconf import OmegaConf

from toolrl.trainer.config import ConfigError, ExperimentConfig, load_config, validate


def sections(cls: type = ExperimentConfig, path: str = "") -> dict[str, type]:
    """Key path -> dataclass of every section of the schema (``[]``: an item of a list or a
    dict of sections)."""
    out: dict[str, type] = {}
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        hint, key = hints[f.name], f"{path}{f.name}"
        if is_dataclass(hint):
            out[key] = hint
            out.update(sections(hint, f"{key}."))
            continue
        for arg in typing.get_args(hint):  # X | None, list[X], dict[str, X]
            if is_dataclass(arg):
                item = key if type(None) in typing.get_args(hint) else f"{key}[]"
                out[item] = arg
                out.update(sections(arg, f"{item}."))
    return out


def _methods(cls: type) -> dict[str, ast.AST]:
    """Name -> parsed source of the methods (and properties) ``cls`` and its toolrl bases
    define (dataclass-generated ones have no source and are skipped)."""
    out: dict[str, ast.AST] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("toolrl"):
            continue
        for name, fn in vars(klass).items():
            fn = fn.fget if isinstance(fn, property) else fn
            if not inspect.isfunction(fn) or fn.__code__.co_filename.startswith("<"):
                continue
            try:
                source = inspect.getsource(fn)
            except OSError:  # made by a decorator (functools.cache, dataclass) from no file
                continue
            out[f"{klass.__name__}.{name}"] = ast.parse(textwrap.dedent(source))
    return out


def _post_init_methods(cls: type) -> dict[str, ast.AST]:
    """The ``__post_init__``s of ``cls`` and its bases, and the methods they call
    (``self.resolved()``), transitively."""
    methods = _methods(cls)
    names = {q.rpartition(".")[2]: q for q in methods}
    todo = [q for q in methods if q.endswith(".__post_init__")]
    out: dict[str, ast.AST] = {}
    while todo:
        qualname = todo.pop()
        if qualname in out:
            continue
        out[qualname] = methods[qualname]
        todo += [names[node.attr] for node in ast.walk(methods[qualname])
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                 and node.value.id == "self" and node.attr in names]
    return out


def checked_fields(cls: type) -> set[str]:
    """Fields a ``__post_init__`` of ``cls`` (or of a base, or a method they call) reads:
    ``self.x`` or ``"x"``."""
    names = {f.name for f in fields(cls)}
    out: set[str] = set()
    for tree in _post_init_methods(cls).values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id == "self" and node.attr in names:
                out.add(node.attr)
            elif isinstance(node, ast.Constant) and node.value in names:
                out.add(node.value)
    return out


# key -> (a bad value, the other overrides it needs). Each must come out of load_config as a
# ConfigError whose one line names the key.
BAD: dict[str, tuple[str, tuple[str, ...]]] = {
    "rollout.concurrency": ("0", ()),
    "rollout.top_p": ("0", ()),
    "rollout.top_k": ("-2", ()),
    "rollout.val_temperature": ("-1", ()),
    "rollout.max_prompt_tokens": ("0", ()),
    "rollout.max_total_tokens": ("100000", ()),
    "rollout.agent": ("my.agent:run", ("rollout.runner=my.runner:Run",)),
    "rollout.runner": ("my.runner:Run", ("rollout.agent=my.agent:run",)),
    "rollout.agent_timeout_s": ("0", ()),
    "rollout.agent_client": ("cohere", ()),
    "rollout.history_policy": ("forget", ()),
    "rollout.family": ("no-such-family", ()),
    "rollout.env_timeout_s": ("0", ()),  # EpisodeConfig's, derived in the workers
    "rollout.engine.backend": ("tpu", ()),
    "rollout.engine.max_model_len": ("1", ()),
    "rollout.engine.kv_cache_gib": ("0", ()),
    "rollout.engine.weight_bucket_mb": ("0", ()),
    "rollout.engine.weight_transfer": ("rdma", ()),
    "rollout.engine.sleep_level": ("3", ()),
    "rollout.engine.max_lora_rank": ("3", ()),
    "rollout.engine.cpu_threads": ("0", ()),
    "rollout.engine.tensor_parallel_size": ("2", ()),
    "rollout.engine.logprobs_mode": ("raw_logits", ()),
    **{f"{m}.{k}": v for m in ("actor", "critic") for k, v in {
        "dtype": ("fp12", ()),
        "param_dtype": ("fp12", ()),
        "reduce_dtype": ("fp12", ()),
        "lr_schedule": ("linear", ()),
        "warmup_steps": ("-1", ()),
        "lr": ("-1", ()),
        "min_lr_ratio": ("2", ()),
        "total_steps": ("-1", ()),
        "updates_per_step": ("-1", ()),
        "ppo_epochs": ("0", ()),
        "ppo_mini_batch_size": ("0", ()),
        "micro_batch_size": ("0", ()),
        "max_tokens_per_micro_batch": ("0", ()),
        "log_prob_micro_batch_size": ("0", ()),
    }.items()},
    "actor.temperature": ("0", ()),
    "actor.logits_chunk_size": ("0", ()),
    "critic.loss_agg_mode": ("sum", ()),
    "actor.loss.loss_agg_mode": ("sum", ()),
    "actor.loss.kl_loss_kind": ("k9", ()),
    "actor.loss.clip_ratio_low": ("2", ()),
    "actor.loss.clip_ratio_high": ("-1", ()),
    "actor.loss.clip_ratio_c": ("0.5", ()),
    "actor.loss.corrections": ("[{name: tis, cap: -1}]", ()),
    "actor.loss.entropy_coeff": ("nan", ()),
    "actor.loss.kl_loss_coef": ("-1", ()),
    "actor.loss.log_ratio_clamp": ("0", ()),
    "actor.loss.policy_loss": ("''", ()),
    "actor.lora.rank": ("-1", ()),
    "actor.lora.sync": ("push", ()),
    "actor.lora.alpha": ("0", ("actor.lora.rank=8",)),
    "actor.lora.dropout": ("1", ("actor.lora.rank=8",)),
    "actor.lora.target_modules": ("[]", ("actor.lora.rank=8",)),
    "reward.rewards": ("[]", ()),
    "reward.scale": ("nan", ()),
    "reward.clip": ("[2, 1]", ()),
    "reward.fallback": ("inf", ()),
    "reward.pool_workers": ("0", ()),
    "reward.max_concurrency": ("0", ()),
    **{f"trainer.health.{k}": ("2", ()) for k in (
        "max_error_fraction", "max_no_token_fraction", "max_context_fraction",
        "max_reward_error_fraction")},
}

NOT_A_CHECK = {
    "rollout.engine": "read by max_total_tokens' check (a case above)",
    "rollout.engine.model": "str() of it; filled by the trainer (FILLED_BY_TRAINER)",
    "actor.lora": "a mapping made a LoraConfig (its own fields are checked)",
    "actor.loss": "a mapping made a PolicyLossConfig (its own fields are checked)",
}

REACHED_BY_THE_PASS = {
    "RewardSection.resolved": "RewardSection.__post_init__ runs it (the rules of a reward set)",
    "LoraConfig.engine_rank": "LoraConfig.__post_init__ reads it (actor.lora.sync=adapter) "
                              "and the pass builds the rollout config the trainer fills with it",
}


def test_every_checked_field_has_a_bad_value_case():
    """A check belongs to its class: a section that sits at several paths (``reward`` and
    each ``env_rewards`` entry) needs its cases at one of them."""
    paths = sections()
    covered = {(paths[key.rpartition(".")[0]], key.rpartition(".")[2])
               for key in (*BAD, *NOT_A_CHECK)}
    checked = {(cls, name): f"{path}.{name}" for path, cls in paths.items()
               for name in checked_fields(cls)}
    missing = sorted(key for owner, key in checked.items() if owner not in covered)
    assert not missing, f"fields a __post_init__ checks with no case in BAD: {missing}"
    assert len(checked) > 60  # the walk found the sections' checks


DERIVED_BUILT_BY_THE_PASS = {
    "RolloutConfig.episode_config -> EpisodeConfig":
        "config._check_filled builds worker_rollout_config(cfg).episode_config()",
}


def test_every_config_a_section_derives_is_built_by_the_pass():
    """A section method that constructs another checked config (a dataclass with a
    ``__post_init__``, e.g. the episode loop's EpisodeConfig) moves checks into the workers
    unless the pass builds it too (`DERIVED_BUILT_BY_THE_PASS`)."""
    schema = set(sections().values())
    derived = set()
    for cls in schema:
        for qualname, tree in _methods(cls).items():
            owner = next(k for k in cls.__mro__ if k.__name__ == qualname.split(".")[0])
            names = vars(inspect.getmodule(owner))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    made = names.get(node.func.id)
                    if is_dataclass(made) and made not in schema and \
                            "__post_init__" in vars(made):
                        derived.add(f"{qualname} -> {made.__name__}")
    assert derived == set(DERIVED_BUILT_BY_THE_PASS), derived


def test_a_value_the_trainer_fills_names_where_it_came_from():
    with pytest.raises(ConfigError, match=r"^actor\.temperature \(set by the trainer from "
                                          r"rollout\.temperature\): must be > 0"):
        load_config(None, ["rollout.temperature=-1"])


def test_no_section_check_outside_the_pass():
    raising = {qualname for cls in set(sections().values())
               for qualname, tree in _methods(cls).items()
               if qualname not in _post_init_methods(cls)
               and any(isinstance(node, ast.Raise) for node in ast.walk(tree))}
    outside = sorted(raising - set(REACHED_BY_THE_PASS))
    assert not outside, f"section methods that raise outside the validation pass: {outside}"


def _assert_keyed(info: pytest.ExceptionInfo, key: str) -> None:
    text = str(info.value)
    assert "\n" not in text, text
    assert text.startswith(key) or any(f"{key}{end}" in text for end in "=: ") or \
        f"{key!r}" in text or f'"{key}"' in text, f"{key}: {text}"


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_bad_value_is_one_keyed_config_error_from_overrides(key):
    value, others = BAD[key]
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{key}={value}", *others])
    _assert_keyed(info, key)


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_bad_value_is_one_keyed_config_error_from_a_file(key, tmp_path):
    value, others = BAD[key]
    path = tmp_path / "bad.yaml"
    OmegaConf.save(OmegaConf.from_dotlist([f"{key}={value}", *others]), path)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    _assert_keyed(info, key)


def test_a_section_check_reads_as_key_colon_problem():
    with pytest.raises(ConfigError, match=r"^rollout\.concurrency: must be >= 1, got 0$"):
        load_config(None, ["rollout.concurrency=0"])
    with pytest.raises(ConfigError, match=r"^actor\.loss\.corrections\[0\]: correction 'tis': "
                                          r"cap must be > 0"):
        load_config(None, ["actor.loss.corrections=[{name: tis, cap: -1}]"])


def test_validate_checks_the_configs_the_trainer_fills(monkeypatch):
    """The rollout and actor configs as the workers get them are built in the pass: their
    checks with the values the trainer fills come out keyed there, not in a worker."""
    from toolrl.trainer import config

    def refuse(cfg, model=None):
        raise ValueError("max_lora_rank must be 0 or one of vLLM's [8, 16], got 3")

    cfg = load_config(None)
    monkeypatch.setattr(config, "worker_rollout_config", refuse)
    with pytest.raises(ConfigError, match=r"^rollout: max_lora_rank must be 0"):
        validate(cfg)


# a reward set's component (an item of a list, in a mapping of sets) -> the key path named
REWARD_ENTRIES = {
    "reward.rewards=[{name: success}, {name: format, weight: x}]": "reward.rewards[1].weight",
    "reward.rewards=[{name: success}, {name: format, wieght: 1}]": "reward.rewards[1].wieght",
    "reward.rewards=[{name: success}, {name: success}]": "reward.rewards[1]",
    "reward.rewards=[{name: success, weight: nan}]": "reward.rewards[0].weight",
    "reward.rewards=[{name: success, timeout: 0}]": "reward.rewards[0].timeout",
    "reward.rewards=[{name: ''}]": "reward.rewards[0].name",
    "reward.rewards=[{name: success, alias: total}]": "reward.rewards[0].alias",
    "reward.rewards=[{name: success, gate: {above: 1}}]": "reward.rewards[0].gate.reward",
    "reward.rewards=[{name: success, gate: {reward: success}}]": "reward.rewards[0].gate.reward",
    "env_rewards={toolrl/Bank-v0: {rewards: [{name: success, pool: maybe}]}}":
        "env_rewards['toolrl/Bank-v0'].rewards[0].pool",
    "env_rewards={toolrl/Bank-v0: {scale: 2}}": "env_rewards['toolrl/Bank-v0'].rewards",
}


@pytest.mark.parametrize("override", sorted(REWARD_ENTRIES))
def test_a_reward_entry_mistake_names_its_place(override, tmp_path):
    key = REWARD_ENTRIES[override]
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    _assert_keyed(info, key)
    path = tmp_path / "bad.yaml"
    OmegaConf.save(OmegaConf.from_dotlist([override]), path)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    _assert_keyed(info, key)


def test_the_model_path_is_resolved_in_one_place():
    """`resolve_model` is the one caller of `require_model` that reads the config; the others
    resolve a command-line flag (``--model``, ``--tokenizer``), not a config key."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "toolrl"
    flags = {"toolrl/cli.py", "toolrl/commands/models.py", "toolrl/trainer/evaluate.py"}
    callers = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for call in ast.walk(node):
                    if isinstance(call, ast.Call) and getattr(call.func, "id", None) == \
                            "require_model":
                        callers.add(f"{path.relative_to(root.parent).as_posix()}:{node.name}")
    ours = {c for c in callers if c.split(":")[0] not in flags}
    assert ours == {"toolrl/trainer/config.py:resolve_model"}, ours


def test_validate_checks_local_model_paths_and_asks_no_hub(tmp_path, monkeypatch):
    from toolrl.models import source

    monkeypatch.setattr(source, "hub_reachable", lambda: pytest.fail("asked the hub"))
    with pytest.raises(ConfigError, match=r"^model\.path='\./no-such' does not exist"):
        load_config(None, ["model.path=./no-such"])
    with pytest.raises(ConfigError, match=r"^rollout\.engine\.tokenizer='\./nope' does not"):
        load_config(None, ["rollout.engine.tokenizer=./nope"])
    cfg = load_config(None, ["model.path=some-org/some-model"])  # a hub id: pre-flight's
    assert cfg.model.build_tiny_if_missing is False


def test_a_reward_set_built_in_python_is_typed_by_validate():
    from toolrl.reward import RewardSection

    cfg = ExperimentConfig(reward=["success", {"name": "format", "weight": 0.1}])
    validate(cfg)
    assert isinstance(cfg.reward, RewardSection) and cfg.reward.rewards[1].weight == 0.1
    bad = {"reward": {"rewards": [{"name": "success"}, {"name": "format", "weight": "x"}]}}
    with pytest.raises(ConfigError, match=r"^reward\.rewards\[1\]\.weight must be a finite"):
        validate(ExperimentConfig(**bad))
    with pytest.raises(ConfigError, match=r"^reward: unknown key\(s\) 'scal'"):
        validate(ExperimentConfig(reward={"rewards": ["success"], "scal": 1}))


def test_preflight_does_not_check_the_schema_again():
    """Pre-flight checks what only code, files and the machine can tell: it neither re-runs
    the reward set's rules nor resolves a model path by itself."""
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / "toolrl" / "trainer" /
              "preflight.py").read_text(encoding="utf-8")
    for name in ("RewardConfig", "from_config", "resolved(", "require_model", "locate_model",
                 "validate("):
        assert name not in source, name


def test_an_override_into_a_list_item_is_applied_or_one_keyed_error():
    """``reward.rewards.0.weight=2`` (or ``[0]``) sets that item's key; as a dotlist layer it
    was a mapping merged onto the list ('Cannot merge incompatible container types')."""
    quickstart = "configs/quickstart.yaml"
    for key in ("reward.rewards.0.weight", "reward.rewards[0].weight"):
        assert load_config(quickstart, [f"{key}=0.5"]).reward.rewards[0].weight == 0.5
    bad = {"reward.rewards.0.weight=x": r"^reward\.rewards\.0\.weight='x': .*Float",
           "reward.rewards.0.nme=1": r"^reward\.rewards\.0\.nme='1': .*'nme'",
           "reward.rewards.3.weight=1": r"^reward\.rewards\.3\.weight='1': reward\.rewards has "
                                        r"1 entry \(set the whole list to add one\)$"}
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message) as info:
            load_config(quickstart, [override])
        assert "\n" not in str(info.value)
