"""toolrl/BFCLMultiTurn-v0 against BFCL itself: the possible answers played through the env, and
the env's reward held to BFCL's own pipeline on perturbed trajectories.

For every entry of BFCL v4's four scored multi-turn categories (800):

- oracle: the env's oracle plays the possible answer; the env must score it 1.0, and so must
  BFCL (below);
- exactness: scripted policies play the possible answer and perturbations of it through the
  env (`variants`: a call dropped, an argument changed, a clarification skipped (where the
  answer is to ask, the next turn's calls made at once, or a wrong guess), an extra call (one
  that changes a backend's state, one of the next turn's calls made early, a call made twice),
  two calls swapped, calls one per message, a malformed or
  hallucinated call beside the answer, text before the calls (the turn ends early), a policy
  that never stops calling (force-terminated)); the env's reward and BFCL's error type must
  equal BFCL's on every one.

"BFCL" is BFCL's own pipeline on the episode's transcript, independent of the env's
bookkeeping: the messages are cut into user turns at each user message, every assistant
message is decoded as BFCL's hermes-style FC handlers decode one (each ``<tool_call>`` JSON
body, a malformed one skipped; then BFCL's ``convert_to_function_call``), steps without a call
left out; fewer turns than the answer fail as BFCL's force-termination; otherwise BFCL's
``multi_turn_checker`` runs on BFCL's own entry and possible answer, read from the wheel.

It also counts the tokens of every oracle transcript (SmolLM2's chat template, tools
included) per category: the ``max_model_len`` each category needs.

Writes benchmarks/results/bfcl_multi_turn.md and .json.

    .venv/bin/python benchmarks/bench_bfcl_multi_turn.py [--quick] [--limit N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table

RESULTS = benchlib.RESULTS_DIR / "bfcl_multi_turn.md"
ENV_ID = "toolrl/BFCLMultiTurn-v0"
DONE = "Done."
WINDOWS = (8192, 32768)  # SmolLM2's context; Qwen2.5's native one
KINDS = ("gold", "one_per_step", "dropped", "wrong_arg", "skipped_clarification",
         "guessed_clarification", "extra_state_change", "early_call", "duplicate_call",
         "swapped", "malformed_extra", "hallucinated", "text_first", "never_stops")


# --- BFCL's own data and pipeline ------------------------------------------------------------
def bfcl_entries(category: str) -> list[tuple[dict[str, Any], list[list[str]]]]:
    """BFCL's entries of a category with their possible answers, read from the wheel."""
    import bfcl_eval

    data = Path(bfcl_eval.__file__).parent / "data"
    name = f"BFCL_v4_{category}.json"
    questions = [json.loads(x) for x in (data / name).read_text().splitlines() if x.strip()]
    answers = {a["id"]: a["ground_truth"] for a in map(
        json.loads, (data / "possible_answer" / name).read_text().splitlines()) if a}
    return [(q, answers[q["id"]]) for q in questions]


def convert_to_function_call(function_call_list: list[dict[str, Any]]) -> list[str]:
    """BFCL's ``model_handler.utils.convert_to_function_call`` (its module imports tree-sitter,
    not installed here), as BFCL writes it."""
    execution_list = []
    for function_call in function_call_list:
        for key, value in function_call.items():
            if type(value) is str:
                value = json.loads(value)
            execution_list.append(
                f"{key}({','.join([f'{k}={v!r}' for k, v in value.items()])})")
    return execution_list


def decode_execute(text: str) -> list[str]:
    """BFCL's Qwen FC handler's ``decode_execute`` (``_extract_tool_calls``: each
    ``<tool_call>`` JSON body, a malformed one skipped), its pattern relaxed to toolrl's
    rendering (no newline required around the body)."""
    tool_calls = []
    for match in re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.DOTALL):
        try:  # noqa: SIM105 (BFCL's code, as written)
            tool_calls.append(json.loads(match))
        except Exception:
            pass
    if any(type(item) is not dict for item in tool_calls):
        raise ValueError(f"Model did not return a list of function calls: {text}")
    return convert_to_function_call([{c["name"]: c["arguments"]} for c in tool_calls])


def bfcl_verdict(entry: dict[str, Any], truth: list[list[str]],
                 messages: list[dict[str, Any]]) -> tuple[bool, str]:
    """(valid, error type) of BFCL's pipeline on a transcript (module docstring)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils

    turns: list[list[str]] = []
    for m in messages:
        if m["role"] == "user":
            if not turns or turns[-1]:  # consecutive user messages open one turn
                turns.append([])
        elif m["role"] == "assistant":
            turns[-1].append(m["content"])
    decoded = []
    for turn in turns:
        steps = []
        for raw in turn:
            try:
                calls = decode_execute(raw)
            except Exception:
                continue
            if multi_turn_utils.is_empty_execute_response(calls):
                continue
            steps.append(calls)
        decoded.append(steps)
    if len(decoded) != len(truth):
        return False, "multi_turn:force_terminated"
    model = f"bench_{uuid.uuid4().hex}"
    try:
        result = multi_turn_checker.multi_turn_checker(
            decoded, truth, json.loads(json.dumps(entry)), entry["id"].rsplit("_", 1)[0], model)
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(model)]:
            vars(multi_turn_utils).pop(key, None)
    return bool(result["valid"]), "" if result["valid"] else str(result["error_type"])


# --- scripted policies -----------------------------------------------------------------------
def truth_calls(entry: dict[str, Any], truth: list[list[str]]) -> list[list[Any]]:
    from toolrl.core import bfcl_multi_turn as mt

    return [[mt.parse_call_string(s, entry["involved_classes"]) for s in t] for t in truth]


def _changed(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([1, 7, -3])
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        return value + "_x" if value else "x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {**value, "extra": 1}
    return "x"


def wrong_arg(call: Any, rng: random.Random) -> Any:
    from toolrl import ToolCall

    key = rng.choice(sorted(call.arguments))
    return ToolCall(call.name, {**call.arguments, key: _changed(call.arguments[key], rng)})


def state_changing_extra(entry: Any, calls: list[list[Any]], rng: random.Random
                         ) -> tuple[int, Any] | None:
    """(turn, call): a call of the possible answer that, made once more at the end of that
    turn, changes some backend's state (found by running the answer on BFCL's backends)."""
    import copy

    from toolrl.core import bfcl_multi_turn as mt

    candidates = [c for t in calls for c in t]
    turns = [i for i, t in enumerate(calls) if t]
    rng.shuffle(turns)
    for i in turns:
        backends = mt.Backends(entry)
        for turn in calls[:i + 1]:
            for c in turn:
                backends.execute(c)
        before = copy.deepcopy(backends.state())
        for c in rng.sample(candidates, len(candidates)):
            trial = copy.deepcopy(backends)
            trial.execute(c)
            if trial.state() != before:
                return i, c
    return None


def variants(calls: list[list[Any]], seed: str, entry: Any = None
             ) -> dict[str, list[list[Any]]]:
    """Scripts (per user turn, the messages: a list of calls or a text) around the possible
    answer; kinds that do not apply to an entry are left out. ``entry`` (a
    `toolrl.bfcl_multi_turn.Entry`) enables ``extra_state_change``."""
    from toolrl import ToolCall

    rng = random.Random(seed)
    gold = [[list(t)] if t else [] for t in calls]
    out: dict[str, list[list[Any]]] = {"gold": gold,
                                       "one_per_step": [[[c] for c in t] for t in calls]}
    full = [i for i, t in enumerate(calls) if t]

    def edit(turn: int, new: list[Any]) -> list[list[Any]]:
        script = [list(s) for s in gold]
        script[turn] = [new] if new else []
        return script

    if full:
        i = rng.choice(full)
        j = rng.randrange(len(calls[i]))
        out["dropped"] = edit(i, calls[i][:j] + calls[i][j + 1:])
        out["duplicate_call"] = edit(i, calls[i][:j + 1] + calls[i][j:])
        with_args = [(i, j) for i in full for j, c in enumerate(calls[i]) if c.arguments]
        if with_args:
            i, j = rng.choice(with_args)
            out["wrong_arg"] = edit(i, [*calls[i][:j], wrong_arg(calls[i][j], rng),
                                        *calls[i][j + 1:]])
        later = [i for i in full if any(calls[k] for k in range(i + 1, len(calls)))]
        if later:
            i = rng.choice(later)
            k = next(k for k in range(i + 1, len(calls)) if calls[k])
            out["early_call"] = edit(i, [*calls[i], calls[k][0]])
        pairs = [i for i in full if len(calls[i]) >= 2]
        if pairs:
            i = rng.choice(pairs)
            j = rng.randrange(len(calls[i]) - 1)
            swapped = list(calls[i])
            swapped[j], swapped[j + 1] = swapped[j + 1], swapped[j]
            out["swapped"] = edit(i, swapped)
        i = rng.choice(full)
        script = [list(s) for s in gold]
        script[i] = [[*calls[i], "<tool_call>{\"name\": \"ls\", \"arguments\": {</tool_call>"]]
        out["malformed_extra"] = script
        out["hallucinated"] = edit(i, [*calls[i], ToolCall("archive_everything", {}),
                                       ToolCall("len", {"obj": [1]})])
        script = [list(s) for s in gold]
        script[i] = ["Let me do that.", *script[i]]
        out["text_first"] = script
        extra = state_changing_extra(entry, calls, rng) if entry is not None else None
        if extra is not None:
            i, call = extra
            out["extra_state_change"] = edit(i, [*calls[i], call])
    empty = [i for i, t in enumerate(calls) if not t and any(calls[i + 1:])]
    if empty:  # the turn to ask in: the model acts instead
        i = rng.choice(empty)
        k = next(k for k in range(i + 1, len(calls)) if calls[k])
        script = edit(i, list(calls[k]))  # the next turn's calls, guessed right, early
        script[k] = []
        out["skipped_clarification"] = script
        guess = wrong_arg(calls[k][0], rng) if calls[k][0].arguments else calls[k][0]
        out["guessed_clarification"] = edit(i, [guess])  # a wrong guess, then the answer
    return out


class ScriptPolicy:
    """Plays a script: in user turn t (counted from the transcript), message s of the turn is
    ``script[t][s]`` (calls rendered in the env's format, or a text), then ``Done.``;
    ``forever``: a call in every message."""

    def __init__(self, script: list[list[Any]], forever: bool = False) -> None:
        self.script = script
        self.forever = forever

    def __call__(self, env: Any, messages: list[dict[str, Any]]) -> str:
        from toolrl import ToolCall

        if self.forever:
            return env.unwrapped.render_calls([ToolCall("pwd", {})]) \
                if "GorillaFileSystem" in env.unwrapped.entry.involved_classes else \
                env.unwrapped.render_calls([ToolCall("mean", {"numbers": [1.0]})])
        turn, step, previous = -1, 0, None
        for m in messages:
            if m["role"] == "user" and previous != "user":
                turn, step = turn + 1, 0
            elif m["role"] == "assistant":
                step += 1
            previous = m["role"]
        steps = self.script[turn] if turn < len(self.script) else []
        if step >= len(steps):
            return DONE
        message = steps[step]
        if isinstance(message, str):
            return message
        calls = [c for c in message if not isinstance(c, str)]
        raw = "".join(c for c in message if isinstance(c, str))
        return env.unwrapped.render_calls(calls) + raw


# --- the run ---------------------------------------------------------------------------------
def play(env: Any, row: dict[str, Any], policy: Any) -> Any:
    from toolrl import run_episode

    return asyncio.run(run_episode(env, policy=policy, row=row, max_steps=10_000))


def run(categories: list[str], limit: int | None, stop_every: int) -> dict[str, Any]:
    from toolrl import data, make_env
    from toolrl.core import bfcl_multi_turn as mt

    env = make_env(ENV_ID)
    out: dict[str, Any] = {"oracle": {}, "exact": {}, "mismatches": [], "transcripts": {}}
    for category in categories:
        entries = bfcl_entries(category)[:limit]
        rows = {r["id"]: r for r in data.load_bfcl_multi_turn(category, limit=limit)}
        oracle = Counter()
        exact: dict[str, Counter] = {k: Counter() for k in KINDS}
        out["transcripts"][category] = []
        for n, (entry, truth) in enumerate(entries):
            row = rows[entry["id"]]
            traj = play(env, row, lambda e, m: e.unwrapped.oracle_action())
            valid, error_type = bfcl_verdict(entry, truth, traj.messages)
            oracle["entries"] += 1
            oracle["env"] += bool(traj.success)
            oracle["bfcl"] += valid
            out["transcripts"][category].append((traj.messages, traj.tools))
            scripts = variants(truth_calls(entry, truth), f"{entry['id']}",
                               mt.Entry.from_row(row))
            policies = {k: ScriptPolicy(s) for k, s in scripts.items()}
            if n % stop_every == 0:
                policies["never_stops"] = ScriptPolicy([], forever=True)
            for kind, policy in policies.items():
                traj = play(env, row, policy)
                valid, error_type = bfcl_verdict(entry, truth, traj.messages)
                mine = traj.final_state["bfcl"]
                exact[kind]["total"] += 1
                exact[kind]["bfcl_valid"] += valid
                if bool(traj.success) != valid or mine["error_type"] != error_type:
                    exact[kind]["mismatches"] += 1
                    out["mismatches"].append({"id": entry["id"], "kind": kind,
                                              "env": [bool(traj.success), mine["error_type"]],
                                              "bfcl": [valid, error_type]})
        out["oracle"][category] = dict(oracle)
        out["exact"][category] = {k: dict(v) for k, v in exact.items() if v}
    env.close()
    return out


def composite_report() -> dict[str, Any]:
    """The unused composite set: how many of its entries the row check keeps, and what they
    share with the four scored categories (`toolrl.data.contamination`, the recipe's check:
    a shared question, a 13-word run; plus identical initial configurations)."""
    from toolrl.core import bfcl_multi_turn as mt
    from toolrl.data import check_rows, load_bfcl_multi_turn
    from toolrl.data.contamination import check_contamination

    rows = load_bfcl_multi_turn("multi_turn_composite")
    report = check_rows(rows, "composite")
    bad = {p.index for p in report.blocking}
    kept = [r for i, r in enumerate(rows) if i not in bad]
    scored = [r for c in mt.MULTI_TURN_CATEGORIES for r in load_bfcl_multi_turn(c)]
    overlap = check_contamination(kept, scored)
    configs = {json.dumps(r["initial_config"], sort_keys=True) for r in scored}
    return {"entries": len(rows), "playable": len(kept),
            "refused": {k: n for k, n in report.counts().items()},
            "shared_questions": len(overlap.shared_questions),
            "ngram_overlaps": len(overlap.ngram_overlaps),
            "flagged": len(overlap.flagged),
            "same_initial_config": sum(json.dumps(r["initial_config"], sort_keys=True)
                                       in configs for r in kept),
            "examples": [list(x) for x in overlap.ngram_overlaps[:3]]}


def transcript_tokens(transcripts: dict[str, list[Any]], model: Path) -> dict[str, Any] | None:
    """Tokens of each oracle transcript (the model's chat template, tools included), per
    category: max, 95th percentile, median."""
    if not (model / "config.json").exists():
        return None
    from transformers import AutoTokenizer

    from toolrl.rollout.chat import ChatRenderer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(model))
    out = {}
    for category, items in transcripts.items():
        counts = sorted(len(renderer.render_prompt(m, t)) for m, t in items)
        out[category] = {"max": counts[-1], "p95": counts[int(0.95 * (len(counts) - 1))],
                         "median": counts[len(counts) // 2], "entries": len(counts),
                         **{f"within_{n}": sum(c <= n for c in counts) for n in WINDOWS}}
    return out


def report(result: dict[str, Any], tokens: dict[str, Any] | None, seconds: float,
           argv: list[str], machine: str, model: Path) -> str:
    total = sum(v.get("total", 0) for c in result["exact"].values() for v in c.values())
    bad = len(result["mismatches"])
    oracle = result["oracle"]
    entries = sum(o["entries"] for o in oracle.values())
    env_ok = sum(o["env"] for o in oracle.values())
    bfcl_ok = sum(o["bfcl"] for o in oracle.values())
    lines = [
        "## BFCL multi-turn: the possible answers and reward exactness against BFCL itself",
        "",
        f"**{bad} of {total:,} trajectories differ from BFCL's own verdict; the possible "
        f"answers score {env_ok} of {entries} in the env and {bfcl_ok} of {entries} by "
        f"BFCL.**",
        "",
        f"{total:,} trajectories played through `{ENV_ID}` and scored by BFCL's own pipeline "
        f"on their transcripts (BFCL's hermes-style FC decoding + `multi_turn_checker`): "
        f"**{bad} differ** in verdict or error type. The possible answers, played by the "
        f"env's oracle, score {env_ok} of {entries} in the env and {bfcl_ok} of {entries} by "
        f"BFCL. {seconds:.0f} s in all.",
        "",
        f"Machine: {machine}. Command: "
        f"`{benchlib.command_line('bench_bfcl_multi_turn.py', argv)}`.",
        "",
        md_table(["category", "entries", "env oracle = 1.0", "BFCL on its transcript = 1.0"],
                 [(c, o["entries"], o["env"], o["bfcl"]) for c, o in oracle.items()]),
        "",
        "Exactness (trajectories per kind, how many BFCL passes, mismatches with the env):",
        "",
    ]
    kinds = [k for k in KINDS if any(k in c for c in result["exact"].values())]
    rows = []
    for kind in kinds:
        cells = [result["exact"][c].get(kind, {}) for c in result["exact"]]
        rows.append((kind, sum(x.get("total", 0) for x in cells),
                     sum(x.get("bfcl_valid", 0) for x in cells),
                     sum(x.get("mismatches", 0) for x in cells)))
    rows.append(("all", total, sum(r[2] for r in rows), bad))
    lines += [md_table(["kind", "trajectories", "BFCL valid", "mismatches"], rows), ""]
    if tokens:
        lines += [f"Tokens of the oracle's whole transcript ({model.name}'s chat template, "
                  f"the tools' schemas included; a policy's own episodes run longer when it "
                  f"explores):", "",
                  md_table(["category", "max", "p95", "median",
                            *(f"within {n:,}" for n in WINDOWS)],
                           [(c, t["max"], t["p95"], t["median"],
                             *(f"{t[f'within_{n}']} of {t['entries']}" for n in WINDOWS))
                            for c, t in tokens.items()]),
                  ""]
        longest = max(t["max"] for t in tokens.values())
        lines += [f"The longest transcript needs `max_model_len` >= {longest:,} tokens "
                  f"(+ the last turn's response).", ""]
    composite = result.get("composite")
    if composite:
        c = composite
        refused = ", ".join(f"{n} {k}" for k, n in c["refused"].items())
        lines += [f"The unused `multi_turn_composite` set: the row check keeps {c['playable']} "
                  f"of its {c['entries']} entries (refused: {refused}: their possible answers "
                  f"call functions or pass arguments the backends no longer have, or do not "
                  f"parse). It is **not** free of the scored categories: of the "
                  f"{c['playable']} kept, {c['flagged']} share a question "
                  f"({c['shared_questions']}) or a 13-word run ({c['ngram_overlaps']}) with "
                  f"an entry of the four scored categories (`toolrl data contamination`), "
                  f"and {c['same_initial_config']} start from an initial configuration one of "
                  f"them also starts from: composite re-words and re-splits the base "
                  f"scenarios. A run trained on it has seen those scenarios; `toolrl eval` "
                  f"leaves the overlapping rows out of BFCL's figures and says how many.", ""]
        lines += [f"- e.g. composite `{a}` / scored `{b}`: \"{span}\"" for a, b, span in
                  c["examples"]] + [""]
    for m in result["mismatches"][:10]:
        lines.append(f"- mismatch: {m['id']} ({m['kind']}): env {m['env']}, BFCL {m['bfcl']}")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    from toolrl.core import bfcl_multi_turn as mt

    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 entries per category")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--limit", type=int, default=None, help="entries per category")
    p.add_argument("--stop-every", type=int, default=10, help="a never-stopping policy on every "
                   "Nth entry (21 steps each)")
    p.add_argument("--model", type=Path, default=benchlib.MODELS_DIR / "smollm2-135m-instruct",
                   help="whose chat template counts the transcripts' tokens (skipped when "
                   "missing)")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.limit = min(args.limit or 5, 5)
    categories = list(mt.MULTI_TURN_CATEGORIES)
    if args.dry_run:
        print(f"bfcl multi-turn plan: {categories}, {args.limit or 'all'} entries each, "
              f"{len(KINDS)} kinds of trajectories -> {args.output}")
        return 0
    machine = benchlib.machine_label()
    start = time.perf_counter()
    result = run(categories, args.limit, args.stop_every)
    seconds = time.perf_counter() - start
    tokens = transcript_tokens(result.pop("transcripts"), args.model)
    result["composite"] = composite_report()
    text = report(result, tokens, seconds, argv, machine, args.model)
    benchlib.write_result(args.output, text)
    args.output.with_suffix(".json").write_text(json.dumps(
        {"machine": machine, "command": benchlib.command_line("bench_bfcl_multi_turn.py", argv),
         "date": time.strftime("%Y-%m-%d"), "seconds": round(seconds, 1), **result,
         "tokens": tokens}, indent=2) + "\n")
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
