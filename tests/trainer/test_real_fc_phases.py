"""The real-model recipe's phase record (recipes/real_fc.py, ``<out>/phases.json``) and its
progress lines, with every phase replaced by a cheap fake: nothing here fetches, trains or
evaluates a model."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from toolrl.core.bfcl_scores import MULTI_TURN

ROOT = Path(__file__).resolve().parents[2]
RUN = ["data", "machine", "train", "eval_warm_start", "eval_rl", "eval_base"]


def _load():
    spec = importlib.util.spec_from_file_location("real_fc", ROOT / "recipes" / "real_fc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    """The recipe with fake phases that write their outputs; ``recipe.calls`` lists what ran,
    ``recipe.times`` the phase table each report got, ``recipe.fail`` a phase to interrupt."""
    real_fc = _load()
    out = tmp_path / "out"
    monkeypatch.setattr(real_fc, "DATA", tmp_path / "data")
    real_fc.calls, real_fc.times, real_fc.fail = [], [], None
    real_fc.rates, real_fc.dtypes = {}, {}  # the fake machine's matmul rates; eval -> dtype

    def step(name: str) -> None:
        real_fc.calls.append(name)
        if real_fc.fail == name:
            raise KeyboardInterrupt

    def data_phase(bfcl_limit):
        step("data")
        real_fc.DATA.mkdir(parents=True, exist_ok=True)
        (real_fc.DATA / "bfcl.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n')

    def machine_phase(dest):
        step("machine")
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "machine.json").write_text(json.dumps({"matmul_flop_per_s": real_fc.rates}))

    def run(*args):  # the real evaluate() and evaluate_multi_turn() call it with "eval"
        if args[0] == "eval":
            dest = Path(args[args.index("--output-dir") + 1])
            step(dest.name)
            dtype = next(a for a in args if a.startswith("rollout.engine.dtype="))
            real_fc.dtypes[dest.name] = dtype.split("=", 1)[1]
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "results.json").write_text(json.dumps({"bfcl": {}}))
            return ""
        assert args[0] == "train"
        step("train")
        dest = Path(next(a for a in args if a.startswith("trainer.output_dir=")).split("=", 1)[1])
        for folder in ("warm_start", "final_hf"):
            (dest / folder).mkdir(parents=True, exist_ok=True)
            (dest / folder / "config.json").write_text("{}")
        return ""

    def sft_more(dest, overrides):
        step("sft_more")
        (dest / "sft_more").mkdir(exist_ok=True)
        (dest / "sft_more" / "config.json").write_text("{}")

    def report(dest, times):
        real_fc.times.append(dict(times))
        return "report"

    for name, fake in (("data_phase", data_phase), ("machine_phase", machine_phase),
                       ("run", run),
                       ("sft_more", sft_more), ("report", report)):
        monkeypatch.setattr(real_fc, name, fake)
    real_fc.out = out
    return real_fc


def _phases(out: Path) -> dict:
    return json.loads((out / "phases.json").read_text())


def test_a_first_run_records_each_phase_with_its_settings(recipe):
    assert recipe.main(["--out", str(recipe.out), "--seed", "3", "--bfcl-limit", "2",
                        "actor.lr=1e-6"]) == 0
    assert recipe.calls == RUN
    record = _phases(recipe.out)
    assert list(record["phases"]) == RUN and record["unfinished"] == {}
    for entry in record["phases"].values():
        assert entry["seed"] == 3 and entry["bfcl_limit"] == 2
        assert entry["overrides"] == ["actor.lr=1e-6"] and entry["attempts"] == 1
        assert entry["seconds"] >= 0 and datetime.fromisoformat(entry["finished"]).tzinfo
    assert list(recipe.times[-1]) == RUN
    assert all(t.endswith(" min") for t in recipe.times[-1].values())
    assert not list(recipe.out.glob(".*.tmp"))  # written by replacing


def test_a_rerun_skips_recorded_phases_and_reports_their_times(recipe, capsys):
    assert recipe.main(["--out", str(recipe.out)]) == 0
    first = _phases(recipe.out)["phases"]
    recipe.calls.clear()
    capsys.readouterr()
    assert recipe.main(["--out", str(recipe.out)]) == 0
    # redone every run: every --out shares data/real_fc; a resumed run measures its machine
    assert recipe.calls == ["data", "machine"]
    out = capsys.readouterr().out
    when = first["eval_rl"]["finished"][:16].replace("T", " ")
    assert f"=== real_fc: eval_rl: finished in an earlier run ({when}, " in out
    times = recipe.times[-1]
    assert times["eval_rl"] == f"{first['eval_rl']['seconds'] / 60:.1f} min (an earlier run, " \
                               f"{when})"
    assert "earlier" not in times["data"] and "earlier" not in times["machine"]
    again = _phases(recipe.out)["phases"]
    assert {k: v for k, v in again.items() if k not in ("data", "machine")} == \
        {k: v for k, v in first.items() if k not in ("data", "machine")}


def test_an_interrupted_run_keeps_what_finished_and_the_rerun_does_the_rest(recipe, capsys):
    recipe.fail = "eval_warm_start"
    with pytest.raises(KeyboardInterrupt):
        recipe.main(["--out", str(recipe.out)])
    record = _phases(recipe.out)
    assert list(record["phases"]) == ["data", "machine", "train"]
    assert list(record["unfinished"]) == ["eval_warm_start"]
    assert "=== real_fc: eval_warm_start stopped after " in capsys.readouterr().out
    recipe.fail, recipe.calls[:] = None, []
    assert recipe.main(["--out", str(recipe.out)]) == 0
    assert recipe.calls == ["data", "machine", "eval_warm_start", "eval_rl", "eval_base"]
    record = _phases(recipe.out)
    assert list(record["phases"]) == ["data", "machine", "train", "eval_warm_start", "eval_rl",
                                      "eval_base"] and record["unfinished"] == {}
    assert record["phases"]["eval_warm_start"]["attempts"] == 2
    assert recipe.times[-1]["eval_warm_start"].endswith(" min (2 attempts)")


@pytest.mark.parametrize("argv", [["--seed", "1"], ["actor.lr=1e-6"], ["--bfcl-limit", "5"]])
def test_a_phase_recorded_with_other_settings_is_refused(recipe, argv):
    assert recipe.main(["--out", str(recipe.out)]) == 0
    recipe.calls.clear()
    with pytest.raises(SystemExit) as refused:
        recipe.main(["--out", str(recipe.out), *argv])
    message = str(refused.value)
    assert recipe.calls == []  # before anything runs
    assert "real_fc: phase eval_base was recorded in" in message
    assert "seed=0, bfcl_limit=None, overrides=[]" in message
    assert f"use another --out, or delete {recipe.out / 'eval_base'} to redo it" in message
    assert "phase train " in message and "phase eval_rl " in message
    for name in ("eval_base", "eval_warm_start", "eval_rl"):  # deleted: redone, recorded anew
        (recipe.out / name / "results.json").unlink()
    (recipe.out / "final_hf" / "config.json").unlink()
    assert recipe.main(["--out", str(recipe.out), *argv]) == 0
    assert recipe.calls == RUN


def test_outputs_made_before_phases_json_are_still_skipped(recipe, capsys):
    for name in ("eval_base", "final_hf"):
        (recipe.out / name).mkdir(parents=True)
    (recipe.out / "eval_base" / "results.json").write_text("{}")
    (recipe.out / "final_hf" / "config.json").write_text("{}")
    assert recipe.main(["--out", str(recipe.out), "--seed", "1"]) == 0
    assert recipe.calls == ["data", "machine", "eval_warm_start", "eval_rl"]
    assert "eval_base: " in capsys.readouterr().out
    assert recipe.times[-1]["train"] == "not recorded (an earlier run)"
    assert list(_phases(recipe.out)["phases"]) == ["data", "machine", "eval_warm_start",
                                                   "eval_rl"]


def test_the_sft_comparison_phases_are_recorded_too(recipe):
    assert recipe.main(["--out", str(recipe.out), "--sft-comparison"]) == 0
    both = [*RUN[:-1], "sft_more", "eval_sft_more", "eval_base"]
    assert recipe.calls == both and list(_phases(recipe.out)["phases"]) == both


def test_only_data_records_nothing(recipe, capsys):
    assert recipe.main(["--out", str(recipe.out), "--only", "data"]) == 0
    assert recipe.calls == ["data"] and not recipe.out.exists()
    assert "=== real_fc: data done in " in capsys.readouterr().out


def test_the_time_left_comes_from_the_commands_progress_lines(recipe):
    """The lines as rich prints them to a pipe (80 columns, wrapped, a log line's file:line at
    its right), as `toolrl train` and `toolrl eval` do."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=80)
    clock = recipe.PhaseClock("train", grpo_steps=20)
    console.log("warm start step 40/200: loss 0.1234 (mean of the last 40: 0.1500); 28.1 s a "
                "step, at most 75 min left")
    for line in buffer.getvalue().splitlines(keepends=True):
        clock.saw(line)
    assert clock.left().startswith("about 75.0 min left of the warm start (after warm start "
                                   "step 40/200), then 20 GRPO steps, none timed yet")
    buffer.seek(0), buffer.truncate()
    console.print("step    0  val/success=0.100", markup=False, highlight=False)
    for step in (1, 2):  # a step line too long for 80 columns: step_s on the next line
        console.print(f"step {step:>4}  reward_mean=0.410  success=0.200  val/success=0.300  "
                      f"actor/loss=0.010  timing/step_s={60 * step}.000", markup=False,
                      highlight=False)
    for line in buffer.getvalue().splitlines(keepends=True):
        clock.saw(line)
    assert clock.left() == "about 27.0 min left (after GRPO step 2/20)"  # 18 x 90 s
    clock = recipe.PhaseClock("eval_rl")
    buffer.seek(0), buffer.truncate()
    console.log("eval: 256/1240 episodes, success so far 0.312, 2.0 min")
    for line in buffer.getvalue().splitlines(keepends=True):
        clock.saw(line)
    assert clock.left().startswith("about 7.7 min left (after eval 256/1240 episodes)")
    clock = recipe.PhaseClock("train", before=60.0, estimate=600.0)  # an earlier run's time
    assert clock.left() == "about 9.0 min left (an earlier run took 10.0 min)"
    assert recipe.PhaseClock("x", estimate=30.0, before=60.0).left() == \
        "past an earlier run's 0.5 min"
    assert recipe.PhaseClock("x").left() == ""


def test_a_command_streams_its_lines_and_a_silent_one_gets_heartbeats(recipe, monkeypatch,
                                                                      capsys):
    real_fc = _load()  # the real `run`
    monkeypatch.setattr(real_fc, "TOOLRL", sys.executable)
    monkeypatch.setattr(real_fc, "HEARTBEAT_S", 0.1)
    child = ("import time; print('eval: 2/4 episodes, success so far 0.5, 0.5 min', "
             "flush=True); time.sleep(0.6); print('done')")
    assert real_fc.run("-c", child) == "eval: 2/4 episodes, success so far 0.5, 0.5 min\ndone\n"
    assert re.search(r"\[real_fc\] -c: \d+\.\d min so far, nothing printed for \d+\.\d min; "
                     r"about \d+\.\d min left \(after eval 2/4 episodes\)", capsys.readouterr().out)
    with pytest.raises(SystemExit, match=r"`toolrl -c` failed \(exit 3\)"):
        real_fc.run("-c", "raise SystemExit(3)")


def test_ctrl_c_waits_for_the_command_to_stop(recipe, monkeypatch, capsys):
    """Ctrl-C reaches the command once, from the recipe (`toolrl train` checkpoints before it
    exits): the recipe shows its last lines and waits for it, then stops."""
    real_fc = _load()
    monkeypatch.setattr(real_fc, "TOOLRL", sys.executable)
    clock = real_fc.PhaseClock("train")
    seen = clock.saw

    def interrupted(line):
        seen(line)
        if line.startswith("first"):
            raise KeyboardInterrupt

    monkeypatch.setattr(clock, "saw", interrupted)
    monkeypatch.setattr(real_fc, "_clock", clock)
    with pytest.raises(KeyboardInterrupt):
        real_fc.run("-c", "import time\ntry:\n    print('first', flush=True); time.sleep(30)\n"
                          "except KeyboardInterrupt:\n    print('checkpoint written')")
    out = capsys.readouterr().out
    assert "waiting for `toolrl -c` to stop" in out and "checkpoint written" in out


@pytest.mark.parametrize("to_group", [False, True], ids=["kill-pid", "kill-group"])
def test_sigterm_stops_the_command_first_then_the_recipe(to_group):
    """SIGTERM to the recipe (``kill PID``) or to its process group (``kill -TERM -PGID``, a
    scheduler's stop) reaches the running command as one SIGTERM (a second would tell `toolrl
    train` to stop without its checkpoint), and the recipe waits for the command's own clean
    stop before it exits 143. Before, it died at once and the command's next log line hit a
    broken pipe, or the command ran on."""
    child = ("import os, signal, sys, time\n"
             "got = []\n"
             "signal.signal(signal.SIGTERM, lambda *_: got.append(1))\n"
             "print('child: started', os.getpgid(0), os.getpid(), flush=True)\n"
             "while not got:\n"
             "    time.sleep(0.05)\n"
             "time.sleep(1.0)  # a second signal would arrive now\n"
             "print('child: stopped cleanly after', len(got), 'signal(s)', flush=True)\n"
             "sys.exit(143)\n")
    recipe = str(ROOT / "recipes" / "real_fc.py")
    driver = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("real_fc", {recipe!r})
        real_fc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(real_fc)
        real_fc.TOOLRL = sys.executable
        real_fc.stop_on_sigterm()
        try:
            real_fc.run("-c", {child!r})
        except real_fc.Terminated:
            sys.exit(143)
        """)
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("child: started"):
            break
    child_group, child_pid = map(int, lines[-1].split()[-2:])
    assert child_group != os.getpgid(proc.pid)  # a group's signal reaches it only forwarded
    if to_group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, "".join(lines) + rest
    assert "waiting for `toolrl -c` to stop" in rest
    assert "child: stopped cleanly after 1 signal(s)" in rest
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)


def test_seeds_of_rl_share_one_warm_start(recipe, tmp_path):
    """``--warm-start-from OUT``: the warm start and the base and warm-start evaluations are
    OUT's, linked and recorded as OUT recorded them; this run trains RL and evaluates it."""
    assert recipe.main(["--out", str(recipe.out)]) == 0
    recipe.calls.clear()
    seed1 = tmp_path / "seed1"
    argv = ["--out", str(seed1), "--seed", "1", "--warm-start-from", str(recipe.out)]
    assert recipe.main(argv) == 0
    assert recipe.calls == ["data", "machine", "train", "eval_rl"]
    for name in ("warm_start", "eval_base", "eval_warm_start"):
        assert (seed1 / name).is_symlink()
        assert (seed1 / name).resolve() == (recipe.out / name).resolve()
    record = _phases(seed1)["phases"]
    assert record["eval_base"]["shared_from"] == str(recipe.out)
    assert record["eval_base"]["seed"] == 0 and record["train"]["seed"] == 1
    assert record["train"]["warm_start_from"] == str(recipe.out)
    assert "the run in" in recipe.times[-1]["eval_warm_start"]
    recipe.calls.clear()
    assert recipe.main(argv) == 0  # a rerun redoes only what is redone every run
    assert recipe.calls == ["data", "machine"]


def test_a_warm_start_to_share_must_be_finished_and_not_this_run(recipe, tmp_path):
    (recipe.out / "warm_start").mkdir(parents=True)
    (recipe.out / "warm_start" / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        recipe.main(["--out", str(tmp_path / "seed1"), "--warm-start-from", str(recipe.out)])
    assert "has not finished" in str(stop.value)
    assert "eval_warm_start/results.json" in str(stop.value) and "eval_base" not in str(stop.value)
    with pytest.raises(SystemExit) as stop:
        recipe.main(["--out", str(recipe.out), "--warm-start-from", str(recipe.out)])
    assert "names this run's own --out" in str(stop.value)


def test_a_seed_evaluates_the_base_itself_when_the_warm_starts_run_has_not(recipe, tmp_path):
    """The base model's evaluation runs last: a seed may share a warm start whose run has not
    reached it; the seed then evaluates the base itself, into its own folder."""
    recipe.fail = "eval_base"
    with pytest.raises(KeyboardInterrupt):
        recipe.main(["--out", str(recipe.out)])
    recipe.calls.clear()
    recipe.fail = None
    seed1 = tmp_path / "seed1"
    assert recipe.main(["--out", str(seed1), "--seed", "1",
                        "--warm-start-from", str(recipe.out)]) == 0
    assert recipe.calls == ["data", "machine", "train", "eval_rl", "eval_base"]
    assert (seed1 / "warm_start").is_symlink() and not (seed1 / "eval_base").is_symlink()
    assert "shared_from" not in _phases(seed1)["phases"]["eval_base"]


def test_the_report_names_the_machine_and_the_warm_starts_held_out_loss(tmp_path):
    real_fc = _load()
    out = tmp_path / "out"
    for name, loss in (("warm_start", 0.1523), ("sft_more", 0.1498)):
        (out / name).mkdir(parents=True)
        (out / name / "warm_start_metrics.json").write_text(json.dumps({
            "warm_start/val_loss_best": loss, "warm_start/best_step": 100,
            "warm_start/steps": 100.0, "warm_start/stopped": "steps",
            "warm_start/compute_dtype": "bfloat16"}))
    (out / "machine.json").write_text(json.dumps({"label": "a CPU family 1 model 2"}))
    (out / "eval_warm_start").mkdir()
    board = real_fc.board_of_counts({"simple_python": [1, 4], "simple_java": [1, 2]})
    (out / "eval_warm_start" / "results.json").write_text(json.dumps({"bfcl": board}))
    text = real_fc.report(out, {})
    assert text.startswith("Machine: a CPU family 1 model 2.\nWarm start: held-out loss 0.1523 "
                           "(best, at step 100 of 100; stopped: steps; trained in bfloat16).\n"
                           "SFT control: held-out loss 0.1498")
    row = next(line for line in text.splitlines() if line.startswith("| warm start |"))
    assert row.split(" | ")[1:] == ["25.0", "-", "-", "-", "-", "25.0", "50.0", "not run",
                                    "6.2", "not run", "not run", "0.6 |"]


def test_multi_turn_evaluates_the_warm_start_and_rl_last_and_seeds_share_the_first(recipe,
                                                                                  tmp_path):
    assert recipe.main(["--out", str(recipe.out), "--multi-turn"]) == 0
    assert recipe.calls == [*RUN, "eval_multi_turn_warm_start", "eval_multi_turn_rl"]
    recipe.calls.clear()
    seed1 = tmp_path / "seed1"
    assert recipe.main(["--out", str(seed1), "--seed", "1", "--multi-turn",
                        "--warm-start-from", str(recipe.out)]) == 0
    assert recipe.calls == ["data", "machine", "train", "eval_rl", "eval_multi_turn_rl"]
    assert (seed1 / "eval_multi_turn_warm_start").is_symlink()
    assert _phases(seed1)["phases"]["eval_multi_turn_warm_start"]["shared_from"] == \
        str(recipe.out)


def test_a_checkpoints_board_merges_its_single_and_multi_turn_evaluations(tmp_path):
    real_fc = _load()
    out = tmp_path / "out"
    single = real_fc.board_of_counts({"simple_python": [2, 4]})
    multi = real_fc.board_of_counts({c: [1, 4] for c in MULTI_TURN})
    for name, board in (("eval_rl", single), ("eval_multi_turn_rl", multi)):
        (out / name).mkdir(parents=True)
        for v in board["per_category"].values():  # results.json's shape
            v["n"] = v.pop("total")
        (out / name / "results.json").write_text(json.dumps({"bfcl": board}))
    merged = real_fc.checkpoint_board(out, ("eval_rl", "eval_multi_turn_rl"))
    assert merged["multi_turn"]["Multi Turn Overall Acc"] == 0.25
    assert merged["per_category"]["simple_python"]["accuracy"] == 0.5
    assert real_fc.checkpoint_board(out, ("eval_rl", None))["per_category"].keys() == \
        {"simple_python"}
    assert real_fc.checkpoint_board(out, ("eval_base", None)) is None
    text = real_fc.report(out, {})
    row = next(line for line in text.splitlines() if line.startswith("| RL |"))
    assert row.split(" | ")[-2] == "25.0"  # Multi Turn Overall Acc


def test_the_report_accounts_for_each_phases_compute(tmp_path):
    """`compute_account` reads what each command recorded (the warm start's metrics, the RL
    run's perf/* per step, each evaluation's perf) and the report sets each phase's rate beside
    the bare matmul rate of its dtype."""
    real_fc = _load()
    out = tmp_path / "out"
    (out / "warm_start").mkdir(parents=True)
    (out / "warm_start" / "warm_start_metrics.json").write_text(json.dumps({
        "warm_start/tokens": 1000.0, "warm_start/flop_per_token": 6e9,
        "warm_start/train_s": 100.0}))
    steps = [{"step": 0}, *({"step": k, "timing/update_s": 10.0, "perf/update_tokens": 400.0,
                             "perf/update_flop_per_s": 3e11, "timing/rollout_s": 5.0,
                             "perf/rollout_tokens": 100.0, "perf/rollout_flop_per_s": 4e10}
                            for k in (1, 2))]
    (out / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (out / "config.yaml").write_text("rollout: {engine: {dtype: bfloat16}}\n")
    (out / "eval_rl").mkdir()
    (out / "eval_rl" / "results.json").write_text(json.dumps(
        {"bfcl": {"per_category": {}}, "perf": {"tokens": 50.0, "seconds": 2.0,
                                                "flop_per_s": 1e10},
         "engine_dtype": "bfloat16"}))
    rows = {r.phase: r for r in real_fc.compute_account(out)}
    assert list(rows) == ["warm start", "RL update", "RL rollout", "eval (RL)"]
    assert rows["warm start"] == real_fc.Account("warm start", 1000.0, 6e12, 100.0, "float32")
    assert rows["RL update"] == real_fc.Account("RL update", 800.0, 6e12, 20.0, "float32")
    assert rows["RL rollout"].dtype == rows["eval (RL)"].dtype == "bfloat16"
    assert rows["eval (RL)"].flop == 2e10
    table = real_fc.account_table(list(rows.values()), {"float32": 1.2e11})
    assert "| warm start | 1,000 | 6.000 | 100 | 60.0 | float32 | 0.50 |" in table
    assert "| RL update | 800 | 7.500 | 20 | 300.0 | float32 | 2.50 |" in table
    assert table[-1].endswith("| bfloat16 | not measured |")
    (out / "machine.json").write_text(json.dumps(
        {"label": "a CPU", "matmul_flop_per_s": {"float32": 1.2e11, "bfloat16": 6e10}}))
    text = real_fc.report(out, {})
    assert "(a CPU: 120 GFLOP/s float32, 60 GFLOP/s bfloat16)" in text
    assert "| eval (RL) | 50 | 0.400 | 2 | 10.0 | bfloat16 | 0.17 |" in text


def test_the_account_sets_each_training_phase_beside_the_rate_of_the_dtype_it_ran_in(tmp_path):
    """A warm start and an RL actor that computed in bf16 (``actor.param_dtype``, or ``auto``
    timed faster) are counted against the bare bf16 rate, not the fp32 one."""
    real_fc = _load()
    out = tmp_path / "out"
    (out / "warm_start").mkdir(parents=True)
    (out / "warm_start" / "warm_start_metrics.json").write_text(json.dumps({
        "warm_start/tokens": 1000.0, "warm_start/flop_per_token": 6e9,
        "warm_start/train_s": 100.0, "warm_start/compute_dtype": "bfloat16"}))
    (out / "metrics.jsonl").write_text(json.dumps(
        {"step": 1, "timing/update_s": 10.0, "perf/update_tokens": 400.0,
         "perf/update_flop_per_s": 3e11}) + "\n")
    (out / "compute_dtype.json").write_text(json.dumps(
        {"dtype": "bfloat16", "seconds": {"float32": 3.0, "bfloat16": 2.0}, "reason": "timed"}))
    rows = {r.phase: r for r in real_fc.compute_account(out)}
    assert rows["warm start"].dtype == rows["RL update"].dtype == "bfloat16"
    table = real_fc.account_table(list(rows.values()), {"float32": 1.2e11, "bfloat16": 6e11})
    assert "| warm start | 1,000 | 6.000 | 100 | 60.0 | bfloat16 | 0.10 |" in table


def test_the_sft_controls_schedule_spans_rls_time_at_the_warm_starts_pace(tmp_path):
    """A control capped at the warm start's 100 steps would stop before RL's time is spent (the
    warm start ran 100 steps in 2,025 s, RL's steps 2,174 s): its steps come from the time."""
    real_fc = _load()
    metrics = tmp_path / "warm_start_metrics.json"
    assert real_fc.control_steps(2174.0, metrics, 100) == 100  # no pace recorded: the config's
    metrics.write_text(json.dumps({"warm_start/seconds": 2025.0, "warm_start/steps": 100.0}))
    assert real_fc.control_steps(2174.0, metrics, 100) == 108
    assert real_fc.control_steps(5.0, metrics, 100) == 1


FAST_BF16 = {"float32": 1.6e11, "bfloat16": 3.6e11}  # an AMD EPYC family 25 model 17's
SLOW_BF16 = {"float32": 3.2e11, "bfloat16": 1.6e11}  # an Intel Xeon family 6 model 207's


def test_every_evaluation_of_a_run_runs_in_the_dtype_its_machine_chose(recipe, capsys):
    """``--eval-dtype auto``: bf16 where the machine's bare bf16 matmul is faster, pinned by the
    first evaluation for the run's others (and a rerun's), which a clashing --eval-dtype
    cannot change: one table, one dtype."""
    recipe.rates = FAST_BF16
    assert recipe.main(["--out", str(recipe.out), "--sft-comparison"]) == 0
    assert set(recipe.dtypes) == {"eval_warm_start", "eval_rl", "eval_sft_more", "eval_base"}
    assert set(recipe.dtypes.values()) == {"bfloat16"}
    pin = json.loads((recipe.out / recipe.EVAL_DTYPE).read_text())
    assert pin["dtype"] == "bfloat16" and "2.25x" in pin["reason"]
    assert "the engine in bfloat16 (the bare bf16 matmul ran 2.25x" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        recipe.main(["--out", str(recipe.out), "--eval-dtype", "float32"])
    assert "run in bfloat16" in str(stop.value) and "would mix dtypes" in str(stop.value)
    with pytest.raises(SystemExit) as stop:  # argparse's own error: not a dtype it knows
        recipe.main(["--out", str(recipe.out), "--eval-dtype", "float16"])
    assert stop.value.code == 2
    recipe.calls.clear()
    recipe.rates = SLOW_BF16  # resumed on another machine: the pin holds
    (recipe.out / "eval_rl" / "results.json").unlink()
    assert recipe.main(["--out", str(recipe.out), "--eval-dtype", "bfloat16"]) == 0
    assert recipe.calls == ["data", "machine", "eval_rl"]
    assert recipe.dtypes["eval_rl"] == "bfloat16"


@pytest.mark.parametrize("rates, expected", [(SLOW_BF16, "float32"), ({}, "float32"),
                                             (FAST_BF16, "bfloat16")])
def test_auto_takes_bf16_only_where_the_machine_runs_it_faster(recipe, rates, expected):
    recipe.rates = rates
    assert recipe.main(["--out", str(recipe.out)]) == 0
    assert set(recipe.dtypes.values()) == {expected}


def test_a_run_evaluated_before_the_pin_keeps_float32(recipe, capsys):
    """A folder whose evaluations ran before the recipe pinned a dtype ran them in the engine's
    CPU default: its later evaluations (a cut-off run going on, the multi-turn ones) stay in
    float32 on any machine, and asking for bf16 there stops before the training."""
    recipe.fail = "eval_rl"
    with pytest.raises(KeyboardInterrupt):
        recipe.main(["--out", str(recipe.out)])
    (recipe.out / recipe.EVAL_DTYPE).unlink()  # as the recipe before pins left it
    recipe.calls.clear()
    recipe.fail, recipe.rates = None, FAST_BF16
    with pytest.raises(SystemExit) as stop:
        recipe.main(["--out", str(recipe.out), "--eval-dtype", "bfloat16"])
    assert "run in float32" in str(stop.value) and "would mix dtypes" in str(stop.value)
    assert recipe.calls == []
    assert recipe.main(["--out", str(recipe.out), "--multi-turn"]) == 0
    assert recipe.dtypes["eval_rl"] == recipe.dtypes[recipe.MULTI_TURN_EVALS["RL"]] == "float32"
    assert "began before the recipe pinned" in json.loads(
        (recipe.out / recipe.EVAL_DTYPE).read_text())["reason"]


def test_seeds_evaluate_in_the_dtype_of_the_warm_starts_run(recipe, tmp_path):
    """A seed sharing a warm start shares its evaluation: the seed's own evaluations run in the
    dtype the warm start's run pinned, whatever its machine would choose."""
    recipe.rates = FAST_BF16
    assert recipe.main(["--out", str(recipe.out)]) == 0
    recipe.rates, recipe.dtypes = SLOW_BF16, {}
    seed1 = tmp_path / "seed1"
    assert recipe.main(["--out", str(seed1), "--seed", "1",
                        "--warm-start-from", str(recipe.out)]) == 0
    assert recipe.dtypes == {"eval_rl": "bfloat16"}
