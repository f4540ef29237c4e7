"""The documentation site stays true to the code.

- The strict build passes: a broken link, a missing anchor or page, an API reference that does
  not resolve, or any other MkDocs warning fails it.
- The config reference, generated from the schema at build time, has every key of the schema
  (as OmegaConf sees it: an independent walk) and no other, each with a description; a
  hand-written page that names a config key (in prose, in a ``key=value`` override, in a YAML
  experiment config) names one the schema has, and a ``toolrl COMMAND`` one the parser has.
- Code blocks run. Every ``python`` and ``bash`` block of every page runs in a test, in a fresh
  directory, unless the line above it is ``<!-- not run: why -->``; the blocks of the own-env
  guide's end-to-end section run in order, as one user session (files, package, commands);
  YAML experiment configs load; the own-format JSON example is the one its test trains on.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from toolrl.trainer.config import ExperimentConfig, load_config
from tools.docs import cli_reference, config_reference

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = {"reference/config.md", "reference/cli.md", "benchmarks/results.md",
             "benchmarks/gpu-check.md"}  # tools/docs/hooks.py; not in docs/
OWN_ENV = DOCS / "guides" / "own-env.md"
OWN_ENV_SECTION = "## Your own environment, end to end"
DIST = "weather-env"  # the package the own-env guide installs
RUNNABLE = {"python", "bash", "sh", "shell"}
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")


# -- reading pages -----------------------------------------------------------------------------

class Block(NamedTuple):
    page: str  # relative to docs/
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason given above it
    section: str  # the enclosing "## " heading ("" before the first)


def blocks(text: str, page: str = "") -> list[Block]:
    """Fenced blocks of a page (```` ``` ```` or longer fences; a block inside a longer fence is
    part of that block's text)."""
    out, lines, section, i = [], text.splitlines(), "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line
        fence = re.match(r"^(`{3,})(\w*)", line)
        if not fence:
            i += 1
            continue
        ticks, lang = fence.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks), None)
        assert end is not None, f"{page}:{i + 1}: unclosed code fence"
        above = NOT_RUN.match(lines[i - 1].strip()) if i else None
        out.append(Block(page, i + 1, lang, "\n".join(lines[i + 1:end]) + "\n",
                         above.group(1) if above else None, section))
        i = end + 1
    return out


def pages() -> dict[str, str]:
    """Hand-written pages: relative path -> text."""
    return {str(p.relative_to(DOCS)): p.read_text(encoding="utf-8")
            for p in sorted(DOCS.rglob("*.md"))}


def prose(text: str) -> str:
    """A page without its fenced blocks."""
    kept, inside = [], None
    for line in text.splitlines():
        fence = re.match(r"^(`{3,})", line)
        if inside is None and fence:
            inside = fence.group(1)
        elif inside is not None and line.strip() == inside:
            inside = None
        elif inside is None:
            kept.append(line)
    return "\n".join(kept)


def test_blocks_are_found():
    text = ("## A\n```python\nx = 1\n```\n<!-- not run: slow -->\n```bash\nls\n```\n"
            "````markdown\n```bash\nrm -rf /\n```\n````\n")
    found = blocks(text)
    assert [(b.lang, b.code, b.not_run, b.section) for b in found] == [
        ("python", "x = 1\n", None, "## A"), ("bash", "ls\n", "slow", "## A"),
        ("markdown", "```bash\nrm -rf /\n```\n", None, "## A")]
    assert prose(text) == "## A\n<!-- not run: slow -->"


# -- the build ---------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_strict_build(tmp_path):
    """`make docs` as CI runs it: any warning (a broken link or anchor, an API object that
    does not resolve, a page outside the nav) fails it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    site = tmp_path / "site"
    config = (site / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    assert 'id="trainer.mode"' in config and 'id="rollout.engine.sleep_level"' in config
    assert (site / "reference" / "cli" / "index.html").exists()
    assert (site / "benchmarks" / "plots" / "trl_step.png").exists()
    assert "ToolEnv" in (site / "reference" / "api" / "envs" / "index.html").read_text()


# -- the config reference ----------------------------------------------------------------------

def omegaconf_keys() -> tuple[set[str], set[str]]:
    """Every key of the schema as OmegaConf builds it (``[i]`` for a list of configs), and the
    keys whose value is an open mapping (any sub-key)."""
    keys: set[str] = set()
    open_maps: set[str] = set()

    def walk(prefix: str, node: Any) -> None:
        for name in node:
            key = f"{prefix}.{name}" if prefix else name
            keys.add(key)
            child = node._get_node(name)
            if isinstance(child, DictConfig):
                if dataclasses.is_dataclass(child._metadata.object_type):
                    walk(key, child)
                else:
                    open_maps.add(key)
            elif isinstance(child, ListConfig) and \
                    dataclasses.is_dataclass(child._metadata.element_type):
                item = OmegaConf.structured(config_reference._construct(
                    child._metadata.element_type))
                keys.add(key + "[i]")
                walk(key + "[i]", item)

    walk("", OmegaConf.structured(ExperimentConfig))
    return keys, open_maps


SCHEMA_KEYS, OPEN_MAPS = omegaconf_keys()


def referenced_keys(markdown: str) -> set[str]:
    """The keys a rendered reference page documents (its rows' ids and key cells)."""
    ids = re.findall(r'^\| <span id="([^"]+)"></span>`([^`]+)`', markdown, re.MULTILINE)
    for anchor_id, key in ids:
        assert anchor_id == config_reference.anchor(key)
    return {key for _, key in ids}


def test_reference_has_every_schema_key_and_no_other():
    documented = referenced_keys(config_reference.render())
    list_sections = {k.removesuffix("[i]") for k in SCHEMA_KEYS if k.endswith("[i]")}
    assert documented == SCHEMA_KEYS - {k + "[i]" for k in list_sections}


def test_every_key_says_what_it_does():
    undocumented = [k.key for k in config_reference.schema_keys() if not k.doc.strip()]
    assert not undocumented, (
        f"config keys without a description: {undocumented}; document each where it is "
        "declared (a comment on or above the field, or an entry in the class docstring)")


def test_reference_check_can_fail():
    """The comparison sees a key missing from the page, and one the schema lacks."""
    page = config_reference.render()
    assert "trainer.mode" in referenced_keys(page)
    row = next(line for line in page.splitlines() if '<span id="trainer.mode">' in line)
    assert "trainer.mode" not in referenced_keys(page.replace(row, ""))
    stale = row.replace("trainer.mode", "trainer.moed")
    assert "trainer.moed" in referenced_keys(page + "\n" + stale) - SCHEMA_KEYS


@dataclasses.dataclass
class _Documented:
    """A test class.

    Attributes:
        a / b: the first two.
        c: the third; d: the fourth.
    """

    a: int = 0
    b: int = 0
    c: int = 0
    d: int = 0
    e: int = 0  # the fifth
    # the sixth,
    # in two lines
    f: int = 0
    g: int = 0


def test_field_docs_reads_docstrings_and_comments():
    docs = config_reference.field_docs(_Documented)
    assert docs == {"a": "the first two.", "b": "the first two.", "c": "the third",
                    "d": "the fourth.", "e": "the fifth", "f": "the sixth, in two lines",
                    "g": ""}


# -- what hand-written pages name --------------------------------------------------------------

SECTIONS = sorted({k.split(".")[0] for k in SCHEMA_KEYS if "." in k})
KEY = rf"(?:{'|'.join(SECTIONS)})(?:\.[A-Za-z_][A-Za-z0-9_]*|\[i\])+"


def unknown_key(key: str) -> str | None:
    """None when ``key`` is a schema key (or a sub-key of an open mapping), else the reason."""
    from toolrl.reward.compose import _COMPONENT_KEYS, _GATE_KEYS, _TOP_KEYS

    if key in SCHEMA_KEYS:
        return None
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in SCHEMA_KEYS:
            if prefix not in OPEN_MAPS:
                return f"{parts[n]!r} is no key of {prefix}"
            if prefix == "reward" and parts[n] not in (*_TOP_KEYS, *_COMPONENT_KEYS,
                                                       *_GATE_KEYS):
                return f"{parts[n]!r} is no key of a reward set"
            return None
    return "no such section"


def named_keys(page: str, text: str) -> list[tuple[str, str]]:
    """(key, where) for every config key a page names: inline code spans that are a key (or
    ``key=value``), and ``key=value`` overrides in its shell blocks."""
    found = [(m.group(1), f"{page}: `{m.group(0)}`")
             for m in re.finditer(rf"`({KEY})(?:=[^`]*)?`", prose(text))]
    for block in blocks(text, page):
        if block.lang in RUNNABLE | {"console", "text", ""}:
            found += [(m.group(1), f"{page}:{block.line}: {m.group(0)}")
                      for m in re.finditer(rf"(?<![\w./-])'?({KEY})=", block.code)]
    return found


def test_key_check_can_fail():
    assert unknown_key("trainer.mode") is None and unknown_key("env.kwargs.session") is None
    assert unknown_key("data.mixture[i].env") is None
    assert unknown_key("trainer.moed") and unknown_key("reward.scael")
    assert unknown_key("trainer.health.on_unhealthy.x")
    text = "`trainer.moed=1` and `env.reset(seed=0)`\n```bash\ntoolrl train actor.lrr=1\n```\n"
    assert [k for k, _ in named_keys("p", text)] == ["trainer.moed", "actor.lrr"]


def test_pages_name_only_schema_keys():
    bad = [f"{where}: {why}" for page, text in pages().items()
           for key, where in named_keys(page, text) if (why := unknown_key(key))]
    assert not bad, "pages name config keys the schema lacks:\n" + "\n".join(bad)


def test_pages_name_only_real_commands():
    commands = {c.name.split()[1] for c in cli_reference.commands()}
    pattern = re.compile(r"(?:^|[\s;&|(]|\$ )toolrl ([a-z][a-z-]+)", re.MULTILINE)
    bad = []
    for page, text in pages().items():
        spans = re.findall(r"`(toolrl [^`]+)`", prose(text))
        shell = [b.code for b in blocks(text, page)
                 if b.lang in {"bash", "sh", "shell", "console", "text", ""}]
        for chunk in [*spans, *shell]:
            bad += [f"{page}: toolrl {m}" for m in pattern.findall(chunk) if m not in commands]
    assert not bad, f"pages name commands the CLI lacks: {bad}; commands: {sorted(commands)}"


# -- code blocks -------------------------------------------------------------------------------

def all_blocks() -> list[Block]:
    return [b for page, text in pages().items() for b in blocks(text, page)]


def standalone_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang in RUNNABLE and b.not_run is None
            and not (b.page == "guides/own-env.md" and b.section == OWN_ENV_SECTION)]


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "COLUMNS": "160", "PYTHONPATH": ""}


def run_block(block: Block, workdir: Path, index: int = 0) -> list[tuple[str, str]]:
    """Run a Python block as a script or each line of a shell block; (command, stdout)."""
    if block.lang == "python":
        script = workdir / f"_block_{index}.py"
        script.write_text(block.code, encoding="utf-8")
        commands = [[sys.executable, script.name]]
    else:
        commands = [["bash", "-c", line] for line in block.code.splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
    outputs = []
    for command in commands:
        run = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=300,
                             env=_env())
        assert run.returncode == 0, (f"docs/{block.page}:{block.line}: {command[-1]} exited "
                                     f"{run.returncode}\n{run.stdout[-3000:]}\n"
                                     f"{run.stderr[-3000:]}")
        outputs.append((command[-1], run.stdout))
    return outputs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", standalone_blocks(), ids=lambda b: f"{b.page}:{b.line}")
def test_block_runs(block, tmp_path):
    run_block(block, tmp_path)


def test_every_runnable_block_runs_or_says_why_not():
    """A block is run by test_block_runs, by the own-env session, or carries a reason."""
    run_here = set(standalone_blocks())
    session = {b for b in all_blocks() if b.page == "guides/own-env.md"
               and b.section == OWN_ENV_SECTION}
    for block in all_blocks():
        if block.lang in RUNNABLE:
            assert block in run_here or block in session or block.not_run, block
        assert block.not_run is None or block.not_run.strip(), block


@pytest.fixture
def workdir(tmp_path):
    try:
        yield tmp_path
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", DIST],
                       capture_output=True, timeout=300)


@pytest.mark.timeout(900)
def test_own_env_guide_runs_verbatim(workdir):
    """The guide's end-to-end section, as a user types it, in order, in an empty directory: a
    block whose first line is ``# FILE`` goes into that file (a second such block continues
    it); other Python blocks run as scripts; each shell line runs as it is."""
    section = [b for b in blocks(OWN_ENV.read_text(encoding="utf-8"), "guides/own-env.md")
               if b.section == OWN_ENV_SECTION]
    assert {b.lang for b in section} == {"python", "toml", "yaml", "bash"}
    outputs = []
    for i, block in enumerate(section):
        first = block.code.splitlines()[0]
        target = re.fullmatch(r"# ([\w.]+\.(py|toml|yaml))", first)
        if target:
            path = workdir / target.group(1)
            before = path.read_text(encoding="utf-8") + "\n\n" if path.exists() else ""
            path.write_text(before + block.code, encoding="utf-8")
            continue
        assert block.lang in RUNNABLE, f"block {i} ({block.lang}) has no '# FILE' line"
        outputs += run_block(block, workdir, i)
    printed = dict(outputs)
    assert "PASS" in printed["toolrl check-env my/Weather-v0 --max-turns 3"]
    dry = printed["toolrl train --config weather.yaml --dry-run"]
    assert "first prompts (with tools)" in dry and "weather_efficient" in dry
    assert "no problems found" in dry
    scores = [json.loads(line) for line in (workdir / "scores.jsonl").read_text().splitlines()]
    assert [s["score"] for s in scores] == [1.0] * 4  # the oracle: right, after one call
    assert all(s["components"]["weather_efficient/calls"] == 1.0 for s in scores)


def experiment_yaml_blocks() -> list[Block]:
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    out = []
    for block in all_blocks():
        if block.lang == "yaml":
            data = yaml.safe_load(block.code)
            if isinstance(data, dict) and data and set(data) <= fields:
                out.append(block)
    return out


@pytest.mark.parametrize("block", experiment_yaml_blocks(), ids=lambda b: f"{b.page}:{b.line}")
def test_yaml_config_loads(block, tmp_path):
    """An experiment config on a page loads against the schema, its reward sets included."""
    from toolrl.reward import RewardConfig

    path = tmp_path / "config.yaml"
    path.write_text(block.code, encoding="utf-8")
    cfg = load_config(path)
    RewardConfig.from_config(cfg.reward)


def test_reward_reference_names_every_reward_key():
    from toolrl.reward import RewardConfig
    from toolrl.reward.compose import _COMPONENT_KEYS, _GATE_KEYS, _TOP_KEYS

    text = (DOCS / "guides" / "own-reward.md").read_text(encoding="utf-8")
    (block,) = [b for b in blocks(text) if b.section == "## Reward config reference"
                and b.lang == "yaml"]
    section = yaml.safe_load(block.code)["reward"]
    RewardConfig.from_config(section)
    components = section["rewards"]
    named = set(section) | {k for c in components if isinstance(c, dict) for k in c} | \
        {k for c in components if isinstance(c, dict) and "gate" in c for k in c["gate"]}
    assert named == {*_TOP_KEYS, *_COMPONENT_KEYS, *_GATE_KEYS}


def test_own_format_example_is_the_one_its_test_trains_on():
    path = ROOT / "tests" / "data_loading" / "test_own_format.py"
    spec = importlib.util.spec_from_file_location("_own_format", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (DOCS / "guides" / "data.md").read_text(encoding="utf-8")
    (block,) = [b for b in blocks(text) if b.lang == "json"]
    assert json.loads(block.code) == module.EXAMPLE


def test_generated_pages_are_not_committed():
    assert not [p for p in GENERATED if (DOCS / p).exists()]
