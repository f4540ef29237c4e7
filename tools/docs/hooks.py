"""MkDocs hooks (``hooks:`` in mkdocs.yml): the pages generated from the code at build time.

- ``reference/config.md`` from the typed schema (`tools.docs.config_reference`);
- ``reference/cli.md`` from the parser (`tools.docs.cli_reference`);
- ``benchmarks/results.md`` and its plots from ``benchmarks/RESULTS.md`` and
  ``benchmarks/plots/`` (what ``make bench`` writes), ``benchmarks/gpu-check.md`` from
  ``benchmarks/gpu_check.md``.

They exist only in the build; nothing is written to ``docs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
# `tools` is a folder of the repository, not an installed package; MkDocs restores sys.path
# once this module is loaded, so the generators are imported now
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tools.docs import cli_reference, config_reference  # noqa: E402


def generated_pages() -> dict[str, str]:
    """Site path -> Markdown of every generated page."""
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    gpu_check = (ROOT / "benchmarks" / "gpu_check.md").read_text(encoding="utf-8")
    note = ("!!! note \"Generated\"\n    This page is `benchmarks/{}` of the repository, as "
            "`make bench` last wrote it; the site copies it at build time.\n\n")
    return {
        "reference/config.md": config_reference.render(),
        "reference/cli.md": cli_reference.render(),
        "benchmarks/results.md": _after_title(results, note.format("RESULTS.md"),
                                              "# Benchmark results"),
        "benchmarks/gpu-check.md": _after_title(gpu_check, note.format("gpu_check.md")),
    }


def _after_title(text: str, insert: str, title: str | None = None) -> str:
    first, _, rest = text.partition("\n")
    if not first.startswith("# "):
        return (title or "# " + first) + "\n\n" + insert + text
    return (title or first) + "\n\n" + insert + rest.lstrip("\n")


def on_files(files: Files, config) -> Files:
    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    for plot in sorted((ROOT / "benchmarks" / "plots").glob("*.png")):
        files.append(File.generated(config, f"benchmarks/plots/{plot.name}",
                                    abs_src_path=str(plot)))
    return files
