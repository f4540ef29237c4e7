"""tau2's pass^k from toolrl episodes: ``toolrl eval`` reports it (`Tau2Env.eval_metrics`);
this module also reads saved episodes (``toolrl eval --save-transcripts``, rollout dumps).

pass^k per domain, k = 1..4, exactly as tau2 computes it (``tau2.metrics.agent_metrics``:
``pass_hat_k(trials, successes, k)`` per task, averaged over tasks; success = tau2 reward 1.0,
``is_successful``; k up to the fewest trials any task has). Each task needs k trials:
``toolrl eval --trials 4`` runs every validation row 4 times, with a sampling temperature
(``rollout.val_temperature``; at 0 the trials of a scripted user are the same episode).
Episodes the infrastructure failed (``infra_failure``) are left out and counted
(``infra_failed``), as tau2 leaves out its failed simulations.

    python -m toolrl.envs.tau2.pass_k eval/transcripts.jsonl [--max-k 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

# (the package's __init__, run before this module, has set litellm offline)
from tau2.metrics.agent_metrics import is_successful, pass_hat_k

from toolrl import Trajectory


def pass_k(records: Iterable[Mapping[str, Any] | Trajectory], max_k: int = 4
           ) -> dict[str, Any]:
    """``{domain: {"tasks", "trials_per_task", "pass^1", ..., "infra_failed"}}`` over
    episodes (`Trajectory` objects or their dicts)."""
    trials: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    infra: Counter[str] = Counter()
    for rec in records:
        if isinstance(rec, Trajectory):
            rec = {"row": rec.row, "info": rec.info, "infra_failure": rec.infra_failure}
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
    for domain in sorted({*trials, *infra}):
        tasks = trials.get(domain, {})
        fewest = min((len(t) for t in tasks.values()), default=0)
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
