"""tau2's pass^k from toolrl episodes (``toolrl eval --save-transcripts`` or rollout dumps).

pass^k per domain, k = 1..4, exactly as tau2 computes it (``tau2.metrics.agent_metrics``:
``pass_hat_k(trials, successes, k)`` per task, averaged over tasks; success = tau2 reward 1.0,
``is_successful``). Each task needs at least k trials: run ``toolrl eval`` on rows that repeat
every task k times (``data.val_size`` = k x the split's size: `Tau2Env.make_tasks` cycles the
split) with a sampling temperature (``rollout.val_temperature``). Episodes the infrastructure
failed (``infra_failure``) are left out and counted.

    python -m toolrl.envs.tau2.pass_k eval/transcripts.jsonl [--max-k 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from tau2.metrics.agent_metrics import is_successful, pass_hat_k

from . import env as _env  # noqa: F401  (litellm offline before tau2 loads)


def pass_k(records: Iterable[Mapping[str, Any]], max_k: int = 4) -> dict[str, Any]:
    """``{domain: {"tasks", "trials", "pass^1", ...}}`` plus ``infra_failed`` counts."""
    trials: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    infra: Counter[str] = Counter()
    for rec in records:
        row = rec.get("row") or {}
        domain = row.get("domain")
        if domain is None:
            continue
        if rec.get("infra_failure"):
            infra[domain] += 1
            continue
        reward = ((rec.get("info") or {}).get("tau2") or {}).get("reward")
        trials[domain][str(row["id"])].append(reward is not None and is_successful(reward))
    out: dict[str, Any] = {}
    for domain, tasks in sorted(trials.items()):
        fewest = min(len(t) for t in tasks.values())
        scores = {f"pass^{k}": sum(pass_hat_k(len(t), sum(t), k) for t in tasks.values())
                  / len(tasks) for k in range(1, min(max_k, fewest) + 1)}
        out[domain] = {"tasks": len(tasks), "trials_per_task": fewest, **scores,
                       "infra_failed": infra[domain]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("transcripts", help="a JSONL file of trajectories")
    parser.add_argument("--max-k", type=int, default=4)
    args = parser.parse_args(argv)
    with open(args.transcripts, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    print(json.dumps(pass_k(records, args.max_k), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
