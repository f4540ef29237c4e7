"""configs/real_fc.yaml (the real-model recipe) passes its dry run with SmolLM2's real
tokenizer and tools template, on NESTFUL rows converted as the recipe converts them (the
slice in tests/data/nestful/), the warm start reading its rows from a file; and the
recipe's 9:1 split of those rows is disjoint and stable."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from toolrl.cli import main
from toolrl.trainer.config import load_config
from toolrl.trainer.dry_run import dry_run

ROOT = Path(__file__).resolve().parents[2]


def test_the_recipe_config_passes_its_dry_run_on_smollm2(smollm2_dir, tmp_path, monkeypatch):
    folder = tmp_path / "nestful"
    shutil.copytree(ROOT / "tests" / "data" / "nestful", folder)
    rows = tmp_path / "data" / "real_fc" / "nestful.jsonl"
    assert main(["data", "convert", "--from", "nestful", str(folder), "--out", str(rows)]) == 0
    for name in ("sft_train.jsonl", "sft_val.jsonl", "rl_unfit.jsonl"):
        shutil.copy(rows, rows.with_name(name))
    monkeypatch.chdir(tmp_path)  # the config's data/real_fc/ paths resolve here
    cfg = load_config(ROOT / "configs" / "real_fc.yaml", [
        f"model.path={smollm2_dir}", f"trainer.output_dir={tmp_path / 'run'}"])
    assert cfg.warm_start.enabled and cfg.warm_start.train_file
    report = dry_run(cfg, tasks=4)
    assert report.ok, report.problems
    assert report.policies[0].policy == "oracle" and report.policies[0].success == 1.0


def test_a_missing_warm_start_file_is_one_line(smollm2_dir, tmp_path, capsys):
    assert main(["train", "--config", str(ROOT / "configs" / "real_fc.yaml"), "--dry-run",
                 f"model.path={smollm2_dir}", f"data.train_file={ROOT / 'README.md'}",
                 f"data.val_file={ROOT / 'README.md'}",
                 f"warm_start.train_file={tmp_path / 'none.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"toolrl train: warm_start.train_file='{tmp_path / 'none.jsonl'}': "
                          f"the task file does not exist")


def test_the_recipe_splits_rows_nine_to_one_by_id(tmp_path):
    spec = importlib.util.spec_from_file_location("real_fc", ROOT / "recipes" / "real_fc.py")
    real_fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_fc)
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(200)))
    assert real_fc.split_rows(source, tmp_path / "t.jsonl", tmp_path / "v.jsonl") == (179, 21)
    train = {json.loads(x)["id"] for x in (tmp_path / "t.jsonl").read_text().splitlines()}
    val = {json.loads(x)["id"] for x in (tmp_path / "v.jsonl").read_text().splitlines()}
    assert not train & val and len(train | val) == 200


def test_the_recipe_caps_rl_rows_per_category_by_id(tmp_path):
    spec = importlib.util.spec_from_file_location("real_fc", ROOT / "recipes" / "real_fc.py")
    real_fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_fc)
    rows = [{"id": f"{c}_{i}", "category": c} for c, n in (("a", 9), ("b", 2)) for i in range(n)]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert real_fc.cap_per_category(source, tmp_path / "capped.jsonl", 3) == {"a": 3, "b": 2}
    kept = [json.loads(x) for x in (tmp_path / "capped.jsonl").read_text().splitlines()]
    source.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    real_fc.cap_per_category(source, tmp_path / "again.jsonl", 3)  # the file's order is moot
    again = [json.loads(x) for x in (tmp_path / "again.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in kept) == sorted(r["id"] for r in again)
    assert len(kept) == 5


def test_the_recipe_gives_half_the_live_rows_to_the_warm_start(tmp_path):
    spec = importlib.util.spec_from_file_location("real_fc", ROOT / "recipes" / "real_fc.py")
    real_fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_fc)
    for name in ("nestful_train", "nestful_val"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"id": name}) + "\n")
    live = [{"id": f"live_{i}", "category": "live_simple"} for i in range(400)]
    source = tmp_path / "live.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in live))
    counts = real_fc.split_live(source, tmp_path)
    ids = {name: [json.loads(x)["id"] for x in (tmp_path / f"{name}.jsonl").read_text()
                  .splitlines()] for name in ("sft_train", "sft_val", "rl_train")}
    assert ids["sft_train"][0] == "nestful_train" and ids["sft_val"][0] == "nestful_val"
    live_ids = {name: set(part) - {"nestful_train", "nestful_val"} for name, part in ids.items()}
    assert sum(map(len, live_ids.values())) == 400 == sum(counts.values())
    assert not (live_ids["sft_train"] & live_ids["sft_val"] or live_ids["rl_train"] &
                (live_ids["sft_train"] | live_ids["sft_val"]))
    assert 150 < counts["rl_train"] < 250 and 5 < counts["sft_val"] < 40
    source.write_text("".join(json.dumps(r) + "\n" for r in reversed(live)))
    real_fc.split_live(source, tmp_path)  # the file's order is moot
    assert {json.loads(x)["id"] for x in (tmp_path / "rl_train.jsonl").read_text()
            .splitlines()} == live_ids["rl_train"]


def test_the_recipe_pairs_one_call_rows_into_two_call_rows():
    spec = importlib.util.spec_from_file_location("real_fc", ROOT / "recipes" / "real_fc.py")
    real_fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_fc)

    def row(i, name, gt=1, system=False):
        tools = [{"type": "function", "function": {"name": name, "parameters": {}}}]
        messages = [{"role": "system", "content": "s"}] * system + \
            [{"role": "user", "content": f"question {i}"}]
        return {"id": f"r{i}", "env": "toolrl/FunctionCalling-v0", "messages": messages,
                "tools": tools, "ground_truth": [{name: {"x": [i]}}] * gt}

    rows = [row(0, "f"), row(1, "f"), row(2, "g"), row(3, "f", gt=2), row(4, "f", system=True)]
    out = real_fc.combine_calls(rows, per_kind=10)
    kinds = [r["id"].split(":")[0] for r in out]
    assert kinds == [r["category"].replace("live", "synth") for r in out]
    assert kinds.count("synth_parallel") == 1  # r0 and r1 alone share their tools and qualify
    assert kinds.count("synth_parallel_multiple") == 4  # (r0|r1, r2) both ways
    for r in out:
        first, second = r["id"].split(":")[1].split("+")
        a, b = rows[int(first[1:])], rows[int(second[1:])]
        assert r["ground_truth"] == a["ground_truth"] + b["ground_truth"]
        assert r["messages"] == [{"role": "user", "content": "question "
                                  f"{first[1:]}\nAlso: question {second[1:]}"}]
        names = [t["function"]["name"] for t in r["tools"]]
        assert len(names) == len(set(names))
        assert len(names) == (1 if r["category"] == "live_parallel" else 2)
    assert real_fc.combine_calls(rows, per_kind=10) == out  # seeded
    assert len(real_fc.combine_calls(rows, per_kind=10, max_tools_chars=100)) == 1


def test_the_recipe_gives_questions_tools_that_do_not_fit_as_no_call_rows():
    spec = importlib.util.spec_from_file_location("real_fc", ROOT / "recipes" / "real_fc.py")
    real_fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_fc)

    def row(i, name, gt=1):
        tools = [{"type": "function", "function": {"name": name, "parameters": {}}}]
        return {"id": f"r{i}", "env": "toolrl/FunctionCalling-v0",
                "messages": [{"role": "user", "content": f"question {i}"}],
                "tools": tools, "ground_truth": [{name: {"x": [i]}}] * gt}

    # r0/r1 share a word in their names (never paired), r3 needs two calls, r4 no call
    rows = [row(0, "get_weather"), row(1, "weather.now"), row(2, "book_flight"),
            row(3, "send_mail", gt=2), row(4, "sort_list", gt=0)]
    out = real_fc.mismatch_tools(rows, n=10)
    pairs = {tuple(r["id"].split(":")[1].split("+")) for r in out}
    assert pairs == {("r0", "r2"), ("r2", "r0"), ("r1", "r2"), ("r2", "r1")}
    for r in out:
        question, tools = (rows[int(i[1:])] for i in r["id"].split(":")[1].split("+"))
        assert r["messages"] == question["messages"] and r["tools"] == tools["tools"]
        assert r["ground_truth"] == [] and r["category"] == "live_irrelevance"
    assert real_fc.mismatch_tools(rows, n=10) == out  # seeded
    assert len(real_fc.mismatch_tools(rows, n=2)) == 2


def test_more_sft_trains_on_rl_rows_gold_calls_for_the_rl_steps_wall_time(
        tiny_model_dir, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("real_fc", ROOT / "recipes" / "real_fc.py")
    real_fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_fc)
    rows = tmp_path / "data" / "real_fc" / "nestful.jsonl"
    assert main(["data", "convert", "--from", "nestful", str(ROOT / "tests" / "data" / "nestful"),
                 "--out", str(rows)]) == 0
    lines = rows.read_text().splitlines(keepends=True)
    assert len(lines) == 2
    rows.with_name("rl.jsonl").write_text(lines[0] * 3)
    for name in ("sft_train.jsonl", "sft_val.jsonl"):
        rows.with_name(name).write_text(lines[1])
    out = tmp_path / "run"
    shutil.copytree(tiny_model_dir, out / "warm_start")
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 0, "val/success": 0.5}, {"step": 1, "timing/step_s": 0.25},
        {"step": 2, "timing/step_s": 0.25})))
    monkeypatch.chdir(tmp_path)  # the config's data/real_fc/ paths resolve here
    real_fc.sft_more(out, [f"model.path={tiny_model_dir}", "data.train_file=data/real_fc/rl.jsonl"])
    metrics = json.loads((out / "sft_more" / "warm_start_metrics.json").read_text())
    assert metrics["rl_seconds"] == 0.5 and metrics["warm_start/stopped"] == "seconds"
    assert metrics["warm_start/transcripts"] == 3  # RL's rows, not the warm start's
    assert metrics["base_model"] == str(out / "warm_start")
    assert (out / "sft_more" / "config.json").exists()


def test_the_recipe_holds_out_a_quarter_of_each_live_category_for_the_evaluation(tmp_path):
    """The evaluation's Live columns are over rows no training set holds: 1 in LIVE_EVAL of
    each category by a hash of its id (another hash than the warm start / RL split's)."""
    spec = importlib.util.spec_from_file_location("real_fc", ROOT / "recipes" / "real_fc.py")
    real_fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_fc)
    live = [{"id": f"{c}_{i}", "category": c} for c in ("live_simple", "live_multiple")
            for i in range(400)]
    source = tmp_path / "live.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in live))
    held, rest = real_fc.hold_out_live(source, tmp_path / "held.jsonl", tmp_path / "rest.jsonl")

    def ids(name):
        return [json.loads(x)["id"] for x in (tmp_path / name).read_text().splitlines()]

    assert held + rest == 800 and not set(ids("held.jsonl")) & set(ids("rest.jsonl"))
    for category in ("live_simple", "live_multiple"):
        n = sum(i.startswith(category) for i in ids("held.jsonl"))
        assert 70 < n < 130  # ~100 of 400
    source.write_text("".join(json.dumps(r) + "\n" for r in reversed(live)))
    real_fc.hold_out_live(source, tmp_path / "again.jsonl", tmp_path / "rest2.jsonl")
    assert set(ids("again.jsonl")) == set(ids("held.jsonl"))  # the file's order is moot


def test_recorded_scores_render_to_bfcl_columns_and_a_plot(tmp_path):
    """The guide's table comes from the counts kept in benchmarks/results/real_fc.json: the mean
    of the five and BFCL's Non-Live Overall (Simple AST = Python, Java, JavaScript averaged,
    irrelevance outside it) computed here, not typed in."""
    spec = importlib.util.spec_from_file_location("real_fc", ROOT / "recipes" / "real_fc.py")
    real_fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_fc)
    source = tmp_path / "scores.json"
    source.write_text(json.dumps({"title": "t", "times": {"train": "1 min"}, "checkpoints": [
        {"label": "a", "counts": {"simple_python": [148, 400], "multiple": [54, 200],
                                  "parallel": [7, 200], "parallel_multiple": [3, 200],
                                  "irrelevance": [91, 240]}}]}))
    text = real_fc.recorded(source, tmp_path / "scores.md", tmp_path / "p.png")
    # BFCL's overall columns count what was not run as 0: Overall 10% x the AST summary
    # (11.1) + 10% x irrelevance (37.9 and live 0: 19.0) = 3.0; no live row was run
    assert ("| a | 37.0 | 27.0 | 3.5 | 1.5 | 37.9 | 21.4 | not run | not run | 11.1 | not run | "
            "not run | 3.0 |") in text
    assert "| train | 1 min |" in text
    assert "Not run here (BFCL counts them 0): " in text  # the only checkpoint: no "for"
    assert (tmp_path / "scores.md").read_text().startswith("# t\n")
    # multi-turn run for one checkpoint: its column is a score, the other's says not run
    multi = {c: [10, 200] for c in ("multi_turn_base", "multi_turn_long_context",
                                    "multi_turn_miss_func", "multi_turn_miss_param")}
    source.write_text(json.dumps({"title": "t", "checkpoints": [
        {"label": "a", "counts": {"simple_python": [148, 400]}},
        {"label": "b", "counts": {"simple_python": [148, 400], **multi}}]}))
    text = real_fc.recorded(source, tmp_path / "scores.md", tmp_path / "p.png")
    rows = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines()
            if line.startswith("| a |") or line.startswith("| b |")}
    assert rows["| a"][-2] == "not run" and rows["| b"][-2] == "5.0"  # Multi Turn Overall
    said = {line.split(" (")[0]: line for line in text.splitlines()
            if line.startswith("Not run here for ")}
    assert "multi_turn_base" in said["Not run here for a"]
    assert "multi_turn" not in said["Not run here for b"]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    shipped = json.loads((ROOT / "benchmarks" / "results" / "real_fc.json").read_text())
    non_live = {"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200,
                "irrelevance": 240, "simple_java": 100, "simple_javascript": 50}
    for checkpoint in shipped["checkpoints"]:  # every non-live row, Java and JavaScript too
        counts = checkpoint["counts"]
        assert {c: n for c, (_, n) in counts.items() if c in non_live} == non_live
