"""The config reference, generated from the typed schema (`toolrl.trainer.config`).

Every key of `ExperimentConfig` (and of the component configs it embeds: `RolloutConfig`,
`EngineConfig`, `ActorConfig`, ...) becomes one row: its dotted path, its type as the source
writes it, its default (taken from a default-constructed config, so an embedded config's own
defaults, e.g. the experiment engine's ``max_model_len``, are the ones shown) and what it does.
"What it does" is read from the code, in two places a field is documented there:

- the class docstring, where a field is named at the start of a line, a bullet, or after
  ``; `` / ``. ``, followed by a colon (Google ``Attributes:`` entries, ``a / b: ...`` for a
  group, ````name````: in reST-ish bullets);
- the field's comments: the comment at the end of its line(s) and the comment lines right
  above it.

`schema_keys()` is the list; `render()` the Markdown page that the docs build writes as
``reference/config.md`` (`tools/docs/hooks.py`). Nothing here is written to the repository.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = ["KeyDoc", "Section", "field_docs", "render", "schema_keys", "sections"]

INDEX = "[i]"  # path element of a list of configs, e.g. data.mixture[i].env


@dataclass(frozen=True)
class KeyDoc:
    """One config key of the reference."""

    key: str  # dotted path, e.g. "rollout.engine.dtype"
    type: str  # the annotation as the source spells it
    default: Any  # the value in a default-constructed ExperimentConfig
    doc: str  # what it does (docstring entry and field comments, whitespace collapsed)
    owner: type  # the dataclass that declares the field
    filled_by: str | None = None  # set by the trainer from this key (FILLED_BY_TRAINER)
    choices: tuple[str, ...] | None = None  # valid values (CHOICES)


@dataclass(frozen=True)
class Section:
    """A config dataclass at one path (``""`` for the top level)."""

    path: str
    cls: type
    summary: str
    keys: tuple[KeyDoc, ...]


# -- reading the code ------------------------------------------------------------------------

def _label_pattern(names: set[str]) -> re.Pattern[str]:
    name = r"(?:``|`)?([A-Za-z_][A-Za-z0-9_]*)(?:``|`)?"
    return re.compile(
        r"(?:(?<=\n)[ \t]*(?:[*-][ \t]+)?|(?<=; )|(?<=\. )|^)"  # a line start, bullet, ; or .
        rf"({name}(?:[ \t]*/[ \t]*{name})*):[ \t]")


def _docstring_entries(cls: type, names: set[str]) -> dict[str, str]:
    """Field name -> its entry in ``cls``'s own docstring (labels that name only fields)."""
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    labels = []
    for match in _label_pattern(names).finditer(doc):
        fields_named = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", match.group(1))
        if fields_named and all(f in names for f in fields_named):
            labels.append((match.start(), match.end(), fields_named))
    entries: dict[str, str] = {}
    for i, (_, end, fields_named) in enumerate(labels):
        stop = labels[i + 1][0] if i + 1 < len(labels) else len(doc)
        text = doc[end:stop].split("\n\n")[0]  # a blank line ends an entry
        text = re.sub(r"[;,]?\s*$", "", " ".join(text.split()))
        for name in fields_named:
            entries.setdefault(name, text)
    return entries


def _comment_entries(cls: type) -> dict[str, str]:
    """Field name -> its comments: the lines right above it, then the one(s) on its lines."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whole line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            whole = not lines[row - 1][:col].strip()
            comments[row] = (tok.string.lstrip("#").strip(), whole)
    import ast

    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    entries: dict[str, str] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        row = node.lineno - 1
        while row in comments and comments[row][1]:
            above.insert(0, comments[row][0])
            row -= 1
        trailing = [comments[r][0] for r in range(node.lineno, (node.end_lineno or 0) + 1)
                    if r in comments and not comments[r][1]]
        text = " ".join(part for part in above + trailing if part)
        if text:
            entries[node.target.id] = text
    return entries


def field_docs(cls: type) -> dict[str, str]:
    """What each field of dataclass ``cls`` does, from the code of ``cls`` and its bases: the
    most derived docstring entry, then the comments where the field is declared."""
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, list[str]] = {name: [] for name in names}
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        for name, text in _docstring_entries(klass, names).items():
            if not docs[name]:
                docs[name].append(text)
    for klass in reversed(cls.__mro__):  # the comment where the field is (re)declared
        if not dataclasses.is_dataclass(klass):
            continue
        for name, text in _comment_entries(klass).items():
            if name in docs and text not in docs[name]:
                docs[name][1:] = [text]
    return {name: " ".join(parts) for name, parts in docs.items()}


def _summary(cls: type) -> str:
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    return " ".join(doc.split("\n\n")[0].split())


def _annotation(cls: type, f: dataclasses.Field) -> str:
    hint = typing.get_type_hints(cls).get(f.name)
    if typing.get_origin(hint) is typing.Literal:  # its values are listed with the key
        return type(typing.get_args(hint)[0]).__name__
    if isinstance(f.type, str):
        return f.type
    return inspect.formatannotation(f.type)


def _list_item_class(cls: type, name: str) -> type | None:
    """``X`` for a field annotated ``list[X]`` with ``X`` a dataclass."""
    hint = typing.get_type_hints(cls).get(name)
    if typing.get_origin(hint) is list:
        (arg,) = typing.get_args(hint) or (None,)
        if dataclasses.is_dataclass(arg):
            return arg
    return None


# -- the schema ------------------------------------------------------------------------------

def sections(root: Any = None) -> list[Section]:
    """Every config dataclass of the schema, depth first, with its keys."""
    from toolrl.trainer.config import FILLED_BY_TRAINER, ExperimentConfig

    choices = valid_values()
    out: list[Section] = []

    def walk(path: str, value: Any) -> None:
        cls = type(value)
        docs = field_docs(cls)
        keys, nested = [], []
        for f in dataclasses.fields(cls):
            key = f"{path}.{f.name}" if path else f.name
            default = getattr(value, f.name)
            item = _list_item_class(cls, f.name)
            doc = docs[f.name] or (_summary(type(default)) if dataclasses.is_dataclass(default)
                                   else _summary(item) if item is not None else "")
            keys.append(KeyDoc(key=key, type=_annotation(cls, f), default=default, doc=doc,
                               owner=_declaring_class(cls, f.name),
                               filled_by=FILLED_BY_TRAINER.get(key),
                               choices=choices.get(key)))
            if dataclasses.is_dataclass(default):
                nested.append((key, default))
            elif item is not None:
                nested.append((key + INDEX, _construct(item)))
        out.append(Section(path=path, cls=cls, summary=_summary(cls), keys=tuple(keys)))
        for key, default in nested:
            walk(key, default)

    walk("", root if root is not None else ExperimentConfig())
    return out


def valid_values() -> dict[str, tuple[str, ...]]:
    """Key -> the values the code accepts, as the schema states them: its ``Literal`` types
    (`CHOICES`) and the registries some keys name (`REGISTERED`, the names known now)."""
    from toolrl.trainer.config import CHOICES, REGISTERED

    return {**CHOICES, **{key: tuple(names()) for key, (_, names) in REGISTERED.items()}}


def schema_keys() -> list[KeyDoc]:
    """Every key of the experiment config, in the reference's order."""
    return [key for section in sections() for key in section.keys]


def _construct(cls: type) -> Any:
    """A default instance of a list item's config (required fields get an empty value)."""
    kwargs = {f.name: "" for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return cls(**kwargs)


def _declaring_class(cls: type, name: str) -> type:
    for klass in reversed(cls.__mro__):
        if name in getattr(klass, "__annotations__", {}):
            return klass
    return cls


# -- rendering -------------------------------------------------------------------------------

def yaml_value(value: Any) -> str:
    """A default as it would be written in a config file."""
    if dataclasses.is_dataclass(value):
        return "(section)"
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list):  # e.g. reward.rewards' [{name: success, weight: 1.0}]
        value = [_written(item) if dataclasses.is_dataclass(item) else item for item in value]
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix(" ...").strip()


def _written(item: Any) -> dict[str, Any]:
    """A list item's config as a config file writes it: the keys that differ from its
    defaults (a default-constructed item's)."""
    default = _construct(type(item))
    return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)
            if getattr(item, f.name) != getattr(default, f.name)}


def _cell(text: str) -> str:
    """Docstring text as a Markdown table cell: ````x```` (reST) -> ``x``; outside code spans
    ``<``, ``>`` and ``*`` are escaped (``outputs/<experiment_name>`` is no HTML tag)."""
    text = re.sub(r"``(.+?)``", r"`\1`", text.replace("\n", " "))
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                    .replace("*", "\\*").replace("|", "\\|"))
    return "".join(parts)  # (a table keeps a | inside a code span)


def _module_link(cls: type) -> str:
    return f"`{cls.__module__}.{cls.__qualname__}`"


def anchor(key: str) -> str:
    """The HTML id of a key's row: its path without ``[i]`` (``config.md#trainer.mode``)."""
    return key.replace(INDEX, "")


def section_anchor(path: str) -> str:
    """The HTML id of a section's heading (``reference/config.md#section-trainer.health``)."""
    return f"section-{anchor(path)}" if path else "section-top-level"


def render() -> str:
    """The reference page (Markdown)."""
    out = [
        "# Config reference",
        "",
        "<!-- generated at build time by tools/docs/config_reference.py from "
        "toolrl/trainer/config.py; do not edit -->",
        "",
        "Every key of an experiment config, generated from the typed schema in "
        "`toolrl/trainer/config.py` when the site is built: the type as the code declares "
        "it, the default of a config that sets nothing, and what the key does, from the "
        "class docstrings and the comments beside the fields. Configs in `configs/` map 1:1 "
        "onto this schema; any key can be overridden on the command line as `key=value` "
        "(`toolrl train --config FILE actor.lr=1e-5 trainer.total_steps=10`). An unknown key or "
        "a wrong type fails before any worker starts, with its full path and the valid keys.",
        "",
        "The `reward` section and each entry of `env_rewards` are reward sets "
        "(`toolrl.reward.RewardSection`, typed like the rest; the rules their types cannot say "
        "are `RewardSection.resolved`'s); how they score is in the "
        "[reward config reference](../guides/own-reward.md#reward-config-reference).",
        "",
    ]
    for section in sections():
        title = f"`{section.path}`" if section.path else "Top level"
        out += [f"## {title} {{ #{section_anchor(section.path)} }}", ""]
        if section.summary:
            out += [_cell(section.summary), ""]
        out += [f"Declared by {_module_link(section.cls)}.", ""]
        out += ["| key | type | default | what it does |", "| --- | --- | --- | --- |"]
        for key in section.keys:
            doc = _cell(key.doc.strip())
            doc = doc[:1].upper() + doc[1:]  # a sentence (a code span stays as it is)
            if key.choices:
                doc += ("" if doc.endswith(".") or not doc else ".") + " Valid values: " + \
                    ", ".join(f"`{c}`" for c in key.choices) + "."
            if key.filled_by:
                doc = f"**Set by the trainer** from `{key.filled_by}`; leave it unset. " + doc
            default = yaml_value(key.default)
            if dataclasses.is_dataclass(key.default) or _is_list_section(key, section):
                default = f"[section](#{section_anchor(key.key + _suffix(key, section))})"
            out.append(f'| <span id="{anchor(key.key)}"></span>`{key.key}` | `{key.type}` | '
                       + (default if default.startswith("[") else f"`{default}`")
                       + f" | {doc} |")
        out.append("")
    return "\n".join(out)


def _is_list_section(key: KeyDoc, section: Section) -> bool:
    return _list_item_class(section.cls, key.key.rsplit(".", 1)[-1]) is not None


def _suffix(key: KeyDoc, section: Section) -> str:
    return INDEX if _is_list_section(key, section) else ""


if __name__ == "__main__":  # pragma: no cover - a quick look: python -m tools.docs.config_reference
    print(render())
