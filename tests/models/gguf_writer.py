"""Write a Hugging Face checkpoint as a GGUF file with the ``gguf`` package's writer (F32
tensors, the GPT-2 style BPE tokenizer), the layout llama.cpp's converter produces: what
`toolrl.models.gguf.import_gguf` must read back exactly. Only for tests of the import."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for llama (transformers reverses it on load)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(model_dir: Path, path: Path) -> Path:
    """``model_dir`` (a llama or qwen2 checkpoint with a BPE tokenizer) as the GGUF ``path``."""
    import gguf
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    arch = config.model_type
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or \
        getattr(config, "rope_theta", 10000.0)
    writer.add_rope_freq_base(float(rope))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    if arch == "llama":
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    # the tokenizer: every id's token, its type, the merges, the special ids, the template
    tok = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab.update(special)
    tokens = [""] * config.vocab_size
    types = [gguf.TokenType.UNUSED] * config.vocab_size
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = gguf.TokenType.CONTROL if text in special else gguf.TokenType.NORMAL
    for i, text in enumerate(tokens):
        if not text:
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    cfg_tok = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    writer.add_eos_token_id(vocab[cfg_tok["eos_token"]])
    if cfg_tok.get("pad_token"):
        writer.add_pad_token_id(vocab[cfg_tok["pad_token"]])
    template = Path(model_dir) / "chat_template.jinja"
    if template.exists():
        writer.add_chat_template(template.read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.numpy().astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else \
                config.num_key_value_heads
            data = _permute(data, heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
