"""bench_update's real_fc workload without timing anything: the batch's prompts are what the
env and SmolLM2's chat template render, its loss mask covers exactly the oracle's call tokens,
the actor is configs/real_fc.yaml's, the floor's micro-batches compute the whole batch's
gradient, and the plan, the errors and the report name the model and the workload."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_update  # noqa: E402

from toolrl import batch as B  # noqa: E402

TASKS, GROUP = 3, 2  # 6 samples: the long tail is the last one


def _rows_file(tmp_path: Path) -> Path:
    """The NESTFUL rows when `make real-fc-data` made them, else generated FunctionCalling rows
    (the same env and the same checks)."""
    if bench_update.REAL_FC_ROWS.exists():
        return bench_update.REAL_FC_ROWS
    from toolrl.envs.function_calling import FunctionCallingEnv

    rows = [{**r, "env": "toolrl/FunctionCalling-v0"}
            for r in FunctionCallingEnv.make_tasks(8, seed=0)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def real_fc(smollm2_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    rows_file = _rows_file(tmp_path_factory.mktemp("rows"))
    args = bench_update.parse_args(["--workload", "real_fc", "--model", str(smollm2_dir),
                                    "--rows", str(rows_file), "--tasks", str(TASKS),
                                    "--group", str(GROUP)])
    work = bench_update.real_fc_work(args)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return {"work": work, "tokenizer": tokenizer, "rows_file": rows_file,
            "uniform": bench_update.rollout_batch(work, tokenizer.pad_token_id),
            "long": bench_update.rollout_batch(work, tokenizer.pad_token_id,
                                               long_every=bench_update.LONG_EVERY)}


def test_real_fc_prompts_are_the_env_and_template_rendering_and_the_loss_is_the_calls(real_fc):
    import toolrl
    from toolrl.data import load_rows
    from toolrl.rollout.chat import ChatRenderer

    work, tokenizer, td = real_fc["work"], real_fc["tokenizer"], real_fc["uniform"]
    cfg = bench_update.real_fc_config()
    file_rows = load_rows(real_fc["rows_file"])
    ids = [r.get("id") for r in file_rows]
    # the first rows of the file that fit, in file order (skipped ones lie before them)
    where = [ids.index(i) for i in work.rows["ids"]]
    assert where == sorted(where) and len(where) == TASKS
    assert where[-1] + 1 == TASKS + work.rows["skipped_prompt"] + work.rows["skipped_call"]
    assert B.batch_len(td) == TASKS * GROUP
    renderer = ChatRenderer(tokenizer, chat_template_kwargs=cfg.rollout.chat_template_kwargs)
    p = td[B.PROMPTS].shape[1]
    env = toolrl.make_env("toolrl/FunctionCalling-v0")
    try:
        for i in range(TASKS * GROUP):
            row = file_rows[where[i // GROUP]]
            messages, info = env.reset(seed=cfg.seed, options=copy.deepcopy(row))
            prompt = td[B.PROMPTS][i][td[B.ATTENTION_MASK][i, :p].bool()].tolist()
            assert prompt == renderer.render_prompt(messages, info["tools"]), i
            assert len(prompt) <= cfg.rollout.max_prompt_len
            # the response is the oracle's gold calls + eos, and the loss covers exactly them
            calls = tokenizer.encode(env.unwrapped.oracle_action(), add_special_tokens=False)
            real = td[B.ATTENTION_MASK][i, p:].bool()
            assert td[B.RESPONSES][i][real].tolist() == [*calls, tokenizer.eos_token_id], i
            assert td[B.RESPONSE_MASK][i].tolist() == real.int().tolist(), i
            assert len(calls) + 1 <= cfg.rollout.max_tokens_per_turn
    finally:
        env.close()
    # a group's rows share the prompt; advantages live only on the loss tokens
    assert torch_equal(td[B.PROMPTS][0], td[B.PROMPTS][1])
    assert bool((td[B.ADVANTAGES][td[B.RESPONSE_MASK] == 0] == 0).all())


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def test_real_fc_long_tail_runs_one_response_on_to_the_turn_budget(real_fc):
    work, short, long = real_fc["work"], real_fc["uniform"], real_fc["long"]
    assert work.budget == bench_update.real_fc_config().rollout.max_tokens_per_turn == 160
    assert bench_update.long_rows(TASKS * GROUP, bench_update.LONG_EVERY) == [TASKS * GROUP - 1]
    assert bench_update.long_rows(128, 20) == [19, 39, 59, 79, 99, 119]  # calculator's, as ever
    n_short = short[B.RESPONSE_MASK].sum(1)
    n_long = long[B.RESPONSE_MASK].sum(1)
    assert n_long[-1] == work.budget and bool((n_long[:-1] == n_short[:-1]).all())
    k = int(n_short[-1])  # the long response starts with the oracle's calls
    assert long[B.RESPONSES][-1, :k].tolist() == short[B.RESPONSES][-1, :k].tolist()
    assert torch_equal(long[B.PROMPTS], short[B.PROMPTS])


def test_real_fc_actor_is_configs_real_fc_yaml():
    from toolrl.trainer.config import load_config

    cfg = load_config(bench_update.REAL_FC_CONFIG)
    actor = bench_update.real_fc_actor(cfg, Path("m"))
    assert actor.micro_batch_size == cfg.actor.micro_batch_size == 4
    for key in ("dtype", "lr", "lr_schedule", "grad_clip", "ppo_epochs", "ppo_mini_batch_size",
                "loss", "param_dtype", "gradient_checkpointing", "use_remove_padding"):
        assert getattr(actor, key) == getattr(cfg.actor, key), key
    assert actor.model_path == "m" and actor.share_prompts and actor.on_policy
    assert actor.temperature == cfg.rollout.temperature
    args = bench_update.parse_args(["--workload", "real_fc"])
    assert args.output == bench_update.REAL_FC_RESULTS
    assert bench_update.parse_args([]).output == bench_update.RESULTS  # update.md untouched
    assert bench_update.parse_args([]).workload == "calculator"


def test_floor_micro_batches_compute_the_whole_padded_batch(tiny_model_dir):
    """The floor in micro-batches, each cropped to its own extent, takes the gradient of the
    whole padded batch (the calculator workload on the tiny model: fast)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = bench_update.parse_args(["--tasks", "2", "--group", "1", "--model",
                                    str(tiny_model_dir)])
    work = bench_update.calculator_work(args)
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    td = bench_update.rollout_batch(work, pad)  # two questions: prompts and calls differ
    whole = bench_update.floor_micro_batches(td, None)
    micros = bench_update.floor_micro_batches(td, 1)
    assert len(whole) == 1 and whole[0]["input_ids"].shape == td[B.INPUT_IDS].shape
    assert len(micros) == 2 and any(m["input_ids"].shape[1] < td[B.INPUT_IDS].shape[1]
                                    for m in micros)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    grads = []
    losses = []
    for batches in (whole, micros):
        model.zero_grad(set_to_none=True)
        losses.append(bench_update.floor_backward(model, batches))
        grads.append([p.grad.clone() for p in model.parameters()])
    assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-6)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    # the calculator report keeps its title and names its model and workload
    text = bench_update.summarize(work, args, [], _fake_medians(), td, "test machine")
    assert text.startswith("# Actor update vs a bare transformers step\n")
    assert "workload: calculator" in text and f"Model: `{bench_update._rel(work.model)}`" in text


def test_real_fc_dry_run_prints_the_plan(smollm2_dir, tmp_path, capsys):
    rows = _rows_file(tmp_path)
    assert bench_update.main(["--workload", "real_fc", "--dry-run", "--model",
                              str(smollm2_dir), "--rows", str(rows)]) == 0
    out = capsys.readouterr().out
    assert "real_fc" in out and "smollm2-135m-instruct" in out and "4 rows x 4 samples" in out
    assert "micro_batch_size 4" in out and "dtype float32" in out and "160 tokens" in out
    assert "update_real_fc.md" in out


def test_real_fc_without_model_or_rows_fails_in_one_line(smollm2_dir, tmp_path, capsys):
    for argv in (["--rows", str(tmp_path / "none.jsonl"), "--model", str(smollm2_dir)],
                 ["--model", str(tmp_path / "no-model"), "--rows", str(_rows_file(tmp_path))]):
        assert bench_update.main(["--workload", "real_fc", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "make real-fc-data" in err, err


def _fake_medians() -> dict[str, float]:
    med = {}
    for load in ("uniform", "long tail"):
        med[f"{load}: floor, bare transformers step"] = 10.0
        med[f"{load}: toolrl update (default: shared prompts)"] = 8.0
        med[f"{load}: toolrl update, every row whole"] = 11.0
    med["uniform: old-log-prob forward (skipped on-policy)"] = 3.0
    med["SFT step, padded (the warm start before)"] = 4.0
    med["SFT step, common prefix once (the warm start now)"] = 2.0
    return med


def test_real_fc_report_names_the_model_and_the_workload(real_fc):
    import run_all

    work, td = real_fc["work"], real_fc["uniform"]
    argv = ["--workload", "real_fc"]
    args = bench_update.parse_args(argv)
    text = bench_update.summarize(work, args, argv, _fake_medians(), td, "test machine")
    assert text.startswith("# Actor update vs a bare transformers step: "
                           f"{work.model.name} on function-calling rows")
    assert "workload: real_fc" in text and f"Model: `{bench_update._rel(work.model)}`" in text
    assert "micro-batches of 4" in text and "bench_update.py --workload real_fc" in text
    heads = run_all.headlines(text)
    assert len(heads) == 1 and heads[0].startswith(f"**{work.model.name}, function-calling rows")
    assert "0.80x (uniform lengths), 0.80x (17% of responses" in heads[0]
    entry = {b.name: b for b in run_all.BENCHES}["update_real_fc"]
    assert entry.script == "bench_update.py" and entry.args[:2] == ("--workload", "real_fc")
