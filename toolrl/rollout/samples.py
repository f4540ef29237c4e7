"""Episodes that span several training samples, and the rows they become.

Two paths split one episode into several samples that share the episode's advantage:

- the gateway (``rollout.agent``), when an agent rewrites its history
  (`toolrl.rollout.gateway.capture`; ``Trajectory.extra["gateway"]``);
- the env loop under the ``per_turn`` history policy (`toolrl.rollout.history`): one sample per
  model turn (``Trajectory.extra["per_turn"]``).

Either way the episode becomes one batch row per sample, in order, the last one its lead: the
row that stands for the whole episode in metrics over episodes, and whose advantage its other
rows take (`toolrl.algo.credit.episode_advantage`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from toolrl.core.trajectory import TokenStream, Trajectory

__all__ = ["SPLIT_KEYS", "episode_leads", "episode_rows", "is_episode_lead",
           "one_per_episode", "per_turn_rows", "split_info"]

SPLIT_KEYS = ("gateway", "per_turn")


def split_info(traj: Trajectory) -> dict[str, Any] | None:
    """The record of how ``traj``'s episode was split (None: one sample)."""
    for key in SPLIT_KEYS:
        if key in traj.extra:
            return traj.extra[key]
    return None


def episode_rows(rows: Sequence[Mapping[str, Any]], uids: Sequence[str],
                 results: Sequence[tuple[Trajectory, list[Any]]], key: str = "gateway"
                 ) -> tuple[list[dict[str, Any]], list[str], list[Trajectory]]:
    """One batch row per sample: an episode of k samples gives k rows with its task row, its
    uid (one group) and a copy of its trajectory holding that sample's tokens
    (``extra[key]["sample"]``: its index; the last is the episode's lead). ``results`` pairs
    each trajectory with its samples (objects with a ``tokens`` stream, or streams)."""
    out_rows, out_uids, out_trajs = [], [], []
    for row, uid, (traj, samples) in zip(rows, uids, results, strict=True):
        for k, s in enumerate(samples):
            info = {**traj.extra.get(key, {}), "sample": k, "samples": len(samples)}
            tokens = s if isinstance(s, TokenStream) else s.tokens
            out_trajs.append(dataclasses.replace(traj, tokens=tokens,
                                                 extra={**traj.extra, key: info}))
            out_rows.append(dict(row))
            out_uids.append(uid)
    return out_rows, out_uids, out_trajs


def per_turn_rows(rows: Sequence[Mapping[str, Any]], uids: Sequence[str],
                  trajs: Sequence[Trajectory]
                  ) -> tuple[list[dict[str, Any]], list[str], list[Trajectory]]:
    """`episode_rows` for the env loop: a ``per_turn`` episode's earlier samples (kept in
    ``extra["per_turn"]["streams"]``) then its last (``tokens``); other episodes one row."""
    results = []
    for traj in trajs:
        info = traj.extra.get("per_turn")
        if info is None:
            results.append((traj, [traj.tokens]))
            continue
        info = dict(info)
        streams = [TokenStream.from_dict(s) for s in info.pop("streams", [])]
        base = dataclasses.replace(traj, extra={**traj.extra, "per_turn": info})
        results.append((base, [*streams, traj.tokens]))
    out_rows, out_uids, out_trajs = [], [], []
    for row, uid, (traj, samples) in zip(rows, uids, results, strict=True):
        key = "per_turn" if "per_turn" in traj.extra else None
        if key is None:
            out_rows.append(dict(row))
            out_uids.append(uid)
            out_trajs.append(traj)
            continue
        r, u, t = episode_rows([row], [uid], [(traj, samples)], key="per_turn")
        out_rows += r
        out_uids += u
        out_trajs += t
    return out_rows, out_uids, out_trajs


def episode_leads(trajs: Sequence[Trajectory]) -> list[int] | None:
    """For a batch whose episodes span several samples (rows): the row of each row's episode
    lead (`is_episode_lead`: the episode's last sample, which follows its others), whose
    advantage the episode's other samples share; None when every episode is one row."""
    if not any((split_info(t) or {}).get("samples", 1) > 1 for t in trajs):
        return None
    leads, lead = [0] * len(trajs), len(trajs) - 1
    for i in reversed(range(len(trajs))):
        if is_episode_lead(trajs[i]):
            lead = i
        leads[i] = lead
    return leads


def is_episode_lead(traj: Trajectory) -> bool:
    """Whether a batch row stands for its whole episode in metrics over episodes: every
    one-sample episode's row, and the lead (last sample) of an episode split into several
    rows, which carries the whole episode (turns, outcome, token counts of all its samples)."""
    g = split_info(traj)
    return g is None or g.get("sample", 0) == g.get("samples", 1) - 1


def one_per_episode(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """The batch's trajectories with each episode once (`is_episode_lead`)."""
    return [t for t in trajs if is_episode_lead(t)]
