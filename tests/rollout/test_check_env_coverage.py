"""`toolrl check-env --model` says in one line which parts of the tool schemas the model's chat
template leaves out (`tool_coverage`, the report the dry run shows), without failing the check."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from toolrl.cli import main

MESSAGES = (  # the tiny template's messages: tool calls and results, prefix-preserving
    "{%- for m in messages -%}{%- if m['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}{%- if m['content'] -%}{{- m['content'] -}}{%- endif -%}"
    "{%- if m['tool_calls'] -%}{%- for tc in m['tool_calls'] -%}"
    "{%- set f = tc['function'] if tc['function'] is defined else tc -%}"
    "{{- '<tool_call>{\"name\": \"' + f['name'] + '\", \"arguments\": ' -}}"
    "{%- if f['arguments'] is string -%}{{- f['arguments'] -}}"
    "{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}{{- '}</tool_call>' -}}"
    "{%- endfor -%}{%- endif -%}{{- '<|im_end|>\\n' -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{{- '<|im_start|>tool\\n<tool_response>' + m['content'] + '</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")


def template(render_tool: str) -> str:
    """A tools-aware template that renders each tool ``t`` with the expression ``render_tool``."""
    return ("{%- if tools -%}{{- '<|im_start|>system\\n<tools>' -}}{%- for t in tools -%}"
            "{{- '\\n' + " + render_tool + " -}}{%- endfor -%}"
            "{{- '\\n</tools><|im_end|>\\n' -}}{%- endif -%}" + MESSAGES)


NAMES_ONLY = template("(t['function']['name'] if t['function'] is defined else t['name'])")
WHOLE_SCHEMA = template("(t | tojson)")


@pytest.fixture()
def model_with(tiny_model_dir: Path, tmp_path: Path):
    def make(chat_template: str) -> Path:
        path = tmp_path / f"model-{abs(hash(chat_template))}"
        shutil.copytree(tiny_model_dir, path)
        (path / "chat_template.jinja").write_text(chat_template)
        return path
    return make


def _coverage_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip().startswith("tool schemas:")]


def test_check_env_names_what_the_template_leaves_out(model_with, capsys):
    code = main(["check-env", "toolrl/FunctionCalling-v0", "--model",
                 str(model_with(NAMES_ONLY))])
    out = capsys.readouterr().out
    assert code == 0, out  # a note, not a failure: the env itself is fine
    assert _coverage_lines(out) == [
        "  tool schemas: the chat template leaves tool descriptions, parameter names, parameter "
        "descriptions, enum values, defaults, nested object properties out of the tools: the "
        "model never sees them"]


def test_check_env_says_when_the_template_shows_every_part(model_with, capsys):
    code = main(["check-env", "toolrl/Calculator-v0", "--model", str(model_with(WHOLE_SCHEMA)),
                 "--max-prompt-tokens", "4096"])  # whole JSON schemas make long prompts
    out = capsys.readouterr().out
    assert code == 0, out
    assert _coverage_lines(out) == [
        "  tool schemas: the chat template renders every part of the tool schemas"]


def test_without_a_model_there_is_no_coverage_line(capsys):
    assert main(["check-env", "toolrl/Calculator-v0"]) == 0
    assert _coverage_lines(capsys.readouterr().out) == []
