"""Supervised warm start: teach a model the env's call format from oracle transcripts.

A random (or tiny) model never emits a valid tool call, so RL has no signal. The warm start
plays each task with the env's scripted oracle (``env.oracle_action()``), records the exact
token stream a rollout would produce (the first prompt from the chat template, then the oracle's
action tokens + eos, then the template delta of each observation: token-in/token-out, as in
`toolrl.rollout.episode`), and trains on the action tokens only. The result is an HF
checkpoint that emits the format but is often wrong: where RL starts.

With held-out transcripts (`sft`'s ``val_transcripts``, or `hold_out`) it evaluates their loss
every ``eval_every`` steps, stops once ``patience`` evaluations bring no new best, and keeps the
checkpoint of the best one. With ``save_every`` it writes a snapshot of its whole state (weights,
AdamW, schedule, data order, losses, held-out record) every that many steps, and a warm start
started again with the same inputs goes on from the last one: interrupted and resumed, it ends
with the same checkpoint as without the interruption.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from tensordict import TensorDict
from transformers import AutoModelForCausalLM, AutoTokenizer

from toolrl.batch import RESPONSE_MASK, build_rollout_batch
from toolrl.core.env import run_episode
from toolrl.core.registration import env_class, make_env
from toolrl.core.trajectory import Trajectory
from toolrl.data import load_rows
from toolrl.models.compact import REAL_DIR, VOCAB_FILE
from toolrl.models.families import family_tokenizer
from toolrl.rollout.chat import ChatRenderer
from toolrl.rollout.episode import MAX_TURNS
from toolrl.trainer.compute import ModelShape, batch_tokens
from toolrl.trainer.config import ConfigError, ExperimentConfig
from toolrl.trainer.policies import BAD_POLICIES
from toolrl.workers.compute_dtype import autocast, choose_autocast, is_auto
from toolrl.workers.host_memory import release_memory
from toolrl.workers.scoring import enable_scoring, score_responses


def warm_started(cfg: ExperimentConfig, base: str, run_dir: Path, console: Console) -> str:
    """The warm start's checkpoint: SFT of ``base`` on the env's oracle transcripts, trained
    once into ``warm_start.output`` (default ``<run_dir>/warm_start``) and reused after."""
    ws = cfg.warm_start
    out = Path(ws.output or run_dir / "warm_start")
    if (out / "config.json").exists():
        made_from = json.loads((out / "warm_start_metrics.json").read_text()).get(
            "base_model") if (out / "warm_start_metrics.json").exists() else None
        if made_from not in (None, cfg.model.path):
            raise ConfigError(f"warm start {out} was trained from model.path={made_from!r}, "
                              f"and this config says model.path={cfg.model.path!r}: "
                              f"set warm_start.output to another directory")
        console.log(f"warm start: reusing {out}")
        return str(out)
    transcripts, held_out = warm_start_transcripts(cfg, base)
    console.log(f"warm start: {len(transcripts)} oracle transcripts, {ws.steps} steps"
                + (f" at most, {len(held_out)} held out" if held_out else ""))
    metrics = sft(base, transcripts, out, steps=ws.steps, lr=ws.lr,
                  batch_size=ws.batch_size, seed=cfg.seed, stop_loss=ws.stop_loss,
                  val_transcripts=held_out, eval_every=ws.eval_every,
                  patience=ws.patience, save_every=ws.save_every,
                  compute_dtype=cfg.actor.param_dtype or "float32", console=console)
    if held_out:
        console.log(f"warm start: best held-out loss "
                    f"{metrics['warm_start/val_loss_best']:.4f} after "
                    f"{metrics['warm_start/best_step']} steps (stopped: "
                    f"{metrics['warm_start/stopped']}), its checkpoint kept")
    metrics = {"base_model": cfg.model.path, **metrics}
    (out / "warm_start_metrics.json").write_text(json.dumps(metrics, indent=2))
    return str(out)


def warm_start_transcripts(cfg: ExperimentConfig, base: str) -> tuple[list[Transcript],
                                                                       list[Transcript]]:
    """The warm start's oracle transcripts: (to train on, held out for the held-out loss),
    each episode within the rollout's ``rollout.max_turns``."""
    ws = cfg.warm_start
    if ws.train_file:  # e.g. a dataset's gold calls: the oracle plays them
        rows = load_rows(ws.train_file)[: ws.num_transcripts]
    else:
        rows = env_class(cfg.env.id).make_tasks(
            ws.num_transcripts, seed=cfg.seed, split="warm_start",
            **(ws.task_kwargs or cfg.data.task_kwargs))
    tokenizer = AutoTokenizer.from_pretrained(base)
    env_kwargs = {**cfg.env.kwargs, **ws.env_kwargs}
    play = {"max_len": cfg.rollout.max_total_tokens, "max_turns": cfg.rollout.max_turns,
            "history_policy": cfg.rollout.history_policy, "family": cfg.rollout.family}
    transcripts = oracle_transcripts(cfg.env.id, rows, tokenizer, env_kwargs, **play)
    if ws.val_file:  # held-out rows, played by the same oracle
        return transcripts, oracle_transcripts(cfg.env.id, load_rows(ws.val_file), tokenizer,
                                               env_kwargs, **play)
    if ws.val_fraction > 0:
        return hold_out(transcripts, ws.val_fraction, cfg.seed)
    return transcripts, []


@dataclass
class Transcript:
    """One oracle episode as tokens: ``loss_mask`` is 1 on the oracle's action tokens."""

    input_ids: list[int]
    loss_mask: list[int]


def oracle_transcripts(env_id: str, rows: Sequence[Mapping[str, Any]], tokenizer: Any,
                       env_kwargs: Mapping[str, Any] | None = None, max_len: int = 1024,
                       max_turns: int = MAX_TURNS, history_policy: str = "auto",
                       family: str | None = None) -> list[Transcript]:
    """Play ``rows`` with the env's oracle and return the token streams (too long: dropped).
    ``history_policy`` / ``family``: the rollout's (`toolrl.rollout.history`): under
    ``per_turn`` each turn is its own transcript, prompted as the rollout prompts it."""
    renderer = ChatRenderer(tokenizer, history_policy=history_policy, family=family)
    env = make_env(env_id, **dict(env_kwargs or {}))
    trajs = []
    try:
        for i, row in enumerate(rows):
            try:
                trajs.append(asyncio.run(run_episode(env, row=dict(row), seed=i,
                                                     max_steps=max_turns)))
            except RuntimeError as exc:
                raise RuntimeError(f"the oracle's episode of task {row.get('id')!r}: {exc} "
                                   f"(it plays within the rollout's max_turns={max_turns}: "
                                   f"raise rollout.max_turns if the task needs more)") from exc
    finally:
        env.close()
    out = []
    for traj in trajs:
        pieces = per_turn_transcripts(traj, renderer) if renderer.per_turn else \
            [transcript_of(traj, renderer)]
        if all(len(t.input_ids) <= max_len for t in pieces):
            out.extend(pieces)
    return out


def transcript_of(traj: Trajectory, renderer: Any) -> Transcript:
    """An episode's token stream as a rollout would produce it (the first prompt, each action's
    tokens + eos, each observation's template delta but the last); the loss is on actions.

    Each turn added one assistant message, so the assistant messages before the last
    ``len(traj.turns)`` belong to the first prompt (tau2 opens with the agent's greeting)."""
    eos = renderer.eos_token_id
    assistant = [i for i, m in enumerate(traj.messages) if m.get("role") == "assistant"]
    if not traj.turns or len(assistant) < len(traj.turns):
        raise ValueError(f"episode {traj.id!r}: {len(traj.turns)} turns and "
                         f"{len(assistant)} assistant messages; no transcript")
    first = assistant[len(assistant) - len(traj.turns)]
    ids = list(renderer.render_prompt(traj.messages[:first], traj.tools))
    mask = [0] * len(ids)
    rest = traj.messages[first:]
    starts = [i for i, m in enumerate(rest) if m.get("role") == "assistant"]
    for k, (turn, start) in enumerate(zip(traj.turns, starts, strict=True)):
        act = [*renderer.tokenizer.encode(turn.action, add_special_tokens=False), eos]
        ids += act
        mask += [1] * len(act)
        if k + 1 < len(starts):  # the last observation ends the episode: not rendered
            delta = renderer.render_delta(rest[start + 1:starts[k + 1]], traj.tools)
            ids += delta
            mask += [0] * len(delta)
    return Transcript(ids, mask)


def _inference_histories(traj: Trajectory, renderer: Any) -> list[tuple[list[dict], Any]] | None:
    """Each turn's history as the template renders it at inference (earlier turns as
    `ChatRenderer.inference_message`) with the turn, then the whole history with ``None``;
    ``None`` when the episode has fewer assistant messages than turns."""
    assistant = [i for i, m in enumerate(traj.messages) if m.get("role") == "assistant"]
    if not traj.turns or len(assistant) < len(traj.turns):
        return None
    first = assistant[len(assistant) - len(traj.turns)]
    history = [dict(m) for m in traj.messages[:first]]
    rest = traj.messages[first:]
    starts = [i for i, m in enumerate(rest) if m.get("role") == "assistant"]
    out: list[tuple[list[dict], Any]] = []
    for k, (turn, start) in enumerate(zip(traj.turns, starts, strict=True)):
        out.append((list(history), turn))
        end = starts[k + 1] if k + 1 < len(starts) else len(rest)
        history += [renderer.inference_message(turn.action, turn.parse),
                    *(dict(m) for m in rest[start + 1:end])]
    return [*out, (history, None)]


def per_turn_transcripts(traj: Trajectory, renderer: Any) -> list[Transcript]:
    """An episode as the ``per_turn`` history policy samples it: one transcript per turn,
    the template's rendering of the history as at inference, then the action's tokens + the
    turn's end."""
    turns = _inference_histories(traj, renderer)
    if turns is None:
        assistant = sum(m.get("role") == "assistant" for m in traj.messages)
        raise ValueError(f"episode {traj.id!r}: {len(traj.turns)} turns and "
                         f"{assistant} assistant messages; no transcript")
    out = []
    for history, turn in turns[:-1]:
        prompt = list(renderer.render_prompt(history, traj.tools))
        act = [*renderer.encode(turn.action), renderer.eos_token_id]
        out.append(Transcript(prompt + act, [0] * len(prompt) + [1] * len(act)))
    return out


def task_vocab_texts(cfg: Any, train: Sequence[Mapping[str, Any]],
                     val: Sequence[Mapping[str, Any]], n: int = 128) -> list[str]:
    """The texts a run on ``cfg``'s task renders, for a compact vocabulary
    (`toolrl.models.compact`): ``n`` train rows and every val row, each played by the env's oracle
    (its own and ``random_op``-style kwargs of the warm start), by the dry run's bad
    policies, by the oracle cut short and with typos (the parse errors the env reports);
    every turn's prompt as the rollout renders it, every action, on the family's real
    tokenizer and template."""
    renderer = ChatRenderer(family_tokenizer(cfg.model.tiny_tokenizer),
                            history_policy=cfg.rollout.history_policy, family=cfg.rollout.family)
    rows = [dict(r) for r in [*train[:n], *val]]
    texts: list[str] = []
    kwargs = [dict(cfg.env.kwargs), {**cfg.env.kwargs, **cfg.warm_start.env_kwargs}]
    rng = random.Random(cfg.seed)

    def cut_oracle(env: Any, messages: Any, rng: random.Random) -> str:
        """The oracle's action cut short: the env's parse-error observations."""
        action = env.unwrapped.oracle_action()
        return action[: rng.randint(1, max(len(action) - 1, 1))]

    def typo_oracle(env: Any, messages: Any, rng: random.Random) -> str:
        """The oracle's action with one character inserted, dropped or replaced: the parse
        errors a sampled typo gets ("Expecting ',' delimiter", "Extra data", ...), which a
        vocabulary without their words could not show the model (the episode would end as
        an infrastructure failure, never scored)."""
        action = env.unwrapped.oracle_action()
        if not action:
            return action
        i = rng.randrange(len(action))
        typo = rng.choice('{}[]:,"\\ 0a\n')
        return action[:i] + rng.choice((typo + action[i], typo, "")) + action[i + 1:]

    for env_kwargs in kwargs:
        env = make_env(cfg.env.id, **env_kwargs)
        try:
            policies = [None, *BAD_POLICIES.values(), cut_oracle, cut_oracle,
                        *[typo_oracle] * 6]
            for i, (row, policy) in enumerate((r, p) for r in rows for p in policies):
                play = (lambda e, messages, p=policy: p(e, messages, rng)) if policy else None
                try:
                    traj = asyncio.run(run_episode(env, **({"policy": play} if play else {}),
                                                   row=row, seed=i, max_steps=64))
                except RuntimeError:  # an env without a turn limit of its own
                    continue
                texts += _episode_texts(traj, renderer)
        finally:
            env.close()
    return texts


def _episode_texts(traj: Trajectory, renderer: Any) -> list[str]:
    """Each turn's prompt text (the history as the rollout renders it) and action."""
    out: list[str] = []
    for history, turn in _inference_histories(traj, renderer) or ():
        out.append(renderer.render_text(history, traj.tools, add_generation_prompt=True))
        if turn is not None:
            out.append(turn.action)
    return out


def shared_prefix_batch(transcripts: Sequence[Transcript], pad_token_id: int,
                        own_prompts: bool = False) -> TensorDict:
    """``transcripts`` in the rollout layout with their longest common prefix as the prompt
    (the system prompt and tool list an env's tasks share), so the prefix runs once for the
    whole batch (`toolrl.workers.scoring`); the loss mask is the oracle's action tokens.

    With ``own_prompts``, transcripts that each end in their one action (``per_turn``: a
    turn's prompt, then its tokens) get their own prompts instead, so the LM head, which runs
    on every response token, runs on the actions alone: what a large vocabulary wants (with a
    152,064-token head the history's share was the bulk of a step), while a small one gains
    more from running the common prefix once."""
    if own_prompts and all(_one_action(t.loss_mask) for t in transcripts):
        cut = [t.loss_mask.index(1) for t in transcripts]
        return build_rollout_batch([t.input_ids[:c] for t, c in zip(transcripts, cut,
                                                                    strict=True)],
                                   [t.input_ids[c:] for t, c in zip(transcripts, cut,
                                                                    strict=True)],
                                   [t.loss_mask[c:] for t, c in zip(transcripts, cut,
                                                                    strict=True)],
                                   pad_token_id)
    first = transcripts[0].input_ids
    lcp = min(len(t.input_ids) for t in transcripts) - 1
    for t in transcripts:
        ids = t.input_ids
        lcp = next((i for i in range(lcp) if ids[i] != first[i]), lcp)
        lcp = min(lcp, t.loss_mask.index(1) if 1 in t.loss_mask else lcp)
    lcp = max(lcp, 1)
    return build_rollout_batch([first[:lcp]] * len(transcripts),
                               [t.input_ids[lcp:] for t in transcripts],
                               [t.loss_mask[lcp:] for t in transcripts], pad_token_id)


LARGE_VOCAB = 32768  # above it, per_turn transcripts run the LM head on their actions alone


def copy_vocab(source: str | Path, out: str | Path) -> None:
    """Carry a compact vocabulary's map and real tokenizer (`toolrl.models.compact`) along
    with a checkpoint written from ``source``, so the rollout keeps checking its pieces."""
    src, out = Path(source), Path(out)
    if (src / VOCAB_FILE).is_file():
        shutil.copy2(src / VOCAB_FILE, out / VOCAB_FILE)
        shutil.copytree(src / REAL_DIR, out / REAL_DIR, dirs_exist_ok=True)


def _one_action(mask: Sequence[int]) -> bool:
    """The mask is 0s, then 1s to the end (a prompt, then one action)."""
    if 1 not in mask:
        return False
    start = list(mask).index(1)
    return all(mask[start:])


def hold_out(transcripts: Sequence[Transcript], fraction: float,
             seed: int) -> tuple[list[Transcript], list[Transcript]]:
    """Split ``transcripts`` into (train, held out): ``fraction`` of them (at least one, drawn
    with ``seed``) held out, the rest in their order."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the held-out fraction must be in (0, 1), got {fraction}")
    k = max(1, round(len(transcripts) * fraction))
    if k >= len(transcripts):
        raise ValueError(f"holding out {fraction} of {len(transcripts)} oracle transcripts "
                         f"leaves none to train on")
    held = set(random.Random(seed).sample(range(len(transcripts)), k))
    return ([t for i, t in enumerate(transcripts) if i not in held],
            [t for i, t in enumerate(transcripts) if i in held])


def action_nll(model: Any, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed cross-entropy of ``batch``'s action tokens (``RESPONSE_MASK``) under ``model``
    (`enable_scoring`'d), and how many there are."""
    log_probs, _ = score_responses(model, batch)
    mask = batch[RESPONSE_MASK].float()
    return -(log_probs * mask).sum(), mask.sum()


def held_out_loss(model: Any, transcripts: Sequence[Transcript], batch_size: int,
                  pad_token_id: int) -> float:
    """Mean cross-entropy over the action tokens of all ``transcripts``, batched as in training
    (`shared_prefix_batch`, ``batch_size`` at a time, in order); ``model`` runs in eval mode
    without gradients and goes back to the mode it was in. In float32 whatever the training
    computes in: the loss that picks the checkpoint and sits beside every result compares
    across machines and dtypes."""
    was_training = model.training
    enable_scoring(model).eval()
    nll, count = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, len(transcripts), batch_size):
            total, n = action_nll(model, shared_prefix_batch(transcripts[i:i + batch_size],
                                                             pad_token_id))
            nll, count = nll + float(total), count + float(n)
    model.train(was_training)
    return nll / max(count, 1.0)


@dataclass
class _HeldOut:
    """Early stopping on the held-out loss. Each new best is saved to ``best_dir`` at once (no
    second copy of the weights in memory) and moved into the output at the end."""

    transcripts: Sequence[Transcript]
    every: int
    patience: int
    best_dir: Path
    curve: list[list[float]] = field(default_factory=list)
    best: float = math.inf
    best_step: int = 0
    since_best: int = 0

    def evaluate(self, model: Any, trained: int, batch_size: int, pad: int,
                 console: Console) -> bool:
        """Record the loss after ``trained`` steps (saving a new best); True: patience ran out."""
        loss = held_out_loss(model, self.transcripts, batch_size, pad)
        self.curve.append([trained, loss])
        if loss < self.best:
            self.best, self.best_step, self.since_best = loss, trained, 0
            model.save_pretrained(self.best_dir, safe_serialization=True)
        else:
            self.since_best += 1
        console.log(f"warm start after {trained} steps: held-out loss {loss:.4f} (best "
                    f"{self.best:.4f}, after {self.best_step} steps)")
        return self.since_best >= self.patience

    def publish(self, out_dir: Path) -> None:
        """Move the best checkpoint's files into ``out_dir``."""
        for path in self.best_dir.iterdir():
            path.replace(out_dir / path.name)
        self.best_dir.rmdir()

    def metrics(self) -> dict[str, Any]:
        """`sft`'s held-out metrics."""
        return {"warm_start/val_loss_best": self.best, "warm_start/best_step": self.best_step,
                "warm_start/val_curve": self.curve,
                "warm_start/val_transcripts": len(self.transcripts)}


@dataclass
class _Snapshot:
    """The warm start's whole state every ``every`` steps in ``path`` (a snapshot of another
    warm start, told by ``fingerprint``, is set aside, never resumed from)."""

    path: Path
    every: int
    fingerprint: str

    def load(self, console: Console) -> dict[str, Any] | None:
        file = self.path / "state.pt"
        if not file.exists():
            return None
        state = torch.load(file, weights_only=False)
        if state.get("fingerprint") != self.fingerprint:
            console.log(f"warm start: {self.path} holds a snapshot of another warm start "
                        f"(other model, data or settings): starting from step 0")
            shutil.rmtree(self.path, ignore_errors=True)
            return None
        console.log(f"warm start: resuming from its snapshot after {state['step']} steps")
        return state

    def save(self, state: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / "state.pt.tmp"
        torch.save({**state, "fingerprint": self.fingerprint}, tmp)
        tmp.replace(self.path / "state.pt")  # a cut-off save never replaces the last one

    def drop(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _fingerprint(model_path: str | Path, transcripts: Sequence[Transcript],
                 val_transcripts: Sequence[Transcript], **settings: Any) -> str:
    digest = hashlib.sha256(f"{Path(model_path).resolve()}|{sorted(settings.items())}".encode())
    for t in (*transcripts, None, *val_transcripts):
        digest.update(b"|" if t is None else repr((t.input_ids, t.loss_mask)).encode())
    return digest.hexdigest()


def sft(model_path: str | Path, transcripts: Sequence[Transcript], out_dir: str | Path, *,
        steps: int = 300, lr: float = 3e-3, batch_size: int = 16, seed: int = 0,
        warmup_steps: int = 20, stop_loss: float | None = None, stop_window: int = 50,
        val_transcripts: Sequence[Transcript] = (), eval_every: int = 0, patience: int = 3,
        seconds: float | None = None, save_every: int = 0, compute_dtype: str = "float32",
        console: Console | None = None) -> dict[str, Any]:
    """Train on the action tokens of ``transcripts`` and save an HF checkpoint to ``out_dir``.

    AdamW with linear warmup and cosine decay over ``steps``; loss = mean cross-entropy over
    action tokens. Each batch runs its common prefix once (`shared_prefix_batch`). With
    ``stop_loss`` the run ends early, once the mean loss of the last ``stop_window`` steps is at
    most ``stop_loss`` (the format is learned; more steps only fit the oracle's noise). With
    ``val_transcripts`` (and ``eval_every`` > 0) their loss (`held_out_loss`) is measured every
    ``eval_every`` steps and after the last; the run ends once ``patience`` evaluations in a
    row bring no new best, and the checkpoint saved is the best one (``steps`` stays the cap).
    With ``seconds`` it also ends after the first step that brings its training time (held-out
    evaluations included) to ``seconds``: SFT given the wall time another method spent. With
    ``save_every`` it snapshots its state to ``out_dir/.resume`` every that many steps and, called
    again with the same inputs after an interruption, goes on from the last snapshot.
    Returns summary metrics (first / last loss, steps taken, tokens per second, why it stopped;
    with held-out transcripts the best held-out loss, its step and the held-out curve).

    The model, its gradients and AdamW state are freed and handed back to the OS before it
    returns (`release_memory`): the driver goes on to start the workers, and the memory plan
    counts the warm start only while it runs.
    """
    if not transcripts:
        raise ValueError("no oracle transcripts to train on (all too long, or no tasks)")
    if eval_every > 0 and not val_transcripts:
        raise ValueError("eval_every > 0 needs held-out transcripts (none given, or all too "
                         "long)")
    if val_transcripts and eval_every < 1:
        raise ValueError("held-out transcripts need eval_every >= 1 (steps between evaluations)")
    if patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    if save_every < 0:
        raise ValueError(f"save_every must be >= 0, got {save_every}")
    out_dir = Path(out_dir)
    held = _HeldOut(val_transcripts, eval_every, patience, out_dir / ".best") \
        if val_transcripts else None
    snapshot = _Snapshot(out_dir / ".resume", save_every, _fingerprint(
        model_path, transcripts, val_transcripts, steps=steps, lr=lr, batch_size=batch_size,
        seed=seed, warmup_steps=warmup_steps, stop_loss=stop_loss, stop_window=stop_window,
        eval_every=eval_every, patience=patience, seconds=seconds,
        compute_dtype=compute_dtype)) if save_every else None
    try:
        return _train(model_path, transcripts, out_dir, steps=steps, lr=lr,
                      batch_size=batch_size, seed=seed, warmup_steps=warmup_steps,
                      stop_loss=stop_loss, stop_window=stop_window, held=held,
                      seconds=seconds, snapshot=snapshot, compute_dtype=compute_dtype,
                      console=console or Console())
    finally:  # the model and optimizer died with _train's frame
        release_memory()


def _train(model_path: str | Path, transcripts: Sequence[Transcript], out_dir: Path, *,
           steps: int, lr: float, batch_size: int, seed: int, warmup_steps: int,
           stop_loss: float | None, stop_window: int, held: _HeldOut | None,
           seconds: float | None, snapshot: _Snapshot | None, compute_dtype: str,
           console: Console) -> dict[str, Any]:
    """`sft`'s training loop and checkpoint."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.train()
    if is_auto(compute_dtype):  # timed before training: the model is still as loaded
        choice = choose_autocast(model)
        compute_dtype = choice.dtype
        console.log(f"warm start: computing in {choice.describe()}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    enable_scoring(model)
    losses: list[float] = []
    tokens, first, before = 0, 0, 0.0
    attended, train_s = 0.0, 0.0  # the compute account: positions attended, time in steps
    state = snapshot.load(console) if snapshot is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["schedule"])
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        losses, tokens, first, before = (state["losses"], state["tokens"], state["step"],
                                         state["seconds"])
        attended, train_s = state.get("attended", 0.0), state.get("train_s", 0.0)
        if held is not None:
            held.curve, held.best, held.best_step, held.since_best = state["held"]
    elif held is not None:
        shutil.rmtree(held.best_dir, ignore_errors=True)  # a crashed run's
    stopped = "steps"
    start = time.perf_counter() - before
    shown = time.perf_counter()
    progress = Progress(TextColumn("[bold]warm start"), BarColumn(),
                        TextColumn("{task.completed}/{task.total} loss {task.fields[loss]}"),
                        TimeElapsedColumn(), console=console,
                        disable=not console.is_terminal)
    with progress:
        task = progress.add_task("sft", total=steps, loss="-", completed=first)
        for step in range(first, steps):
            began = time.perf_counter()
            batch = shared_prefix_batch(
                [transcripts[rng.randrange(len(transcripts))] for _ in range(batch_size)], pad,
                own_prompts=model.config.vocab_size > LARGE_VOCAB)
            with autocast(compute_dtype):
                nll, count = action_nll(model, batch)
            loss = nll / count.clamp(min=1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            train_s += time.perf_counter() - began
            needed, context = batch_tokens(batch)  # a shared prompt once
            tokens += needed
            attended += needed * context
            progress.update(task, advance=1, loss=f"{losses[-1]:.3f}")
            recent = sum(losses[-stop_window:]) / min(len(losses), stop_window)
            done = stop_loss is not None and len(losses) >= stop_window and recent <= stop_loss
            if step % 50 == 0 or step == steps - 1 or done or time.perf_counter() - shown > 60:
                shown, spent = time.perf_counter(), time.perf_counter() - start
                per_step = spent / (step + 1)
                left = (steps - step - 1) * per_step / 60
                console.log(f"warm start step {step + 1}/{steps}: loss {losses[-1]:.4f} (mean "
                            f"of the last {min(len(losses), stop_window)}: {recent:.4f}); "
                            f"{per_step:.1f} s a step, at most {left:.0f} min left")
            if done:
                console.log(f"warm start: mean loss <= {stop_loss} after {step + 1} steps, "
                            f"stopping")
                stopped = "stop_loss"
            if not done and seconds is not None and time.perf_counter() - start >= seconds:
                console.log(f"warm start: {seconds:.0f} s of training spent after {step + 1} "
                            f"steps, stopping")
                stopped, done = "seconds", True
            last = done or step == steps - 1
            if held is not None and ((step + 1) % held.every == 0 or last) and \
                    held.evaluate(model, step + 1, batch_size, pad, console) and not last:
                console.log(f"warm start: no new best held-out loss in {held.patience} "
                            f"evaluations, stopping after {step + 1} steps; keeping the "
                            f"checkpoint of step {held.best_step}")
                stopped, done = "patience", True
            if done:
                break
            if snapshot is not None and (step + 1) % snapshot.every == 0:
                snapshot.save({
                    "model": model.state_dict(), "optimizer": opt.state_dict(),
                    "schedule": sched.state_dict(), "rng": rng.getstate(),
                    "torch_rng": torch.get_rng_state(), "losses": losses, "tokens": tokens,
                    "attended": attended, "train_s": train_s, "step": step + 1,
                    "seconds": time.perf_counter() - start,
                    "held": None if held is None else (held.curve, held.best, held.best_step,
                                                       held.since_best)})
    elapsed = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    if held is None:
        model.save_pretrained(out_dir, safe_serialization=True)
    else:
        held.publish(out_dir)
    tokenizer.save_pretrained(out_dir)
    copy_vocab(model_path, out_dir)
    if snapshot is not None:
        snapshot.drop()
    shape = ModelShape(sum(p.numel() for p in model.parameters()),
                       model.config.num_hidden_layers, model.config.hidden_size)
    per_token = shape.flop_per_token(attended / max(tokens, 1), training=True)
    return {"warm_start/loss_first": losses[0], "warm_start/loss_last": losses[-1],
            "warm_start/steps": float(len(losses)), "warm_start/tokens_per_s": tokens / elapsed,
            "warm_start/tokens": float(tokens), "warm_start/train_s": train_s,
            "warm_start/flop_per_token": per_token,
            "warm_start/flop_per_s": per_token * tokens / train_s if train_s else 0.0,
            "warm_start/seconds": elapsed, "warm_start/transcripts": float(len(transcripts)),
            "warm_start/stopped": stopped, "warm_start/compute_dtype": compute_dtype,
            **(held.metrics() if held is not None else {})}
