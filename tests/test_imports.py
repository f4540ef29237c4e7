"""Imports stay at the top of a module (issue 52). An import inside a function is the exception:
it keeps a heavy optional dependency (vLLM, peft, the MCP SDK, bfcl_eval, gguf, the agent SDKs,
a tracking backend) or torch and transformers out of a path that must stay light, and it says
which with a ``# lazy: <reason>`` comment, on its own line or on the comment lines just above
its block of imports. Fewer than `LIMIT` of them in toolrl/.

The command line keeps ``toolrl --help`` light without them: `toolrl.cli.COMMANDS` names each
command's function as a ``"module:function"`` string of ``toolrl.commands``, imported when the
command runs.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from toolrl.cli import COMMANDS, build_parser, command

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60  # the count must stay below it (97 before issue 52)


@dataclass(frozen=True)
class LazyImport:
    path: str
    line: int
    justified: bool  # a `# lazy:` comment on it or just above its block

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


def _statement_lists(node: ast.AST) -> list[list[ast.stmt]]:
    """The statement lists directly under ``node`` (bodies, else and finally branches)."""
    lists = [getattr(node, name) for name in ("body", "orelse", "finalbody")
             if isinstance(getattr(node, name, None), list)]
    lists += [h.body for h in getattr(node, "handlers", [])]
    lists += [c.body for c in getattr(node, "cases", [])]
    return [stmts for stmts in lists if stmts and isinstance(stmts[0], ast.stmt)]


def _catches_import_error(node: ast.AST, stmts: list[ast.stmt]) -> bool:
    """Whether ``stmts`` is the body of an ``except ImportError`` of the try ``node``: a
    fallback import, lazy for the reason its try body gives."""
    return any(h.body is stmts and h.type is not None and "ImportError" in ast.unparse(h.type)
               for h in getattr(node, "handlers", []))


def _comment_above(lines: list[str], first: int) -> str:
    """The comment lines just above line ``first`` (1-based), and the comment that ends the
    line above them (``with suppress(ImportError):  # lazy: ...``)."""
    out = []
    i = first - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        out.append(lines[i])
        i -= 1
    if i >= 0 and "#" in lines[i]:
        out.append(lines[i][lines[i].index("#"):])
    return "\n".join(out)


def function_imports(path: Path, rel: str) -> list[LazyImport]:
    """Every import statement inside a function body of ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[LazyImport] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        in_function = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        said = False  # whether the try body's imports say why (their except ImportError too)
        for stmts in _statement_lists(node):
            fallback = said and _catches_import_error(node, stmts)
            block = False  # a block of imports (blank lines between them) that says why
            for prev, stmt in zip([None, *stmts], stmts, strict=False):
                if not isinstance(stmt, ast.Import | ast.ImportFrom):
                    continue
                own = "\n".join(lines[stmt.lineno - 1:stmt.end_lineno])
                above = _comment_above(lines, stmt.lineno)
                follows = (isinstance(prev, ast.Import | ast.ImportFrom) and not any(
                    lines[i].strip() for i in range(prev.end_lineno, stmt.lineno - 1)))
                block = ("# lazy:" in own or "# lazy:" in above or (follows and block)
                         or fallback)
                said = said or (block and stmts is getattr(node, "body", None))
                if in_function:
                    found.append(LazyImport(rel, stmt.lineno, block))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                visit(child, in_function)

    visit(ast.parse("\n".join(lines), filename=rel), False)
    return found


def lazy_imports() -> list[LazyImport]:
    return [imp for path in sorted((ROOT / "toolrl").rglob("*.py"))
            for imp in function_imports(path, path.relative_to(ROOT).as_posix())]


def test_few_imports_are_inside_functions():
    found = lazy_imports()
    assert len(found) < LIMIT, (f"{len(found)} imports inside functions in toolrl/ (fewer than "
                                f"{LIMIT}): import at the top of the module")


def test_every_import_inside_a_function_says_why():
    bad = [str(imp) for imp in lazy_imports() if not imp.justified]
    assert not bad, (f"imports inside functions without a `# lazy: <reason>` comment: {bad}; "
                     f"import at the top, or name the heavy optional dependency kept out")


def test_the_scanner_sees_what_is_inside_functions(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text(
        "import os\n"                                     # 1: module level
        "def f():\n"
        "    import json\n"                               # 3: no reason
        "    # lazy: vLLM is optional\n"
        "    from vllm import a\n"                        # 5: the comment above
        "    from vllm import b\n"                        # 6: the same block
        "\n"
        "    import peft  # lazy: peft is optional\n"     # 8: its own comment
        "    x = 1\n"
        "    import re\n"                                 # 10: a new block, no reason
        "    with suppress(ImportError):  # lazy: torch\n"
        "        import torch\n"                          # 12: the line above
        "    try:  # lazy: vLLM is optional\n"
        "        from vllm import c\n"                   # 14: the try line
        "    except ImportError:\n"
        "        from vllm import d\n"                   # 16: its fallback
        "    except ValueError:\n"
        "        import e\n"                             # 18: not a fallback
        "class C:\n"
        "    import sys\n"                                # 20: class level, not a function
        "    async def g(self):\n"
        "        if True:\n"
        "            import mcp\n")                       # 23: nested, no reason
    got = {(i.line, i.justified) for i in function_imports(sample, "m.py")}
    assert got == {(3, False), (5, True), (6, True), (8, True), (10, False), (12, True),
                   (14, True), (16, True), (18, False), (23, False)}


def test_every_command_runs_a_function_of_the_table():
    """Each subcommand's parser names a `COMMANDS` entry, and each entry names a function of
    toolrl.commands."""
    named = set()

    def leaves(parser) -> None:
        subs = [a for a in parser._actions if a.choices and hasattr(a, "_name_parser_map")]
        for action in subs:
            for sub in set(action.choices.values()):
                leaves(sub)
        if not subs:
            named.add(parser.get_default("run"))

    leaves(build_parser())
    assert named == set(COMMANDS.values())
    for words, target in COMMANDS.items():  # read, not imported: the GPU box has no Ray
        module, _, name = target.partition(":")
        path = ROOT / Path(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert name in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}, words


def test_a_command_resolves_to_its_function():
    assert command(COMMANDS["envs"]).__name__ == "envs"


def test_help_imports_no_command_module():
    probe = ("import sys\nfrom toolrl.cli import main\ntry:\n    main(['--help'])\n"
             "except SystemExit:\n    pass\n"
             "heavy = ('torch', 'transformers', 'ray', 'vllm', 'gymnasium', 'rich',"
             " 'toolrl.commands')\n"
             "print('LOADED', sorted(m for m in heavy if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "usage: toolrl" in out.stdout and "LOADED []" in out.stdout, out.stdout
