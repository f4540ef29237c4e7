"""Chat-template deltas: delta-append equals a full re-render; bad templates are caught."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from toolrl.core.env import run_episode
from toolrl.models.tiny import CHAT_TEMPLATE
from toolrl.rollout.chat import PROBE_MESSAGES, PROBE_TOOLS, ChatRenderer, TemplateError

# The tiny template with one change: earlier assistant turns lose their <think> block (as
# Qwen3-style templates do), so rendering a turn depends on what follows it.
_CONTENT = "{%- if m['content'] -%}{{- m['content'] -}}{%- endif -%}"
_DROP_THINK = ("{%- if m['content'] -%}{%- if not loop.last and '</think>' in m['content'] -%}"
               "{{- m['content'].split('</think>')[-1] -}}{%- else -%}{{- m['content'] -}}"
               "{%- endif -%}{%- endif -%}")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture()
def dropping_tokenizer(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert _CONTENT in CHAT_TEMPLATE
    tok.chat_template = CHAT_TEMPLATE.replace(_CONTENT, _DROP_THINK)
    return tok


def calculator_transcript(difficulty: int = 3) -> tuple[list[dict], list[dict]]:
    """A real multi-turn Calculator conversation played by the env's scripted oracle."""
    from toolrl.envs.calculator import CalculatorEnv

    import toolrl

    row = CalculatorEnv.make_tasks(1, seed=3, difficulty=difficulty)[0]
    env = toolrl.make_env("toolrl/Calculator-v0")
    episode = asyncio.run(run_episode(env, row=row, seed=0))
    tools = env.tools_schema()
    env.close()
    assert sum(m["role"] == "assistant" for m in episode.messages) == difficulty + 1
    return episode.messages, tools


def test_first_prompt_is_the_template_rendering_as_a_list_of_ids(tokenizer):
    renderer = ChatRenderer(tokenizer)
    messages = PROBE_MESSAGES[:2]
    ids = renderer.render_prompt(messages, PROBE_TOOLS)
    # transformers 5 returns a BatchEncoding from tokenize=True; the renderer returns ids
    expected = tokenizer.apply_chat_template(messages, tools=PROBE_TOOLS,
                                             add_generation_prompt=True, tokenize=True)
    assert isinstance(ids, list) and all(isinstance(t, int) for t in ids)
    assert ids == list(expected["input_ids"])
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_a_group_renders_its_prompt_once_and_gets_independent_copies(tokenizer):
    renderer = ChatRenderer(tokenizer)
    messages = [{"role": "system", "content": "Use the tools."},
                {"role": "user", "content": "What is 2 + 3?"}]
    calls = []
    render = tokenizer.apply_chat_template

    def counting(*args, **kwargs):
        calls.append(kwargs.get("tokenize"))
        return render(*args, **kwargs)

    renderer.tokenizer = type("Counting", (), {"apply_chat_template": staticmethod(counting)})()
    first = renderer.render_prompt(messages, PROBE_TOOLS)
    first.append(-1)  # a caller extending its prompt must not change the next sample's
    second = renderer.render_prompt([dict(m) for m in messages], list(PROBE_TOOLS))
    assert calls == [True] and second == first[:-1]
    other = renderer.render_prompt([*messages[:1], {"role": "user", "content": "other"}],
                                   PROBE_TOOLS)
    assert calls == [True, True] and other != second


def test_delta_append_equals_full_rerender_on_the_tiny_template(tokenizer):
    renderer = ChatRenderer(tokenizer)
    assert renderer.conformance is not None and renderer.conformance.ok
    messages, tools = calculator_transcript()
    report = renderer.check_prefix_preserving(messages, tools)
    assert report.ok, report.describe()
    assert report.incremental_len == report.full_len > 100


def test_replaying_a_transcript_by_hand_matches_one_render(tokenizer):
    """The exact token stream a rollout builds: prompt, sampled turns (to eos), deltas."""
    renderer = ChatRenderer(tokenizer)
    messages, tools = calculator_transcript(difficulty=2)
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = renderer.render_prompt(messages[:first], tools)
    i = first
    while i < len(messages):
        sampled = renderer.assistant_tokens(messages[:i], messages[i], tools)
        assert sampled[-1] == tokenizer.eos_token_id
        ids += sampled
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        ids += renderer.render_delta(messages[i + 1: j], tools, after_eos=True,
                                     add_generation_prompt=j < len(messages))
        i = j
    full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                         return_dict=False)
    # the full render of a finished conversation (no generation prompt) ends after the
    # closing newline of the last assistant turn; the replay ends the same way
    assert ids == list(full)


def test_delta_after_eos_starts_after_the_eos_and_ends_with_the_generation_prompt(tokenizer):
    renderer = ChatRenderer(tokenizer)
    tool_msg = [{"role": "tool", "name": "add", "content": "5"}]
    after_eos = renderer.render_delta(tool_msg, PROBE_TOOLS, after_eos=True)
    no_eos = renderer.render_delta(tool_msg, PROBE_TOOLS, after_eos=False)
    assert tokenizer.decode(after_eos) == \
        "\n<|im_start|>tool\n<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n"
    # a turn cut without eos (stop string, length) gets the template's closing, eos included
    assert no_eos == [tokenizer.eos_token_id, *after_eos]
    user = renderer.render_delta([{"role": "user", "content": "and now?"}], after_eos=True)
    assert tokenizer.decode(user) == \
        "\n<|im_start|>user\nand now?<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_drops_earlier_reasoning_gets_per_turn_or_is_refused(
        dropping_tokenizer, caplog):
    caplog.set_level("INFO")
    renderer = ChatRenderer(dropping_tokenizer)  # auto: the exact policy
    assert renderer.per_turn and renderer.history.exact
    line = renderer.history.line()
    assert line.startswith("history policy: per_turn (exact to inference")
    assert "message 3 (tool) rewrites the rendering" in line  # where it first breaks
    assert line in caplog.text
    with pytest.raises(TemplateError, match="not prefix-preserving") as err:
        ChatRenderer(dropping_tokenizer, history_policy="delta")
    assert "per_turn" in str(err.value) and "keep_stream" in str(err.value)
    assert "<think>" in str(err.value)  # the report shows where the token streams diverge
    with pytest.raises(TemplateError, match="offers no chat-template keyword"):
        ChatRenderer(dropping_tokenizer, history_policy="preserve")
    with pytest.raises(TemplateError, match="choose one of"):
        ChatRenderer(dropping_tokenizer, history_policy="sometimes")


def test_the_explicit_option_keeps_going_and_keeps_the_report(dropping_tokenizer, caplog):
    renderer = ChatRenderer(dropping_tokenizer, allow_non_prefix_preserving=True)
    report = renderer.conformance
    assert report is not None and not report.ok and report.first_mismatch is not None
    assert renderer.history.policy == "keep_stream" and not renderer.per_turn
    assert "history policy: keep_stream (NOT exact" in caplog.text  # one clear line
    # deltas still work: they are the tokens the model sees during the rollout
    delta = renderer.render_delta([{"role": "tool", "content": "5"}], after_eos=True)
    assert dropping_tokenizer.decode(delta).startswith("\n<|im_start|>tool\n")


def test_reasoning_free_conversations_pass_even_the_dropping_template(dropping_tokenizer):
    renderer = ChatRenderer(dropping_tokenizer, check=False)
    messages, tools = calculator_transcript(difficulty=1)
    assert renderer.check_prefix_preserving(messages, tools).ok


def test_a_template_that_rewrites_the_previous_turn_fails_the_delta(tokenizer, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    # ends an assistant turn with an extra newline before eos once other messages follow it
    old = r"{%- endif -%}{{- '<|im_end|>\n' -}}{%- elif m['role'] == 'tool'"
    assert old in CHAT_TEMPLATE
    tok.chat_template = CHAT_TEMPLATE.replace(old, (
        r"{%- endif -%}{%- if loop.last -%}{{- '<|im_end|>\n' -}}{%- else -%}"
        r"{{- '\n<|im_end|>\n' -}}{%- endif -%}{%- elif m['role'] == 'tool'"))
    assert tok.chat_template != CHAT_TEMPLATE
    renderer = ChatRenderer(tok, check=False)
    with pytest.raises(TemplateError, match="prefix-preserving"):
        renderer.render_delta([{"role": "tool", "content": "5"}])
    assert not renderer.check_prefix_preserving(PROBE_MESSAGES, PROBE_TOOLS).ok


def test_a_tokenizer_without_a_template_is_a_clear_error(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        ChatRenderer(tok)
