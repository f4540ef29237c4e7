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


def test_the_tiny_template_renders_every_part_of_a_schema():
    tokenizer = build_tokenizer(seed=0)
    coverage = tool_coverage(ChatRenderer(tokenizer, check=False))
    assert coverage.ok, coverage.describe()
    tool = {"type": "function", "function": {
        "name": "book", "description": "Book a flight.", "parameters": {
            "type": "object", "required": ["legs", "passenger"], "properties": {
                "legs": {"type": "array", "description": "the flights, in order",
                         "items": {"type": "object", "required": ["from"], "properties": {
                             "from": {"type": "string"}, "date": {"type": "string"}}}},
                "passenger": {"type": "object", "properties": {"name": {"type": "string"}}},
                "cabin": {"type": "string", "enum": ["economy", "business"],
                          "description": "the cabin", "default": "economy"},
                "bags": {"type": ["integer", "null"], "default": 0},
                "note": {"type": "string"}}}}}
    text = ChatRenderer(tokenizer, check=False).render_text(
        [{"role": "user", "content": "hi"}], [tool], add_generation_prompt=True)
    assert ("\nbook(legs: array[{from: string, date?: string}], passenger: {name?: string}, "
            'cabin?: "economy"|"business", bags?: integer|null, note?: string) - Book a '
            'flight.\n  legs: the flights, in order\n  cabin: the cabin (default "economy")\n'
            "  bags: (default 0)\n</tools>") in text  # `note` has neither: no line of its own


def test_a_template_that_renders_the_whole_schema_is_complete():
    tokenizer = copy.deepcopy(build_tokenizer(seed=0))
    tokenizer.chat_template = JSON_TOOLS
    coverage = tool_coverage(ChatRenderer(tokenizer, check=False))
    assert coverage.ok and coverage.missing == ()
