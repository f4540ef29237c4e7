"""``toolrl train --dry-run`` and ``toolrl train`` run one check of every task row
(`toolrl.trainer.preflight.check_task_rows`) and agree on every file of a set of good and bad
data files: the same verdict, the same counts, the same offenders. Train is stopped where it
would start workers (nothing is started)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from toolrl.envs.function_calling import FunctionCallingEnv

from toolrl.cli import main
from toolrl.trainer.config import load_config
from toolrl.trainer.dry_run import dry_run
from toolrl.trainer.trainer import Trainer

CONFIG = """\
experiment_name: row_check
env: {id: toolrl/FunctionCalling-v0}
warm_start: {enabled: false}
rollout: {max_turns: 1, max_tokens_per_turn: 64, max_total_tokens: 640, max_prompt_tokens: 512,
          engine: {max_model_len: 640}}
reward: {rewards: [{name: bfcl_ast}]}
"""


def _tool(name: str, props: dict, required: list[str], description: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props, "required": required}}}


ROUTE = _tool("plan_route", {"city": {"type": "string"},
                             "optimize_route": {"type": "boolean"}}, ["city", "optimize_route"])
AREA = _tool("calculate_triangle_area", {"base": {"type": "integer"},
                                         "height": {"type": "integer"}}, ["base", "height"])


def _row(row_id: str, tools: list[dict], truth: list[dict], text: str = "Do it.") -> dict:
    return {"id": row_id, "messages": [{"role": "user", "content": text}], "tools": tools,
            "ground_truth": truth}


GOOD = FunctionCallingEnv.make_tasks(6, seed=0, categories=["simple", "multiple"])
BAD = {
    "duplicate_tools": _row("dup", [ROUTE, ROUTE], [{"plan_route": {
        "city": ["Oslo"], "optimize_route": [True]}}]),
    "unknown_type": _row("strnig", [_tool("f", {"x": {"type": "strnig"}}, ["x"])],
                         [{"f": {"x": ["a"]}}]),
    "gold_fails_schema": _row("bool", [ROUTE], [{"plan_route": {
        "city": ["Oslo"], "optimize_route": ["time"]}}]),
    "required_may_be_omitted": _row("omit", [ROUTE], [{"plan_route": {
        "city": [""], "optimize_route": [True]}}]),
    "not_offered": _row("shifted", [AREA], [{"math.factorial": {"number": [5]}}]),
    "over_budget": _row("long", [_tool("f", {"x": {"type": "string"}}, ["x"],
                                       "word " * 400)], [{"f": {"x": ["a"]}}]),
}


def _files(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """(train, val) per case: the good rows, or the good rows with one bad row in train."""
    files = {}
    for name, bad in [("good", None), *BAD.items()]:
        train, val = tmp_path / f"{name}_train.jsonl", tmp_path / f"{name}_val.jsonl"
        rows = GOOD[:4] + ([bad] if bad else [])
        train.write_text("".join(json.dumps(r) + "\n" for r in rows))
        val.write_text("".join(json.dumps(r) + "\n" for r in GOOD[4:]))
        files[name] = (train, val)
    return files


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


def _overrides(tiny_model_dir: Path, train: Path, val: Path, out: Path) -> list[str]:
    return [f"model.path={tiny_model_dir}", f"data.train_file={train}",
            f"data.val_file={val}", f"trainer.output_dir={out}"]


class ReachedWorkers(Exception):
    """Train got past every check of its rows: it would start workers now."""


@pytest.mark.parametrize("case", ["good", *BAD])
def test_dry_run_and_train_agree(case, tmp_path, tiny_model_dir, monkeypatch, capsys):
    train, val = _files(tmp_path)[case]
    overrides = _overrides(tiny_model_dir, train, val, tmp_path / "run")

    out = io.StringIO()
    report = dry_run(load_config(_config(tmp_path), overrides), tasks=3,
                     console=Console(file=out, width=200))
    row_problems = [p for p in report.problems if "rows" in p.splitlines()[0]]

    def stop(self, *args, **kwargs):
        raise ReachedWorkers

    monkeypatch.setattr(Trainer, "start_workers", stop)
    capsys.readouterr()
    try:
        code = main(["train", "--config", str(_config(tmp_path)), *overrides])
    except ReachedWorkers:
        code = None
    err = capsys.readouterr().err
    if case == "good":
        assert report.ok, report.problems
        assert "no problems found" in out.getvalue()
        assert code is None, err  # train too went on to start workers
        return
    assert not report.ok and "no problems found" not in out.getvalue()
    assert code == 2, err
    refused = err.removeprefix("toolrl train: ").rstrip("\n")
    assert row_problems == [refused]  # the same verdict, counts and offenders
    if case == "over_budget":
        assert refused.startswith("1 of 5 train rows have a first prompt"), refused
    else:
        assert refused.startswith("train rows: 1 of 5 rows have problems ("), refused
        assert re.search(r"^  row 4 \(id '\w+'\): ", refused, re.M), refused


def test_the_reasons_name_what_is_wrong(tmp_path):
    from toolrl.data import check_rows

    report = check_rows(list(BAD.values()), "rows")
    reasons = {p.row_id: p.line() for p in report.problems}
    assert "two tools are named 'plan_route'" in reasons["dup"]
    assert "'strnig'" in reasons["strnig"] and "invalid tool schema" in reasons["strnig"]
    assert "optimize_route" in reasons["bool"] and "boolean" in reasons["bool"]
    assert "BFCL's mark for 'may be omitted'" in reasons["omit"]
    assert "'math.factorial' is not among the row's tools (calculate_triangle_area)" in \
        reasons["shifted"]
    assert "long" not in reasons  # the budget needs a tokenizer: check_task_rows counts it
    assert report.headline().startswith("rows: 5 of 6 rows have problems (")


def test_dry_run_never_plays_a_row_twice(tmp_path, tiny_model_dir):
    """A 2-row file as both train and val file: two distinct episodes, not one row twice."""
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GOOD[:2]))
    cfg = load_config(_config(tmp_path), _overrides(tiny_model_dir, path, path, tmp_path / "run"))
    report = dry_run(cfg, tasks=4, console=Console(file=io.StringIO()))
    played = [p.task_id for p in report.prompts]
    assert sorted(played) == sorted(r["id"] for r in GOOD[:2]), played


def test_an_oracle_failure_names_the_checkers_reason():
    """A row at fault (here: an env that let a bad row through) is reported with the reason
    the env's check gave, not only 'check evaluate() and oracle_action()'."""
    from toolrl.core.trajectory import Trajectory
    from toolrl.rollout.worker import RolloutConfig
    from toolrl.trainer.dry_run import DryRunReport, _check_oracle

    traj = Trajectory(row={"id": "bool"})
    traj.finish("terminated", {"success": False}, {"valid": False, "error":
                "plan_route: Invalid value for parameter 'optimize_route'"})
    report = DryRunReport(1, 0, 512, 640)
    _check_oracle([traj], RolloutConfig(), report)
    assert report.problems == [
        "the oracle failed 1 of 1 tasks that it ended itself (task 'bool': plan_route: Invalid "
        "value for parameter 'optimize_route'): check that row's ground truth, or the env's "
        "evaluate() and oracle_action()"]


def test_oracle_tool_errors_are_a_problem():
    """'oracle tool errors 1' next to 'no problems found' was a contradiction."""
    from toolrl.core.trajectory import Trajectory, TurnRecord
    from toolrl.rollout.worker import RolloutConfig
    from toolrl.trainer.dry_run import DryRunReport, _check_oracle

    traj = Trajectory(row={"id": "bool"})
    traj.turns.append(TurnRecord(action="x", errors=[{
        "type": "wrong_type", "message": "argument 'optimize_route' must be boolean"}]))
    traj.finish("terminated", {"success": True})
    report = DryRunReport(1, 0, 512, 640)
    _check_oracle([traj], RolloutConfig(), report)
    assert len(report.problems) == 1 and "the oracle made tool errors in 1 of 1 tasks (task " \
        "'bool': wrong_type: argument 'optimize_route' must be boolean)" in report.problems[0]
