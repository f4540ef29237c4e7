"""`toolrl demo`: render a tool-calling prompt with the model's chat template, sample from vLLM.

This is the end-to-end path that exists before the trainer: tokenizer + chat template with
tools -> vLLM CPU engine -> sampled tokens with log-probs -> decoded text.
"""

from __future__ import annotations

import os
import time

from rich.console import Console
from rich.table import Table

DEMO_TOOLS = [
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                         "b": {"type": "number"}},
                       "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Submit the final answer.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "number"}},
                       "required": ["answer"]}}},
]


def run_demo(model: str, num_samples: int = 8, max_tokens: int = 64) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    console = Console()
    tokenizer = AutoTokenizer.from_pretrained(model)
    messages = [{"role": "user", "content": "What is 12 plus 30?"}]
    prompt = tokenizer.apply_chat_template(messages, tools=DEMO_TOOLS, add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    console.print(f"[bold]prompt[/bold] ({len(prompt)} tokens):\n{tokenizer.decode(prompt)}")
    with console.status("starting the vLLM engine"):
        start = time.perf_counter()
        llm = LLM(model=model, dtype="float32", max_model_len=2048, enforce_eager=True, seed=0,
                  gpu_memory_utilization=0.1)
        console.print(f"engine ready in {time.perf_counter() - start:.1f} s")
    params = SamplingParams(n=num_samples, temperature=1.0, max_tokens=max_tokens, logprobs=0,
                            seed=0)
    start = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
    elapsed = time.perf_counter() - start
    table = Table("sample", "tokens", "mean log-prob", "text", title="samples")
    total = 0
    for i, completion in enumerate(out.outputs):
        ids = list(completion.token_ids)
        total += len(ids)
        lps = [next(iter(d.values())).logprob for d in completion.logprobs or []]
        mean_lp = sum(lps) / max(len(lps), 1)
        text = tokenizer.decode(ids)
        table.add_row(str(i), str(len(ids)), f"{mean_lp:.2f}", text[:80].replace("\n", " "))
    console.print(table)
    console.print(f"{total} tokens in {elapsed:.2f} s ({total / elapsed:.0f} tok/s)")
    return 0
