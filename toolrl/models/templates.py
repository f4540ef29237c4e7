"""Chat templates toolrl writes into imported checkpoints.

``chatml-tools``: ChatML (``<|im_start|>role\\n...<|im_end|>``) with tools rendered the way
Qwen2.5's template and the Hermes function-calling models do, for models whose own template
has no tools section (SmolLM2's drops ``tools`` silently):

- the tools, each as its JSON schema on one line, inside ``<tools></tools>`` in the system
  message, after the system prompt (the default one when the conversation has none), with
  Qwen2.5's instructions;
- an assistant's calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, right
  after its text, exactly what toolrl's ``hermes`` format renders and parses;
- tool results as ``<tool_response>\\n...\\n</tool_response>`` inside one ``user`` turn per
  run of consecutive tool messages (as Qwen2.5's template does).

Every message renders independently of the messages after it (a run of tool results is
closed when the next message is not a tool result), so the template is prefix-preserving:
`toolrl.rollout.chat.ChatRenderer` checks it like any other.

``gemma3-tools``: Gemma 3's documented turn format (``<bos>``, then
``<start_of_turn>user\\n...<end_of_turn>\\n`` and ``<start_of_turn>model\\n...``; the system
text opens the first user turn), for Gemma 3 checkpoints whose GGUF carries no template. Tools
are listed in the first user turn as JSON schemas; the model calls them with a JSON object
(several: a JSON list) before any text, what toolrl's ``json`` format renders and parses;
tool results go back in one user turn per run of tool messages, each in a ```` ```tool_output ````
fence. Prefix-preserving like ``chatml-tools``.
"""

from __future__ import annotations

from toolrl.models.tiny import ASSISTANT_TURN

CHATML_DEFAULT_SYSTEM = "You are a helpful assistant."
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

_TOOLS_INTRO = ("\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
                "query.\\n\\nYou are provided with function signatures within <tools></tools> "
                "XML tags:\\n<tools>")
_TOOLS_OUTRO = ("\\n</tools>\\n\\nFor each function call, return a json object with function "
                "name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>"
                "{\"name\": <function-name>, \"arguments\": <args-json-object>}</tool_call>")


def chatml_tools(default_system: str = CHATML_DEFAULT_SYSTEM) -> str:
    """The ``chatml-tools`` template with ``default_system`` as the system prompt of
    conversations that bring none."""
    if "'" in default_system or "\\" in default_system:
        raise ValueError("the default system prompt must not contain quotes or backslashes")
    return (
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
        "{%- else -%}"
        "{%- set system = '" + default_system + "' -%}{%- set rest = messages -%}"
        "{%- endif -%}"
        "{{- '<|im_start|>system\\n' + system -}}"
        "{%- if tools -%}"
        "{{- '" + _TOOLS_INTRO + "' -}}"
        "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
        "{{- '" + _TOOLS_OUTRO + "' -}}"
        "{%- endif -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- for m in rest -%}"
        + ASSISTANT_TURN +
        "{%- elif m['role'] == 'tool' -%}"
        "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}"
        "{{- '<|im_start|>user' -}}{%- endif -%}"
        "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' -}}"
        "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}"
        "{{- '<|im_end|>\\n' -}}{%- endif -%}"
        "{%- else -%}"
        "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )


_GEMMA_TOOLS = ("You can call these functions (JSON schemas):\\n")
_GEMMA_CALLS = ("\\nTo call functions, answer with a JSON object {\"name\": ..., \"arguments\": "
                "{...}} (several: a JSON list of them) and nothing before it.\\n\\n")


def gemma3_tools() -> str:
    """The ``gemma3-tools`` template (see the module docstring)."""
    return (
        "{{- bos_token -}}"
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set system = messages[0]['content'] + '\\n\\n' -%}{%- set rest = messages[1:] -%}"
        "{%- else -%}{%- set system = '' -%}{%- set rest = messages -%}{%- endif -%}"
        "{%- set ns = namespace(first=true) -%}"
        "{%- for m in rest -%}"
        "{%- if m['role'] == 'assistant' -%}"
        "{{- '<start_of_turn>model\\n' -}}"
        "{%- if m['tool_calls'] -%}"
        "{%- if m['tool_calls'] | length > 1 -%}{{- '[' -}}{%- endif -%}"
        "{%- for tc in m['tool_calls'] -%}"
        "{%- set f = tc['function'] if tc['function'] is defined else tc -%}"
        "{{- (', ' if not loop.first else '') -}}"
        "{{- {'name': f['name'], 'arguments': f['arguments']} | tojson -}}"
        "{%- endfor -%}"
        "{%- if m['tool_calls'] | length > 1 -%}{{- ']' -}}{%- endif -%}"
        "{%- if m['content'] -%}{{- '\\n' + m['content'] -}}{%- endif -%}"
        "{%- elif m['content'] -%}{{- m['content'] -}}{%- endif -%}"
        "{{- '<end_of_turn>\\n' -}}"
        "{%- elif m['role'] == 'tool' -%}"
        "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}"
        "{{- '<start_of_turn>user\\n' -}}{%- endif -%}"
        "{{- '```tool_output\\n' + m['content'] + '\\n```\\n' -}}"
        "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}"
        "{{- '<end_of_turn>\\n' -}}{%- endif -%}"
        "{%- else -%}"
        "{{- '<start_of_turn>user\\n' -}}"
        "{%- if ns.first -%}{{- system -}}"
        "{%- if tools -%}{{- '" + _GEMMA_TOOLS + "' -}}"
        "{%- for tool in tools -%}{{- (tool | tojson) + '\\n' -}}{%- endfor -%}"
        "{{- '" + _GEMMA_CALLS + "' -}}{%- endif -%}"
        "{%- set ns.first = false -%}{%- endif -%}"
        "{{- m['content'] + '<end_of_turn>\\n' -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
    )


# name -> (template for a default system prompt, what provenance records as its origin)
TEMPLATES = {"chatml-tools": chatml_tools, "gemma3-tools": gemma3_tools}
ORIGINS = {"chatml-tools": "toolrl.models.templates.chatml_tools: ChatML with Hermes-style "
                           "tools (Qwen2.5's tools section and tool-response turns)",
           "gemma3-tools": "toolrl.models.templates.gemma3_tools: Gemma 3's documented turn "
                           "format with JSON tools, calls and ```tool_output``` results"}

__all__ = ["CHATML_DEFAULT_SYSTEM", "ORIGINS", "SMOLLM2_SYSTEM", "TEMPLATES", "chatml_tools",
           "gemma3_tools"]
