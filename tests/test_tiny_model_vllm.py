"""The tiny model generates in the vLLM CPU engine and agrees with transformers."""

from __future__ import annotations

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is 12 plus 30?"}]
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                     "b": {"type": "number"}},
                   "required": ["a", "b"]}}}]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    from vllm import LLM

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    # gpu_memory_utilization is the fraction of host memory vLLM's CPU backend insists is
    # free at start-up; the KV cache itself is sized by VLLM_CPU_KVCACHE_SPACE.
    engine = LLM(model=str(tiny_model_dir), dtype="float32", max_model_len=1024,
                 enforce_eager=True, seed=0, gpu_memory_utilization=0.1)
    yield engine
    engine.llm_engine.engine_core.shutdown()
    leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(leftover, timeout=30)
    alive = [p for p in alive if _running(p)]
    for p in alive:
        p.kill()
    assert not alive, f"engine processes left running: {[p.pid for p in alive]}"


def _running(proc: psutil.Process) -> bool:
    """An engine process (not multiprocessing's resource tracker) that is not a zombie."""
    try:
        return proc.name().startswith("VLLM") and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_greedy_generation_matches_transformers(llm, tiny_model_dir):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"]
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=0, ignore_eos=True)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
    vllm_ids = list(out.outputs[0].token_ids)
    assert len(vllm_ids) == 12

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt + vllm_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits, dim=-1)
    # greedy: every vLLM token is transformers' argmax (up to near-ties) ...
    hf_greedy = logits.argmax(-1).tolist()
    agree = sum(a == b for a, b in zip(hf_greedy, vllm_ids, strict=True))
    assert agree >= 11
    # ... and the reported log-probs match transformers' on the same tokens
    engine_lp = torch.tensor([next(iter(d.values())).logprob for d in out.outputs[0].logprobs])
    hf_lp = logp[torch.arange(len(vllm_ids)), torch.tensor(vllm_ids)]
    assert torch.allclose(engine_lp, hf_lp, atol=1e-3), (engine_lp - hf_lp).abs().max()


def test_sampling_is_seeded_and_varied(llm, tiny_model_dir):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok.encode("What is 3 times 4?", add_special_tokens=False)
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=7, ignore_eos=True)
    first = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
    again = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
    a = [tuple(c.token_ids) for c in first.outputs]
    b = [tuple(c.token_ids) for c in again.outputs]
    assert a == b  # same seed, same samples
    assert len(set(a)) > 1  # a random model at T=1 does not repeat itself
