"""Weight pushes while generation goes on (``trainer.mode: async``), on the real CPU engine:
a request in flight survives the push, its tokens before the push keep the old weights'
log-probs and those after it have the new weights' (a partial rollout); and the episode
stream of a rollout worker: groups in, finished groups out, cancel, stop."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from engine_checks import chat_prompt_ids, hf_log_probs
from transformers import AutoModelForCausalLM

from toolrl import batch as B
from toolrl.rollout.engine import EngineConfig, EngineError, SamplingConfig, VLLMEngine
from toolrl.rollout.stream import GroupJob, StreamError
from toolrl.rollout.worker import RolloutConfig, RolloutWorker

pytestmark = pytest.mark.slow

MAX_LEN = 1024


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    """One rollout worker in this process (its engine serves every test of the module)."""
    w = RolloutWorker(RolloutConfig(
        engine=EngineConfig(model=str(tiny_model_dir), max_model_len=MAX_LEN,
                            kv_cache_gib=0.25, multiprocessing=False, seed=0),
        env_id="toolrl/Calculator-v0", max_tokens_per_turn=24, max_total_tokens=512,
        concurrency=4))
    yield w
    w.shutdown()


@pytest.fixture(scope="module")
def engine(worker):
    return worker.engine


@pytest.fixture(scope="module")
def prompt(tiny_model_dir):
    return chat_prompt_ids(tiny_model_dir)


def push(engine: VLLMEngine, weights: dict[str, torch.Tensor], keep: bool) -> int:
    staged = engine.weights.begin_staged_push(keep_inflight=keep)
    staged.push(weights.items())
    return engine.weights.finish_staged_push(staged)


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    """The engine's weights and a perturbed copy, as transformers models."""
    old = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return old, new


def weights_of(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}


def test_a_push_lands_inside_a_request_in_flight(engine, prompt, models):
    old, new = models
    weights = weights_of(new)
    sampling = SamplingConfig(temperature=1.0, max_tokens=MAX_LEN - len(prompt) - 1,
                              ignore_eos=True, seed=7)
    # without keep_inflight a push refuses to run over a request
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(
        out=engine.generate_sync(prompt, sampling, timeout=300)))
    thread.start()
    deadline = time.monotonic() + 60
    while engine.in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # some tokens on the old weights
    with pytest.raises(EngineError, match="in flight"):
        push(engine, weights, keep=False)
    version = engine.weight_version
    assert push(engine, weights, keep=True) == version + 1
    assert engine.in_flight == 1  # the request survived the push ...
    assert engine.weights.last_pause_s > 0
    thread.join(300)
    out = result["out"][0]
    assert len(out.token_ids) == sampling.max_tokens  # ... and ran to its end
    got = torch.tensor(out.log_probs)
    by_old = hf_log_probs(old, prompt, out.token_ids)
    by_new = hf_log_probs(new, prompt, out.token_ids)
    old_ok = (got - by_old).abs() < 1e-4
    new_ok = (got - by_new).abs() < 1e-4
    # one switch: a prefix sampled by the old weights, the rest by the new ones
    switch = int((~old_ok).nonzero()[0]) if (~old_ok).any() else len(got)
    assert 0 < switch < len(got), switch
    assert old_ok[:switch].all()
    assert new_ok[switch:].all(), (got - by_new).abs()[switch:].max()
    assert (by_old - by_new).abs().max() > 1e-2  # the two weights are told apart
    # each token knows the weights that sampled it: the switch is where the versions change
    assert out.versions == [version] * switch + [version + 1] * (len(got) - switch)
    push(engine, weights_of(old), keep=True)  # idle engine: a keep push works too


def rows(n: int) -> list[dict]:
    from toolrl.envs.calculator import CalculatorEnv

    return CalculatorEnv.make_tasks(n, seed=0, split="val")


def poll_until(worker, count: int, timeout: float = 120) -> list:
    got, deadline = [], time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += worker.stream_poll(0.5)
    return got


def test_the_stream_generates_groups_and_stamps_their_version(worker):
    tasks = rows(3)
    jobs = [GroupJob(f"t{i}", t, 2, seed=i) for i, t in enumerate(tasks)]
    assert worker.stream_submit(jobs) == 3
    with pytest.raises(ValueError, match="already in the stream"):
        worker.stream_submit(jobs[:1])
    done = poll_until(worker, 3)
    assert sorted(g.uid for g in done) == ["t0", "t1", "t2"]
    version = worker.engine.weight_version
    for g in done:
        assert B.batch_len(g.batch) == 2
        assert B.get_non_tensor(g.batch, B.UID) == [g.uid] * 2
        assert g.batch[B.POLICY_VERSION].tolist() == [version] * 2
        assert {t.policy_version for t in B.trajectories(g.batch)} == {version}
        assert g.start_version == g.end_version == version and not g.partial
    assert worker.stream_poll(0.0) == []  # each group comes out once


def test_cancel_and_stop(worker):
    tasks = rows(6)
    worker.stream_submit([GroupJob(f"c{i}", t, 2, seed=i) for i, t in enumerate(tasks)])
    assert worker.stream_cancel(["c3", "c4", "c5", "unknown"]) == 3
    done = poll_until(worker, 3)
    assert sorted(g.uid for g in done) == ["c0", "c1", "c2"]
    worker.stream_submit([GroupJob("s0", tasks[0], 2)])
    assert worker.stream_stop() == 1  # cancelled in flight
    assert worker._stream is None


def test_a_group_that_raises_fails_the_poll(worker, monkeypatch):
    real = worker.arollout

    async def broken(batch, seed=None, greedy=False):
        if B.get_non_tensor(batch, B.UID)[0] == "bad":
            raise RuntimeError("episode loop exploded")
        return await real(batch, seed=seed, greedy=greedy)

    monkeypatch.setattr(worker, "arollout", broken)
    worker.stream_submit([GroupJob("bad", rows(1)[0], 2)])
    with pytest.raises(StreamError, match=r"bad.*episode loop exploded"):
        poll_until(worker, 1, timeout=30)
    worker.stream_stop()


def test_a_partial_rollout_keeps_each_tokens_log_prob_and_the_loss_mask(worker, models):
    """A push lands while a group's multi-turn episodes run: in each sample the sampled
    tokens (response mask 1) before the push carry the old weights' log-probs and version and
    those after it the new weights' (one switch per sample), and observation tokens stay
    masked out. Trained at the new version, the old tokens are 1 version stale, the new ones
    0: the staleness metrics count them token by token, and a bound of 0 refuses them."""
    from toolrl.trainer.staleness import (
        check_bound,
        oldest_version,
        token_lags,
        token_staleness_metrics,
    )

    engine, tasks = worker.engine, rows(8)
    before, after = models
    # the push must land while the group runs: retry, sooner each time, if it did not (a
    # group of the random tiny model can end within ~50 ms)
    for attempt, delay in enumerate([0.05, 0.02, 0.01, 0.005, 0.002, 0.0, 0.0, 0.0]):
        worker.stream_submit([GroupJob(f"p{attempt}", tasks[attempt], 4, seed=attempt)])
        deadline = time.monotonic() + 60
        while engine.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        push(engine, weights_of(after), keep=True)
        (group,) = poll_until(worker, 1)
        if group.partial:
            break
        before, after = after, before  # the engine holds `after` now: push back next time
    assert group.partial and group.end_version == group.start_version + 1
    td = group.batch
    assert set(td[B.POLICY_VERSION].tolist()) == {group.start_version}  # the oldest weights
    switches, v0 = [], group.start_version
    for i in range(B.batch_len(td)):
        keep = td[B.ATTENTION_MASK][i].bool()
        ids = td[B.INPUT_IDS][i][keep].tolist()
        n_prompt = int(td[B.ATTENTION_MASK][i][: td[B.PROMPTS].shape[1]].sum())
        n_resp = len(ids) - n_prompt
        mask = td[B.RESPONSE_MASK][i][:n_resp].bool()
        got = td[B.ROLLOUT_LOG_PROBS][i][:n_resp][mask]
        assert (td[B.ROLLOUT_LOG_PROBS][i][:n_resp][~mask] == 0).all()  # observations: none
        traj = B.trajectories(td)[i]
        assert int(mask.sum()) == traj.sampled_tokens  # the mask is the sampled tokens
        scored = [hf_log_probs(m, ids[:n_prompt], ids[n_prompt:])[mask] for m in (before, after)]
        old_ok = (got - scored[0]).abs() < 1e-4
        new_ok = (got - scored[1]).abs() < 1e-4
        switch = int((~old_ok).nonzero()[0]) if (~old_ok).any() else len(got)
        assert old_ok[:switch].all() and new_ok[switch:].all(), (i, switch)
        versions = td[B.TOKEN_VERSIONS][i][:n_resp]
        assert (versions[~mask] == -1).all()
        assert versions[mask].tolist() == [v0] * switch + [v0 + 1] * (len(got) - switch)
        switches.append((switch, len(got)))
    assert any(s > 0 for s, _ in switches) and any(s < n for s, n in switches), switches
    old_tokens, tokens = sum(s for s, _ in switches), sum(n for _, n in switches)
    lags = token_lags(td, v0 + 1)  # the actor trains on it at the new version
    assert lags.numel() == tokens == int(td[B.RESPONSE_MASK].sum())
    m = token_staleness_metrics(lags, 1, "async")
    assert m["async/token_lag_1"] == pytest.approx(old_tokens / tokens)
    assert m["async/token_lag_0"] == pytest.approx(1 - old_tokens / tokens)
    assert m["async/token_staleness_max"] == 1.0
    assert oldest_version(td, group.start_version) == v0
    check_bound(lags, 1, "async staleness")
    with pytest.raises(RuntimeError, match="outside"):  # max_staleness=0: never trained
        check_bound(lags, 0, "async staleness")
    push(engine, weights_of(models[0]), keep=True)
