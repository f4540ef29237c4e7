"""Build a tiny, real Hugging Face checkpoint locally: Qwen2 weights + a trained tokenizer.

Tests and the CPU demo need a model without a hub. `build_tiny_model` writes a directory that
`AutoModelForCausalLM`, `AutoTokenizer` and vLLM load like any checkpoint:

- a byte-level BPE tokenizer trained with `tokenizers` on synthetic chat and tool-call text,
  every digit its own token (tiny models learn arithmetic formats far sooner that way);
- a tools-aware chat template in the Qwen2.5/Hermes style: the tool list rendered into the
  system prompt (one compact signature per tool, ``add(a: number, b: number) - Add.``, with
  ``?`` after optional parameters, enum values as ``"c"|"f"``, objects as ``{key: type}``,
  arrays as ``array[type]``; then a line per parameter with a description or a default,
  ``  unit: the unit (default "c")``: everything the schema says, shorter than raw JSON
  schemas, which a tiny model learns from faster), assistant calls as
  ``<tool_call>{json}</tool_call>`` (several per turn), tool results as role ``tool``. Each
  message renders independently of the ones after it, so the template is prefix-preserving
  (what token-in/token-out rollouts need);
- ``Qwen2ForCausalLM`` with random weights (seeded), tied embeddings, fp32 safetensors.

Besides the tiny family (`SIZES`), `REAL_SHAPES` builds the exact shapes of released models
(``qwen2.5-0.5b``: 24 layers, hidden 896, 14/2 heads, MLP 4,864, 151,936-token vocabulary, tied
embeddings, 494M parameters), and ``config`` takes any Hugging Face config as a dict (e.g. a
``config.json``): random weights, the same tiny tokenizer, and the embedding sized to the
shape's own vocabulary even though the tokenizer uses only its first ~4,096 ids. That is what
memory and speed tests of real sizes need, without a hub.

``tokenizer`` names a model family (`toolrl.core.families`) whose real tokenizer and chat
template the model is built on instead of the tiny one (`toolrl.models.families`; e.g.
``deepseek-r1-distill``: DeepSeek-R1-Distill's 152,064-token qwen2 tokenizer and its
think-stripping template): the embedding covers the whole real vocabulary, so every token the
model samples or trains on is the real tokenizer's own id.

Building is deterministic for a seed and cached: a second call on the same directory with the
same arguments is a no-op.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jinja2
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from toolrl.files import atomic_folder, build_lock
from toolrl.models.compact import compact_tokenizer
from toolrl.models.sizes import REAL_SHAPES, SIZES, TinySpec, size_names

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (not special) so they survive decoding with skip_special_tokens and reach the parser.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                 "<think>", "</think>"]
DEFAULT_SYSTEM = "You are a helpful assistant."
STAMP = "toolrl_tiny.json"
FORMAT_VERSION = 3  # bump when the tokenizer corpus, template or architecture changes

# An assistant turn (``m``): its text, then each call as <tool_call>{"name", "arguments"}
# </tool_call> (toolrl's hermes format); shared with toolrl.models.templates
ASSISTANT_TURN = (
    "{%- if m['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if m['content'] -%}{{- m['content'] -}}{%- endif -%}"
    "{%- if m['tool_calls'] -%}"
    "{%- for tc in m['tool_calls'] -%}"
    "{%- if tc['function'] is defined -%}{%- set f = tc['function'] -%}"
    "{%- else -%}{%- set f = tc -%}{%- endif -%}"
    "{{- '<tool_call>{\"name\": \"' + f['name'] + '\", \"arguments\": ' -}}"
    "{%- if f['arguments'] is string -%}{{- f['arguments'] -}}"
    "{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
)

# A parameter's type as the signature shows it: enum values, ``{key: type, ...}`` for an object
# with properties (``?`` after optional keys), ``array[type]``, or the JSON type.
_PARAM_TYPE = (
    "{%- macro ptype(p) -%}"
    "{%- if p['enum'] is defined -%}{{- p['enum'] | map('tojson') | join('|') -}}"
    "{%- elif p['type'] is defined and p['type'] == 'object' and p['properties'] is defined -%}"
    "{%- set r = p['required'] if p['required'] is defined else [] -%}{{- '{' -}}"
    "{%- for k, v in p['properties'].items() -%}"
    "{{- (', ' if not loop.first else '') + k + ('' if k in r else '?') + ': ' + ptype(v) -}}"
    "{%- endfor -%}{{- '}' -}}"
    "{%- elif p['type'] is defined and p['type'] == 'array' and p['items'] is defined -%}"
    "{{- 'array[' + ptype(p['items']) + ']' -}}"
    "{%- elif p['type'] is defined and p['type'] is string -%}{{- p['type'] -}}"
    "{%- elif p['type'] is defined -%}{{- p['type'] | join('|') -}}"
    "{%- else -%}{{- 'any' -}}{%- endif -%}"
    "{%- endmacro -%}"
)

CHAT_TEMPLATE = (
    _PARAM_TYPE +
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system = '" + DEFAULT_SYSTEM + "' -%}{%- set rest = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n<tools>' -}}"
    "{%- for tool in tools -%}"
    "{%- if tool['function'] is defined -%}{%- set f = tool['function'] -%}"
    "{%- else -%}{%- set f = tool -%}{%- endif -%}"
    "{%- set params = f['parameters'] if f['parameters'] is defined else {} -%}"
    "{%- set props = params['properties'] if params['properties'] is defined else {} -%}"
    "{%- set req = params['required'] if params['required'] is defined else [] -%}"
    "{{- '\\n' + f['name'] + '(' -}}"
    "{%- for pname, p in props.items() -%}"
    "{{- (', ' if not loop.first else '') + pname -}}"
    "{{- ('' if pname in req else '?') + ': ' + ptype(p) -}}"
    "{%- endfor -%}"
    "{{- ')' -}}"
    "{%- if f['description'] is defined and f['description'] -%}"
    "{{- ' - ' + f['description'] -}}{%- endif -%}"
    # one line per parameter with a description or a default
    "{%- for pname, p in props.items() -%}"
    "{%- set pdesc = p['description'] if p['description'] is defined else '' -%}"
    "{%- if pdesc or p['default'] is defined -%}"
    "{{- '\\n  ' + pname + ':' -}}{%- if pdesc -%}{{- ' ' + pdesc -}}{%- endif -%}"
    "{%- if p['default'] is defined -%}{{- ' (default ' + (p['default'] | tojson) + ')' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endfor -%}"
    "{{- '\\n</tools>\\nCall tools as "
    "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for m in rest -%}"
    + ASSISTANT_TURN +
    "{%- elif m['role'] == 'tool' -%}"
    "{{- '<|im_start|>tool\\n<tool_response>' + m['content'] + '</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


VOCAB_SIZE = 4096
MAX_POSITIONS = 4096


def build_tiny_model(out: str | os.PathLike, seed: int = 0, size: str = "small",
                     vocab_size: int = VOCAB_SIZE, config: dict[str, Any] | None = None,
                     dtype: str | None = None, tokenizer: str = "tiny",
                     vocab_texts: Sequence[str] | None = None,
                     load_tokenizer: Callable[[str], Any] | None = None) -> Path:
    """Write a checkpoint + the tiny tokenizer to ``out`` and return its path (cached).

    ``size`` names a tiny size (`SIZES`) or a real shape (`REAL_SHAPES`); ``config`` (a Hugging
    Face config as a dict, with ``model_type``) replaces it. ``vocab_size`` is the tokenizer's;
    a real shape keeps its own, larger, embedding. ``dtype`` of the saved weights: float32 for
    the tiny sizes, bfloat16 (as released) for real shapes and ``config`` by default.
    ``tokenizer``: ``tiny`` or a model family whose real tokenizer the model uses, loaded by
    ``load_tokenizer`` (`toolrl.models.families.family_tokenizer`, the default);
    ``vocab_texts``: restrict that tokenizer to the tokens these texts use
    (`toolrl.models.compact`: the same pieces, a ``K``-token head instead of the full one).
    """
    if config is None and size not in SIZES and size not in REAL_SHAPES:
        raise ValueError(f"unknown size {size!r}; choose one of {size_names()}")
    if config is not None:
        size = "custom"
        if "model_type" not in config:
            raise ValueError("config needs a 'model_type' (e.g. 'qwen2')")
    shape = config if config is not None else REAL_SHAPES.get(size)
    dtype = dtype or ("float32" if shape is None else "bfloat16")
    out = Path(out)
    stamp = _stamp(seed, size, vocab_size, shape, dtype)
    if tokenizer != "tiny":
        stamp["tokenizer"] = tokenizer
    if vocab_texts is not None:
        stamp["vocab"] = "task"
    with build_lock(out):
        if (out / STAMP).exists():
            try:
                if json.loads((out / STAMP).read_text()) == stamp:
                    return out
            except json.JSONDecodeError:
                pass
            # A tiny-model directory is a build artifact: another seed/size/format replaces it.
        elif out.exists() and any(out.iterdir()):
            raise FileExistsError(f"{out} exists and is not a tiny-model directory")

        with atomic_folder(out) as tmp:  # a killed build never leaves a half-written model
            if tokenizer == "tiny":
                tok = build_tokenizer(seed=seed, vocab_size=vocab_size)
            else:
                if load_tokenizer is None:
                    raise ValueError(f"tokenizer={tokenizer!r} needs load_tokenizer (e.g. "
                                     f"toolrl.models.families.family_tokenizer)")
                tok = load_tokenizer(tokenizer)
            if vocab_texts is not None:
                tok = compact_tokenizer(tok, vocab_texts, tmp, family=tokenizer)
            tok.save_pretrained(tmp)
            if shape is None:
                model = _build_model(tok, SIZES[size], seed, dtype)
            else:
                model = _build_shape(tok, shape, seed, dtype)
            model.save_pretrained(tmp, safe_serialization=True)
            (tmp / STAMP).write_text(json.dumps(stamp, indent=2))
        return out


def _stamp(seed: int, size: str, vocab_size: int, shape: dict[str, Any] | None,
           dtype: str) -> dict[str, Any]:
    """What a build is made of (``toolrl_tiny.json``): the same stamp, the same files."""
    stamp: dict[str, Any] = {"seed": seed, "size": size, "vocab_size": vocab_size,
                             "format": FORMAT_VERSION}
    if shape is None:
        stamp["spec"] = asdict(SIZES[size])
        if dtype != "float32":
            stamp["dtype"] = dtype
    else:
        stamp["config"] = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
        stamp["dtype"] = dtype
    return stamp


def is_current(out: str | os.PathLike, size: str = "small", tokenizer: str = "tiny") -> bool:
    """Whether ``out`` holds a build of ``size`` in this toolrl's format (its template,
    tokenizer and architecture; any seed): False for a missing folder or an older format."""
    try:
        built = json.loads((Path(out) / STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return built.get("format") == FORMAT_VERSION and built.get("size") == size and \
        built.get("tokenizer", "tiny") == tokenizer


def needs_build(out: str | os.PathLike, size: str = "small", tokenizer: str = "tiny",
                vocab: str = "full") -> bool:
    """Whether a run that builds its model at ``out`` builds it now: the folder is missing, or
    holds a tiny build of ``size`` in an older format (a folder without the stamp is a user's:
    kept). A tiny build of another size is never replaced (it may be another run's model):
    ValueError naming both sizes."""
    out = Path(out).expanduser()
    if not out.exists():
        return True
    try:
        built = json.loads((out / STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if built.get("size") != size:
        raise ValueError(f"{out} holds a tiny {built.get('size')!r} model, and "
                         f"model.tiny_size={size!r} would replace it: set "
                         f"model.tiny_size={built.get('size')}, or point model.path at "
                         f"another folder")
    if built.get("tokenizer", "tiny") != tokenizer or built.get("vocab", "full") != vocab:
        raise ValueError(f"{out} holds a tiny model on the {built.get('tokenizer', 'tiny')!r} "
                         f"tokenizer ({built.get('vocab', 'full')} vocabulary), and "
                         f"model.tiny_tokenizer={tokenizer!r} with model.tiny_vocab={vocab} "
                         f"would replace it: point model.path at another folder")
    return built.get("format") != FORMAT_VERSION


def build_tokenizer(seed: int = 0, vocab_size: int = VOCAB_SIZE):
    """Train a byte-level BPE tokenizer (single-digit tokens) and wrap it for transformers.

    Training is deterministic for ``(seed, vocab_size)`` and takes ~3 s of CPU: a process
    trains each once and hands out copies (a dry run, a build and a test in one process)."""
    return copy.deepcopy(_trained_tokenizer(seed, vocab_size))


@functools.lru_cache(maxsize=4)
def _trained_tokenizer(seed: int, vocab_size: int):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKUP_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=None,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    wrapped.add_tokens(MARKUP_TOKENS, special_tokens=False)
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def _build_model(tokenizer, spec: TinySpec, seed: int, dtype: str = "float32"):
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    config = _qwen2_config(spec, len(tokenizer), rope_theta=10000.0, eos_token_id=eos,
                           pad_token_id=pad, bos_token_id=None, torch_dtype=dtype,
                           use_sliding_window=False)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = transformers.GenerationConfig(eos_token_id=eos,
                                                            pad_token_id=pad)
    return model


def _build_shape(tokenizer, shape: dict[str, Any], seed: int, dtype: str):
    """A model of a given Hugging Face config, random weights in ``dtype``, the tiny tokenizer's
    special ids."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    kwargs = {k: v for k, v in shape.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(shape["model_type"], **kwargs)
    if config.vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size {config.vocab_size} is smaller than the tokenizer's "
                         f"{len(tokenizer)} ids")
    config.eos_token_id, config.pad_token_id, config.bos_token_id = eos, pad, None
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config = transformers.GenerationConfig(eos_token_id=eos,
                                                            pad_token_id=pad)
    return model


def tiny_config(size: str = "small", vocab_size: int = VOCAB_SIZE) -> Any:
    """The Hugging Face config `build_tiny_model` gives a tiny size (no weights built)."""
    return _qwen2_config(SIZES[size], vocab_size)


def _qwen2_config(spec: TinySpec, vocab_size: int, **extra: Any) -> Any:
    """The Qwen2 config of a tiny size (tied embeddings, `MAX_POSITIONS`), ``extra`` on top."""
    return transformers.Qwen2Config(vocab_size=_round_up(vocab_size, 64), **asdict(spec),
                                    max_position_embeddings=MAX_POSITIONS,
                                    tie_word_embeddings=True, **extra)


def shape_config(size: str) -> Any:
    """The Hugging Face config of a real shape (no weights built): for sizing and tests."""
    shape = REAL_SHAPES[size]
    kwargs = {k: v for k, v in shape.items() if k != "model_type"}
    return transformers.AutoConfig.for_model(shape["model_type"], **kwargs)


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


# --- synthetic corpus ------------------------------------------------------------------------
_WORDS = (
    "the a an of to in is what how many much find compute calculate result answer number total "
    "sum difference product quotient power account balance transfer customer id name amount "
    "weather city search query file read write list get set create delete update user order "
    "price item please help me with this I you we it can could would should then first next "
    "finally done thanks sure here is the tool call error invalid missing required argument "
    "type expected got value unknown timeout output truncated code python print return def "
    "import for while if else true false null yes no ok verify identity limit date time email"
).split()

_TOOLS: list[dict[str, Any]] = [
    {"name": op, "description": desc, "parameters": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"]}}
    for op, desc in [("add", "Add two numbers."), ("sub", "Subtract b from a."),
                     ("mul", "Multiply two numbers."), ("div", "Divide a by b."),
                     ("pow", "Raise a to the power b.")]
] + [
    {"name": "submit", "description": "Submit the final answer.", "parameters": {
        "type": "object", "properties": {"answer": {"type": "number"}}, "required": ["answer"]}},
    {"name": "get_weather", "description": "Get the weather of a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}},
    {"name": "transfer", "description": "Transfer money between accounts.", "parameters": {
        "type": "object", "properties": {"from_account": {"type": "string"},
                                         "to_account": {"type": "string"},
                                         "amount": {"type": "number"}},
        "required": ["from_account", "to_account", "amount"]}},
    {"name": "run_python", "description": "Run Python code.", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}},
]


def _as_openai(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": tool}


def _fake_args(rng: random.Random, tool: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for name, prop in tool["parameters"]["properties"].items():
        if "enum" in prop:
            args[name] = rng.choice(prop["enum"])
        elif prop["type"] == "number":
            args[name] = rng.choice([rng.randint(0, 999), round(rng.uniform(0, 99), 2)])
        else:
            args[name] = " ".join(rng.choices(_WORDS, k=rng.randint(1, 3)))
    return args


def _conversation(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tools = rng.sample(_TOOLS, k=rng.randint(1, 4))
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": " ".join(rng.choices(_WORDS, k=6)) + "."})
    nums = [rng.randint(0, 999) for _ in range(3)]
    messages.append({"role": "user", "content": f"What is {nums[0]} plus {nums[1]} times "
                     f"{nums[2]}? " + " ".join(rng.choices(_WORDS, k=rng.randint(2, 10)))})
    for _ in range(rng.randint(1, 3)):
        calls = [{"type": "function", "function": {"name": t["name"],
                                                   "arguments": _fake_args(rng, t)}}
                 for t in rng.choices(tools, k=rng.randint(1, 3))]
        text = " ".join(rng.choices(_WORDS, k=rng.randint(0, 6)))
        messages.append({"role": "assistant", "content": text, "tool_calls": calls})
        for call in calls:
            result = rng.choice([str(rng.randint(-999, 99999)),
                                 json.dumps({"error": "invalid_argument",
                                             "message": " ".join(rng.choices(_WORDS, k=5))}),
                                 " ".join(rng.choices(_WORDS, k=4))])
            messages.append({"role": "tool", "name": call["function"]["name"],
                             "content": result})
    messages.append({"role": "assistant",
                     "content": f"The answer is {rng.randint(-9999, 99999)}."})
    return messages, [_as_openai(t) for t in tools]


_SYLLABLES = ("ba be bi bo bu ca ce ci co cu da de di do du fa fe fi fo ga ge go ha he hi ho ka "
              "ke ki ko la le li lo lu ma me mi mo mu na ne ni no nu pa pe pi po pu ra re ri "
              "ro ru sa se si so su ta te ti to tu va ve vi vo za ze zi zo tion ing er ly al "
              "ous ment ness able ist").split()


def _pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4)))


def synthetic_corpus(seed: int = 0, n: int = 3000):
    """Chats rendered through the chat template, plus plain text: the tokenizer's training data."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    template = env.from_string(CHAT_TEMPLATE)
    rng = random.Random(seed)
    for _ in range(n):
        messages, tools = _conversation(rng)
        yield template.render(messages=messages, tools=tools, add_generation_prompt=False)
        yield " ".join(rng.choices(_WORDS, k=20))
        # Pseudo-words give BPE enough distinct pairs to fill a vocabulary of a few thousand.
        yield " ".join(_pseudo_word(rng) for _ in range(40))
