"""`tool_coverage`: which parts of a tool schema a chat template leaves out of the prompt."""

from __future__ import annotations

import copy

from toolrl.models.tiny import build_tokenizer
from toolrl.rollout.chat import ChatRenderer, tool_coverage

JSON_TOOLS = (  # a Qwen2.5-style template: every tool as its JSON
    "{%- if tools -%}{{- '<|im_start|>system\\n<tools>' -}}{%- for t in tools -%}"
    "{{- '\\n' + (t | tojson) -}}{%- endfor -%}{{- '\\n</tools><|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")


def test_the_tiny_template_reports_what_it_leaves_out():
    tokenizer = build_tokenizer(seed=0)
    coverage = tool_coverage(ChatRenderer(tokenizer, check=False))
    assert coverage.missing == ("parameter descriptions", "defaults", "nested object properties")
    assert "leaves parameter descriptions, defaults, nested object properties out of the " \
           "tools" in coverage.describe()


def test_a_template_that_renders_the_whole_schema_is_complete():
    tokenizer = copy.deepcopy(build_tokenizer(seed=0))
    tokenizer.chat_template = JSON_TOOLS
    coverage = tool_coverage(ChatRenderer(tokenizer, check=False))
    assert coverage.ok and coverage.missing == ()
