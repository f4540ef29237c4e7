"""`toolrl eval`: a model on the config's validation rows, with the config's envs and rewards.

It needs only what evaluation uses: the validation rows (``data.val_file``; no
``data.train_file``), the model and the envs and rewards; a config that asks for GPUs on a
machine without them is one line naming the overrides that run it on CPU (`check_devices`).

Writes ``results.json``: overall success and reward, per category, per env (in a run of
several envs) and, for BFCL rows (``source: "bfcl"``, as `toolrl data convert --from bfcl`
writes them), per BFCL category with the summary and overall averages BFCL's leaderboard
reports (`toolrl.core.bfcl_scores.leaderboard`: non-live with Java and JavaScript, live,
multi-turn, agentic and the overall formula over what was run; each category not run named
with why), so the number can stand beside the leaderboard's. BFCL's figures count only rows
the run did not train on: a BFCL row that shares its id, its question or a 13-word run with a
row the config trains on (``data.train_file`` or the env's own training rows, ``data.mixture``'s
training rows, ``warm_start.train_file``; `toolrl.data.contamination`, the check the
real-model recipe runs) is left out of them, and ``bfcl.training_overlap`` says how many per
category. And each env's own benchmark figures (``env_metrics``: `ToolEnv.eval_metrics`,
e.g. tau2's pass^1..4 per domain; ``--trials K`` plays every row K times for them). Episodes
the infrastructure failed (`Trajectory.infra_failure`: a tool server
down, an env that raised) say nothing about the model: as in validation (``val/infra_failed``)
they are left out of every success and reward figure and counted instead (``infra_failed``,
overall, per kind and per category). A row whose first prompt does not fit
``rollout.max_prompt_tokens`` (kept by ``data.overlong_prompts=filter``, which in training drops
it) is not played: it counts as a failed episode (``finish_reason`` ``context``, its ``error``
saying why; reward 0) in every figure, BFCL's included, as BFCL counts an entry the model could
not take, and ``over_budget`` says how many; a score over only the rows that fit is not the
benchmark's. The episodes run in chunks with a progress line after each (episodes done,
success so far, minutes).

A cut-off evaluation goes on where it stopped: each finished chunk's episodes are appended to
``eval_journal.jsonl`` in the output folder, and the same command run again plays only the
chunks missing from it, with the seeds they would have had, so its results are the
uninterrupted run's (greedy, or seeded sampling). The journal is used only by the evaluation
that wrote it (`evaluation_key`: the model's files, the rows, ``--trials``, the config's
rollout, reward, env and seed), is removed once ``results.json`` is written, and
``resumed_episodes`` says how many episodes came from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from toolrl import batch as B
from toolrl.core.bfcl_scores import leaderboard, leaderboard_tables
from toolrl.core.registration import env_class, env_of
from toolrl.core.trajectory import Trajectory
from toolrl.data.contamination import check_contamination
from toolrl.data.loader import load_rows
from toolrl.models.source import ModelNotFoundError, require_model
from toolrl.registry import RegistryError
from toolrl.rollout.samples import is_episode_lead
from toolrl.trainer.compute import ModelShape, model_shape
from toolrl.trainer.config import ConfigError, ExperimentConfig
from toolrl.trainer.context import RunContext
from toolrl.trainer.mixture import mixture_rows
from toolrl.trainer.preflight import check_devices, fit_prompt_budget
from toolrl.trainer.tracking import redact, secret_values

# episodes per chunk, per concurrent episode (rollout.concurrency): the engine stays full, and a
# progress line comes after each chunk
CHUNK_PER_SLOT = 8
JOURNAL = "eval_journal.jsonl"  # the finished chunks of a cut-off evaluation (module docstring)


def run_evaluation(cfg: ExperimentConfig, model: str, output_dir: str | os.PathLike,
                   console: Console | None = None, save_transcripts: bool = False,
                   trials: int = 1) -> dict[str, Any]:
    """``trials`` episodes of ``model`` per validation row (at ``rollout.val_temperature``:
    greedy at 0); with ``save_transcripts`` every episode also goes to ``transcripts.jsonl``
    (a `Trajectory` per line with the ``reward`` it got, as rollout dumps hold them:
    ``toolrl score`` reads it)."""
    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    check_devices(cfg)  # GPUs asked for on a machine without: say so, name the overrides
    try:
        require_model(model, key="--model")
    except ModelNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    training, training_note = training_rows(cfg)  # before the val rows stand in for them
    _validation_only(cfg)
    cfg.model.path = model
    cfg.model.build_tiny_if_missing = False
    console = console or Console()
    run = RunContext(cfg, console=console)
    try:
        run.model_path = run.prepare_model() if not cfg.warm_start.enabled else model
        _, val_rows = run.load_tasks()
        _, fitting = fit_prompt_budget([], val_rows, cfg, run.model_path, log=console.log)
        unplayed = over_budget(val_rows, fitting, cfg)
        run.start_rollout()
        journal = Journal(Path(output_dir) / JOURNAL,
                          evaluation_key(cfg, run.model_path, fitting, trials), console)
        trajs, scores, seconds = _play(run, fitting, trials, console, journal)
        trajs += [t for t in unplayed for _ in range(trials)]
        scores += [0.0] * (len(unplayed) * trials)
        shape = model_shape(run.model_path)
    finally:
        run.close()
    results = summarize(trajs, scores, cfg.env.id, training=training,
                        training_note=training_note)
    results = {"model": model, "env": cfg.env.id, "trials": trials,
               "engine_dtype": cfg.rollout.engine.resolved().dtype, **results,
               "over_budget": len(unplayed), "resumed_episodes": journal.resumed,
               "perf": eval_account(shape, trajs, seconds)}
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    journal.path.unlink(missing_ok=True)
    if save_transcripts:
        secrets = secret_values()
        with (out / "transcripts.jsonl").open("w", encoding="utf-8") as f:
            for traj, score in zip(trajs, scores, strict=True):
                f.write(json.dumps(redact({"reward": score, **traj.to_dict()}, secrets))
                        + "\n")
    for table in result_tables(results, title=f"eval: {model}"):
        console.print(table)
    if unplayed:
        console.print(f"[yellow]{len(unplayed)} of {len(val_rows)} rows have a first prompt "
                      f"over rollout.max_prompt_tokens={cfg.rollout.max_prompt_len}: not played, "
                      f"each counted a failed episode (reward 0) in every figure[/]")
    if results["infra_failed"]:
        console.print(f"[yellow]{results['infra_failed']} of {results['num_tasks']} episodes "
                      f"failed for infrastructure reasons {results['infra_failed_by_kind']}: "
                      f"left out of success and reward[/]")
    return results


def over_budget(rows: Sequence[Mapping[str, Any]], fitting: Sequence[Mapping[str, Any]],
                cfg: ExperimentConfig) -> list[Trajectory]:
    """The rows `fit_prompt_budget` left out of ``fitting`` (its rows are ``rows``' own objects),
    each as the failed episode it counts as: not played, reward 0."""
    kept = {id(row) for row in fitting}
    why = (f"first prompt over rollout.max_prompt_tokens={cfg.rollout.max_prompt_len}: not "
           f"played, counted a failure")
    return [Trajectory(row=dict(row), finish_reason="context", success=False,
                       error=why) for row in rows if id(row) not in kept]


def eval_account(shape: ModelShape | None, trajs: list[Trajectory], seconds: float
                 ) -> dict[str, float]:
    """The evaluation's compute account: its wall time (the engine's start not counted), the
    tokens of its episodes (prompts and responses, each through the engine at least once) and,
    where the model's shape is known, the forward FLOP/s they make (a lower bound, as
    `toolrl.trainer.compute.rollout_account`)."""
    tokens = sum(t.prompt_tokens + t.response_tokens for t in trajs)
    out = {"seconds": seconds, "tokens": float(tokens)}
    if shape is not None and tokens and seconds > 0:
        lengths = [t.prompt_tokens + t.response_tokens for t in trajs]
        context = sum(n * (n + 1) / 2 for n in lengths) / tokens  # causal, as batch_tokens
        out["flop_per_s"] = shape.flop_per_token(context, training=False) * tokens / seconds
    return out


def evaluation_key(cfg: ExperimentConfig, model_path: str | os.PathLike,
                   rows: Sequence[Mapping[str, Any]], trials: int) -> str:
    """What makes an evaluation's episodes what they are, hashed: the model (a local folder by
    its files' names, sizes and times; else its name), the rows played, ``trials`` and the
    config's rollout, reward, env and seed. A journal is resumed only under the same key."""
    path = Path(model_path)
    files = sorted((str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns)
                   for f in path.rglob("*") if f.is_file()) if path.is_dir() else str(model_path)
    what = [files, list(rows), trials, repr(cfg.rollout), repr(cfg.reward), repr(cfg.env),
            cfg.seed]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


class Journal:
    """``eval_journal.jsonl``: a line per finished chunk (its index, wall time and scored
    episodes) under a first line naming the evaluation (`evaluation_key`). A journal of another
    evaluation is set aside (said, and started anew); a line cut off mid-write is ignored."""

    def __init__(self, path: Path, key: str, console: Console) -> None:
        self.path, self.key, self.resumed = path, key, 0
        self.chunks: dict[int, dict[str, Any]] = {}
        if not path.exists():
            return
        lines = path.read_text(encoding="utf-8").splitlines()
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:  # the last line of a run killed while writing it
                continue
        if not entries or entries[0].get("evaluation") != key:
            console.log(f"eval: {path} holds another evaluation's episodes (model, rows or "
                        f"settings differ): not resumed, starting anew")
            path.unlink()
            return
        self.chunks = {e["chunk"]: e for e in entries[1:] if "chunk" in e}

    def done(self, k: int, expected: int) -> tuple[list[Trajectory], list[float], float] | None:
        """Chunk ``k``'s episodes, scores and seconds if the journal holds all ``expected``."""
        entry = self.chunks.get(k)
        if entry is None or len(entry["episodes"]) != expected:
            return None
        self.resumed += expected
        episodes = [dict(e) for e in entry["episodes"]]
        scores = [float(e.pop("reward")) for e in episodes]
        return [Trajectory.from_dict(e) for e in episodes], scores, float(entry["seconds"])

    def add(self, k: int, trajs: Sequence[Trajectory], scores: Sequence[float],
            seconds: float) -> None:
        """Append chunk ``k``, flushed to disk before the next chunk starts."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        with self.path.open("a", encoding="utf-8") as f:
            if fresh:
                f.write(json.dumps({"evaluation": self.key}) + "\n")
            f.write(json.dumps({"chunk": k, "seconds": seconds, "episodes": [
                {"reward": score, **t.to_dict()} for t, score in zip(trajs, scores, strict=True)
            ]}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _play(run: RunContext, rows: list[dict[str, Any]], trials: int, console: Console,
          journal: Journal | None = None) -> tuple[list[Trajectory], list[float], float]:
    """Every val row ``trials`` times, scored, and the seconds it took: in chunks of
    `CHUNK_PER_SLOT` x ``rollout.concurrency`` episodes, a progress line after each (a long
    eval is never silent). Chunk ``k`` samples with the seed of ``val`` + ``k`` (the first: the
    run's); a chunk the ``journal`` holds is taken from it, with its time, and not replayed."""
    cfg = run.cfg
    per_chunk = max(1, CHUNK_PER_SLOT * cfg.rollout.concurrency // trials)
    trajs: list[Trajectory] = []
    scores: list[float] = []
    seconds = 0.0
    for k, at in enumerate(range(0, len(rows), per_chunk)):
        chunk = rows[at: at + per_chunk]
        earlier = journal.done(k, len(chunk) * trials) if journal is not None else None
        if earlier is not None:
            trajs += earlier[0]
            scores += earlier[1]
            seconds += earlier[2]
            continue
        start = time.monotonic()
        batch = run.rollout(chunk, trials, seed=run.seed_of("val" if k == 0 else f"val{k}"),
                            greedy=cfg.rollout.val_temperature == 0.0)
        run.score(batch)
        samples = B.trajectories(batch)
        # an episode once, by its last sample (per_turn, split agent samples)
        leads = [i for i, t in enumerate(samples) if is_episode_lead(t)]
        totals = batch[B.TOKEN_LEVEL_SCORES].sum(-1).tolist()
        played = [samples[i] for i in leads]
        played_scores = [totals[i] for i in leads]
        trajs += played
        scores += played_scores
        took = time.monotonic() - start
        seconds += took
        if journal is not None:
            journal.add(k, played, played_scores, took)
        done = [t for t in trajs if t.infra_failure is None]
        if len(rows) > per_chunk:
            resumed = f" ({journal.resumed} from {journal.path.name})" if (
                journal is not None and journal.resumed) else ""
            console.log(f"eval: {len(trajs)}/{len(rows) * trials} episodes{resumed}, success "
                        f"so far {sum(t.success for t in done) / max(len(done), 1):.3f}, "
                        f"{seconds / 60:.1f} min")
    return trajs, scores, seconds


def training_rows(cfg: ExperimentConfig) -> tuple[list[dict[str, Any]], str]:
    """The rows the config trains on (RL's rows, from ``data.train_file`` or the env's
    generator, ``data.mixture``'s training rows, ``warm_start.train_file``) and where they came
    from; a file that is not here is named in the note, its rows unknown."""
    data = cfg.data
    rows: list[dict[str, Any]] = []
    found, absent = [], []
    files = [("data.train_file", data.train_file)]
    if cfg.warm_start.enabled:
        files.append(("warm_start.train_file", cfg.warm_start.train_file))
    for key, path in files:
        if not path:
            continue
        if Path(path).exists():
            rows += load_rows(path)
            found.append(f"{key} {path}")
        else:
            absent.append(f"{key} {path} (not found: its rows are not checked)")
    if not data.train_file:
        try:
            rows += env_class(cfg.env.id).make_tasks(data.train_size, seed=cfg.seed,
                                                      split="train", **data.task_kwargs)
            found.append(f"{cfg.env.id}'s {data.train_size} generated training rows")
        except TypeError:  # an env without a generator: nothing to train on here
            pass
    if data.mixture:
        try:
            more, _ = mixture_rows([m for m in data.mixture
                                    if not m.train_file or Path(m.train_file).exists()],
                                   cfg.seed, env_class)
            rows += more
            found.append("data.mixture's training rows")
        except (OSError, ValueError, TypeError) as exc:
            absent.append(f"data.mixture ({type(exc).__name__}: {exc})")
    return rows, "; ".join([*found, *absent]) or "no training rows in the config"


def _validation_only(cfg: ExperimentConfig) -> None:
    """Eval reads the validation rows only: a source with a val file needs no train file (its
    train rows are the val rows, loaded and never used), so a config written for training runs
    without the training data."""
    if cfg.data.val_file:
        cfg.data.train_file = cfg.data.val_file
    for source in cfg.data.mixture:
        if source.val_file:
            source.train_file = source.val_file


def summarize(trajs: Sequence[Trajectory], scores: Sequence[float], default_env: str, *,
              training: Sequence[Mapping[str, Any]] = (), training_note: str = ""
              ) -> dict[str, Any]:
    """Success and reward overall, per category, per env and (BFCL rows) BFCL's averages,
    over the episodes the infrastructure did not fail (``n``); those it failed are counted
    (``infra_failed``) and scored nowhere. A figure over no episode is None. BFCL's figures
    leave out the rows ``training`` overlaps (module docstring)."""
    rows = [t.row for t in trajs]
    failed = {i for i, t in enumerate(trajs) if t.infra_failure is not None}

    def stats(indices: list[int]) -> dict[str, Any]:
        scored = [i for i in indices if i not in failed]
        n = len(scored)
        return {"n": n,
                "success": sum(trajs[i].success for i in scored) / n if n else None,
                "reward_mean": sum(scores[i] for i in scored) / n if n else None,
                "infra_failed": len(indices) - n}

    by_category: dict[str, list[int]] = {}
    by_env: dict[str, list[int]] = {}
    bfcl: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_category.setdefault(str(row.get("category", "all")), []).append(i)
        by_env.setdefault(env_of(row, default_env), []).append(i)
        if row.get("source") == "bfcl" and i not in failed:
            bfcl.setdefault(str(row["category"]), []).append(i)
    kinds: dict[str, int] = {}
    for i in sorted(failed):
        kinds[str(trajs[i].infra_failure)] = kinds.get(str(trajs[i].infra_failure), 0) + 1
    results: dict[str, Any] = {
        "num_tasks": len(rows), **{k: v for k, v in stats(list(range(len(rows)))).items()
                                   if k != "n"},
        "infra_failed_by_kind": dict(sorted(kinds.items())),
        "per_category": {k: stats(v) for k, v in sorted(by_category.items())},
    }
    if len(by_env) > 1:
        results["per_env"] = {k: stats(v) for k, v in sorted(by_env.items())}
    figures = env_metrics(trajs, default_env)
    if figures:
        results["env_metrics"] = figures
    if bfcl:
        seen = trained_on([rows[i] for v in bfcl.values() for i in v], training)
        left_out = {c: [i for i in v if rows[i].get("id") in seen] for c, v in bfcl.items()}
        kept = {c: [i for i in v if rows[i].get("id") not in seen] for c, v in bfcl.items()}
        counts = {c: (sum(trajs[i].success for i in v), len(v))
                  for c, v in sorted(kept.items()) if v}
        results["bfcl"] = {"per_category": {c: {"correct": k, "n": n, "accuracy": k / n}
                                            for c, (k, n) in counts.items()},
                           **leaderboard(counts),
                           "training_overlap": {
                               "training_rows": len(training), "sources": training_note,
                               "rule": "a BFCL row sharing its id, its question or a 13-word "
                                       "run with a training row is left out of BFCL's figures",
                               "left_out": {c: len(v) for c, v in sorted(left_out.items())
                                            if v},
                               "scored": {c: len(v) for c, v in sorted(kept.items())}}}
    return results


def trained_on(rows: Sequence[Mapping[str, Any]], training: Sequence[Mapping[str, Any]]
               ) -> set[Any]:
    """Ids of ``rows`` a training row shares the id, the question or a 13-word run with (the
    contamination check, `toolrl.data.contamination`)."""
    if not training or not rows:
        return set()
    ids = {r.get("id") for r in training}
    report = check_contamination(rows, training)  # flags rows that overlap training's
    return {r.get("id") for i, r in enumerate(rows) if i in report.flagged or r.get("id") in ids}


def env_metrics(trajs: Sequence[Trajectory], default_env: str) -> dict[str, Any]:
    """Each env's own figures over its episodes (`ToolEnv.eval_metrics`), by env id; envs
    without any (or that no longer resolve) are left out."""
    by_env: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_env.setdefault(env_of(t.row, default_env), []).append(t)
    out: dict[str, Any] = {}
    for env_id, group in sorted(by_env.items()):
        try:
            figures = getattr(env_class(env_id), "eval_metrics", None)
        except (RegistryError, ImportError, AttributeError):
            continue
        value = figures(group) if callable(figures) else None
        if value:
            out[env_id] = value
    return out


def result_tables(results: Mapping[str, Any], title: str = "eval") -> list[Table]:
    """rich Tables of `summarize`'s results: categories, envs, BFCL's columns, each env's own
    figures (one row per group, e.g. tau2's domains)."""
    tables = []
    for key, name in (("per_category", "category"), ("per_env", "env")):
        if key not in results:
            continue
        table = Table(title=f"{title} by {name}")
        for col in (name, "n", "success", "reward", "infra failed"):
            table.add_column(col, justify="left" if col == name else "right")
        for k, v in results[key].items():
            table.add_row(k, str(v["n"]), _fmt(v["success"]), _fmt(v["reward_mean"]),
                          str(v["infra_failed"]))
        failed = results["infra_failed"]
        table.add_row("all", str(results["num_tasks"] - failed), _fmt(results["success"]),
                      _fmt(results["reward_mean"]), str(failed))
        tables.append(table)
    if "bfcl" in results:
        table = Table(title="BFCL categories")
        for col in ("category", "n", "accuracy"):
            table.add_column(col, justify="left" if col == "category" else "right")
        for k, v in results["bfcl"]["per_category"].items():
            table.add_row(k, str(v["n"]), f"{100 * v['accuracy']:.2f}%")
        tables += [table, *leaderboard_tables(results["bfcl"])]
        overlap = results["bfcl"].get("training_overlap") or {}
        if overlap.get("left_out"):
            table = Table(title="BFCL rows left out: the run trained on them (or on rows "
                                "sharing their question or a 13-word run)")
            for col in ("category", "left out", "scored"):
                table.add_column(col, justify="left" if col == "category" else "right")
            for k, v in overlap["left_out"].items():
                table.add_row(k, str(v), str(overlap["scored"].get(k, 0)))
            tables.append(table)
    for env_id, figures in results.get("env_metrics", {}).items():
        groups = {k: v for k, v in figures.items() if isinstance(v, Mapping)}
        if not groups:
            continue
        columns = list(dict.fromkeys(c for v in groups.values() for c in v))
        table = Table(title=f"{title}: {env_id}")
        table.add_column("", justify="left")
        for col in columns:
            table.add_column(col, justify="right")
        for k, v in groups.items():
            table.add_row(k, *(_cell(v.get(c)) for c in columns))
        tables.append(table)
    return tables


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
