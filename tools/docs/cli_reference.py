"""The CLI reference, generated from the parser (`toolrl.cli.build_parser`).

Every command and subcommand becomes one section: its help line, its usage as ``toolrl ... -h``
prints it, and a table of its arguments (flags or name, default, choices, help). `commands()`
lists them; `render()` is the page the docs build writes as ``reference/cli.md``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = ["Command", "commands", "render"]

WIDTH = 96  # usage lines are wrapped as a terminal this wide would wrap them


@dataclass(frozen=True)
class Command:
    """One (sub)command of ``toolrl``."""

    name: str  # e.g. "toolrl data convert"
    help: str
    parser: argparse.ArgumentParser


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str,
                                                                  argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return out


def commands(parser: argparse.ArgumentParser | None = None) -> list[Command]:
    """Every command that runs something (a leaf of the parser tree), in the parser's order."""
    if parser is None:
        from toolrl.cli import build_parser

        parser = build_parser()
    out: list[Command] = []

    def walk(prefix: str, help_: str, p: argparse.ArgumentParser) -> None:
        subs = _subcommands(p)
        if not subs:
            out.append(Command(prefix, help_, p))
        for name, sub_help, sub in subs:
            walk(f"{prefix} {name}", sub_help, sub)

    walk("toolrl", parser.description or "", parser)
    return out


def _usage(p: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(p.prog, width=WIDTH)
    formatter.add_usage(p.usage, p._actions, p._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _row(action: argparse.Action) -> str | None:
    if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
        return None
    name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
    if action.option_strings and action.nargs != 0:
        name += f" `{action.metavar or action.dest.upper()}`"
    if not action.option_strings and action.nargs in ("*", "+"):
        name += " (one or more)" if action.nargs == "+" else " (any number)"
    if action.required and (action.option_strings or action.nargs not in ("*", "?")):
        default = "required"
    elif action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        default = ""
    else:
        default = f"`{action.default}`"
    help_ = _cell(action.help or "")
    if action.choices:
        help_ += (" " if help_ else "") + "One of: " + ", ".join(
            f"`{c}`" for c in action.choices) + "."
    return f"| {name} | {default} | {help_} |"


def render() -> str:
    """The reference page (Markdown)."""
    cmds = commands()
    out = [
        "# CLI reference",
        "",
        "<!-- generated at build time by tools/docs/cli_reference.py from "
        "toolrl.cli.build_parser(); do not edit -->",
        "",
        "Every `toolrl` command, generated from the parser when the site is built "
        "(`toolrl COMMAND -h` prints the same). Overrides (`key=value`) take any key of the "
        "[config reference](config.md).",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    out += [f"| [`{c.name}`](#{_anchor(c.name)}) | {_cell(c.help)} |" for c in cmds]
    out.append("")
    for c in cmds:
        out += [f"## `{c.name}` {{ #{_anchor(c.name)} }}", "", _cell(c.help), "",
                "```text", _usage(c.parser), "```", ""]
        rows = [r for r in map(_row, c.parser._actions) if r]
        if rows:
            out += ["| argument | default | what it does |", "| --- | --- | --- |", *rows, ""]
    return "\n".join(out)


def _anchor(name: str) -> str:
    return name.replace(" ", "-")


if __name__ == "__main__":  # pragma: no cover
    print(render())
