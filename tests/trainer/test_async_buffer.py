"""The async trainer's submission and admission rules (`GroupBuffer`), on simulated streams:
pure bookkeeping, no Ray. Groups finish after a drawn duration; a step takes one time unit."""

from __future__ import annotations

import random

import pytest

from toolrl.trainer.async_buffer import BufferError, GroupBuffer


def simulate(buf: GroupBuffer, durations, steps: int, train_time: float = 1.0,
             seed: int = 0) -> dict:
    """Drive ``buf`` like the trainer: top up, poll finished groups until a batch forms,
    train (time passes), push (version + 1). ``durations(rng, uid)`` draws a group's time.
    Returns what was trained per step with its staleness, and what was cancelled."""
    rng = random.Random(seed)
    now, version, n = 0.0, buf.start_version, 0
    finish: dict[str, float] = {}
    started: dict[str, int] = {}
    trained, cancelled, lags = [], [], []

    def top_up():
        nonlocal n
        while buf.may_submit(version):
            uids = [f"g{n + i}" for i in range(buf.groups_per_step)]
            n += len(uids)
            buf.submit(uids, version)
            for uid in uids:
                finish[uid] = now + durations(rng, uid)
                started[uid] = version  # generation starts at once, with these weights

    for _ in range(steps):
        top_up()
        while True:
            for uid in [u for u, t in finish.items() if t <= now]:
                buf.arrive(uid, None, started[uid])
                del finish[uid]
            sel = buf.select(version)
            for uid in sel.cancel:
                cancelled.append(uid)
                finish.pop(uid, None)
            if sel.train is not None:
                break
            now = min(finish.values())  # wait for the next group to finish
        trained.append([t.uid for t in sel.train])
        lags += [version - t.start_version for t in sel.train]
        buf.check()
        now += train_time
        version += 1
    return {"trained": trained, "cancelled": cancelled, "lags": lags, "submitted": n}


def lognormal(rng, uid):
    return rng.lognormvariate(-0.5, 1.0)  # mean 1, a long tail


@pytest.mark.parametrize("k", [0, 1, 2, 4])
@pytest.mark.parametrize("policy", ["continue", "drop"])
def test_staleness_never_exceeds_k_and_every_group_is_counted_once(k, policy):
    buf = GroupBuffer(groups_per_step=4, max_staleness=k, stale_policy=policy)
    out = simulate(buf, lognormal, steps=60, seed=k)
    assert max(out["lags"]) <= k and min(out["lags"]) >= 0
    flat = [u for step in out["trained"] for u in step]
    assert len(flat) == len(set(flat)) == 60 * 4  # every step full, no group twice
    assert not set(flat) & set(out["cancelled"])
    # counted in and out: nothing lost
    assert out["submitted"] == buf.submitted == \
        buf.trained + buf.dropped_stale + len(buf.outstanding)
    assert buf.dropped_stale == len(out["cancelled"])
    if policy == "continue":
        assert buf.dropped_stale == 0
    # never more than k + 1 steps' worth outstanding
    assert len(buf.outstanding) <= (k + 1) * 4


def test_k0_trains_each_step_on_exactly_the_groups_submitted_for_it():
    buf = GroupBuffer(groups_per_step=3, max_staleness=0)
    out = simulate(buf, lognormal, steps=10)
    assert [sorted(s) for s in out["trained"]] == [sorted(f"g{3 * s + i}" for i in range(3))
                                                   for s in range(10)]
    assert set(out["lags"]) == {0}


def mixed(rng, uid):
    """Half the tasks are long (4 units: several slow tool calls), half short (0.3)."""
    return 4.0 if int(uid[1:]) % 2 else 0.3


def first_finished(k: int, steps: int, per_step: int = 4) -> tuple[int, int, list[str]]:
    """The naive rule under the same submission control: train the first ``per_step`` groups
    to finish, drop those older than k when they finish. Returns (long trained, trained,
    dropped)."""
    now, n, lost = 0.0, 0, []
    finish: dict[str, float] = {}
    started: dict[str, int] = {}
    ready: list[str] = []
    long_ = total = 0
    for version in range(steps):
        while n - len(lost) + per_step <= (version + k + 1) * per_step:
            for _ in range(per_step):
                finish[f"g{n}"], started[f"g{n}"] = now + mixed(None, f"g{n}"), version
                n += 1
        batch: list[str] = []
        while len(batch) < per_step:
            for uid in sorted((u for u, t in finish.items() if t <= now), key=finish.get):
                del finish[uid]
                if version - started[uid] <= k:
                    ready.append(uid)
                else:
                    lost.append(uid)
            while ready and len(batch) < per_step:
                batch.append(ready.pop(0))
            if len(batch) < per_step:
                now = min(finish.values())
        long_ += sum(int(u[1:]) % 2 for u in batch)
        total += len(batch)
        now += 1.0
    return long_, total, lost


def test_admission_does_not_favour_short_episodes():
    """Mixed lengths: the first-finished rule trains mostly short groups; the buffer's rule
    trains long and short alike (each submitted group exactly once)."""
    steps = 40
    buf = GroupBuffer(groups_per_step=4, max_staleness=2)
    out = simulate(buf, mixed, steps=steps)
    flat = [u for step in out["trained"] for u in step]
    ours = sum(int(u[1:]) % 2 for u in flat) / len(flat)
    naive_long, naive_total, lost = first_finished(2, steps)
    naive = naive_long / naive_total
    assert abs(ours - 0.5) <= 0.05, ours  # the submitted mix (half long)
    assert buf.dropped_stale == 0
    # the flaw the rule avoids: long groups finish stale and are lost, short ones train
    assert naive <= 0.4, naive
    assert lost and all(int(u[1:]) % 2 for u in lost)
    assert max(out["lags"]) <= 2
    # every group submitted before the last k + 1 steps' worth was trained
    assert set(flat) >= {f"g{i}" for i in range(out["submitted"] - 3 * 4)}


def test_drop_policy_cancels_stragglers_instead_of_waiting():
    # one group in eight never finishes in time; "continue" waits, "drop" gives up on it
    slow = lambda rng, uid: 50.0 if int(uid[1:]) % 8 == 0 else 0.3  # noqa: E731
    waiting = simulate(GroupBuffer(4, 1, "continue"), slow, steps=8)
    dropping = simulate(buf := GroupBuffer(4, 1, "drop"), slow, steps=8)
    assert dropping["cancelled"] and buf.dropped_stale == len(dropping["cancelled"])
    assert all(int(u[1:]) % 8 == 0 for u in dropping["cancelled"])
    assert max(dropping["lags"]) <= 1 and max(waiting["lags"]) <= 1
    assert sum(len(s) for s in dropping["trained"]) == 8 * 4


def test_accounting_errors_are_loud():
    buf = GroupBuffer(2, 1)
    buf.submit(["a", "b"], 0)
    with pytest.raises(ValueError, match="a batch is 2 groups"):
        buf.submit(["c"], 0)
    with pytest.raises(BufferError, match="submitted before"):
        buf.submit(["a", "c"], 0)
    with pytest.raises(BufferError, match="never submitted"):
        buf.arrive("zzz", None, 0)
    buf.arrive("a", None, 0)
    with pytest.raises(BufferError, match="arrived twice"):
        buf.arrive("a", None, 0)
    buf.arrive("b", None, 0)
    assert [t.uid for t in buf.select(0).train] == ["a", "b"]
    with pytest.raises(BufferError, match="arrived twice"):
        buf.arrive("a", None, 0)
    buf.submit(["c", "d"], 0)  # lookahead 2 at k=1: the next batch may go out at version 0
    assert not buf.may_submit(0)
    with pytest.raises(BufferError, match="too early"):
        buf.submit(["e", "f"], 0)


def test_a_finished_group_older_than_k_is_dropped_not_trained():
    buf = GroupBuffer(1, 1, start_version=5)
    buf.submit(["old"], 5)
    buf.arrive("old", None, 2)  # started on weights 2 (e.g. before a pool restart)
    buf.submit(["new"], 5)
    buf.arrive("new", None, 5)
    sel = buf.select(5)
    assert [t.uid for t in sel.train] == ["new"] and buf.dropped_stale == 1
    buf.check()


@pytest.mark.parametrize("bad", [dict(groups_per_step=0, max_staleness=1),
                                 dict(groups_per_step=1, max_staleness=-1),
                                 dict(groups_per_step=1, max_staleness=1, stale_policy="x")])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        GroupBuffer(**bad)
