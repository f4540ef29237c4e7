"""The packed layout's varlen route (`toolrl.workers.varlen`): cumulative lengths from the
rollout layout, the kernel shim for each torch's signature, the route choice, and - with a
pure-torch stand-in for the CUDA-only kernel - the same log-probs and gradients as the mask
and padded routes, gradient checkpointing's recomputation included, and the ``auto`` layout
packing wherever the route is varlen. The kernel itself runs in
the gpu-marked test and in the GPU check (`tools/gpu_check`, scoring layouts)."""

from __future__ import annotations

import inspect
from unittest import mock

import pytest
import torch
from fsdp_harness import make_batch
from transformers import AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface, find_packed_sequence_indices
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

from toolrl.batch import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    position_ids_from_mask,
)
from toolrl.workers import varlen
from toolrl.workers.scoring import enable_scoring, score_responses


def _model(model_dir, dtype=torch.float32):
    return enable_scoring(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval())


def _gapped(td):
    """``td`` with every odd row's prompt moved to the left of its block: padding then sits
    between that row's prompt and its response (the packed layout reads the mask, not spans)."""
    td = td.clone()
    p = td[PROMPTS].shape[1]
    for key in (INPUT_IDS, ATTENTION_MASK):
        for row in range(1, td.batch_size[0], 2):
            real = int(td[ATTENTION_MASK][row, :p].sum())
            block = td[key][row, :p].clone()
            td[key][row, :p] = torch.cat([block[p - real:], block[:p - real]])
    td[POSITION_IDS] = position_ids_from_mask(td[ATTENTION_MASK])
    return td


@torch.no_grad()
def _unpadded_log_probs(model, td):
    """transformers' log-probs of each row's real tokens run alone, unpadded: ``[b, R]``."""
    attn = td[ATTENTION_MASK].bool()
    p, r = td[PROMPTS].shape[1], td[RESPONSES].shape[1]
    out = torch.zeros(td.batch_size[0], r)
    for row in range(td.batch_size[0]):
        ids = td[INPUT_IDS][row][attn[row]][None]
        n_prompt, n_resp = int(attn[row, :p].sum()), int(attn[row, p:].sum())
        logits = model(input_ids=ids).logits[0, n_prompt - 1:n_prompt - 1 + n_resp].float()
        labels = td[RESPONSES][row, :n_resp, None]
        out[row, :n_resp] = torch.log_softmax(logits, -1).gather(-1, labels)[:, 0]
    return out


@pytest.fixture
def stand_in(monkeypatch):
    """torch's CUDA-only kernel replaced by the pure-torch reference; counts its calls."""
    calls = []

    def kernel(*args, **kwargs):
        calls.append(kwargs)
        return varlen.reference_varlen_attn(*args, **kwargs)

    kernel.__signature__ = inspect.signature(varlen.reference_varlen_attn)
    monkeypatch.setattr(varlen, "torch_varlen_attn", lambda: kernel)
    return calls


def test_cumulative_lengths_match_the_packed_position_ids():
    """From the attention mask, rows whose prompt and response are apart included: the same
    boundaries as transformers reads from the packed row's position ids."""
    td = _gapped(make_batch(7, seed=4))
    attn = td[ATTENTION_MASK].bool()
    lengths = attn.sum(-1)
    positions = td[POSITION_IDS][attn][None]
    (cu_q, cu_k), (longest, _) = prepare_fa_kwargs_from_position_ids(positions)
    kwargs = varlen.packed_kwargs(lengths)
    assert kwargs["cu_seq_lens_q"].dtype == torch.int32
    assert kwargs["cu_seq_lens_q"].tolist() == cu_q.tolist() == cu_k.tolist()
    assert kwargs["max_length_q"] == kwargs["max_length_k"] == int(longest)
    segments = find_packed_sequence_indices(positions)[0]
    assert torch.bincount(segments).tolist() == lengths.tolist()
    assert varlen.cu_seqlens(torch.tensor([3, 1, 5])).tolist() == [0, 3, 4, 9]


def test_the_varlen_route_gives_the_mask_and_padded_log_probs(tiny_model_dir, stand_in,
                                                              monkeypatch):
    """Same log-probs as the mask route and as each row run alone, rows with padding between
    prompt and response included; every layer runs the kernel and no ``[T, T]`` mask is built."""
    masks = []
    sdpa_mask = AttentionMaskInterface._global_mapping["sdpa"]
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "sdpa",
                        lambda *a, **kw: masks.append(1) or sdpa_mask(*a, **kw))
    model = _model(tiny_model_dir)
    for td in (make_batch(9, seed=2, group_size=3), _gapped(make_batch(6, seed=8))):
        reference = _unpadded_log_probs(model, td)
        with torch.no_grad():
            mask, _ = score_responses(model, td, layout="packed", packed_attention="mask")
            assert masks
            masks.clear()
            stand_in.clear()
            lp, _ = score_responses(model, td, layout="packed", packed_attention="varlen")
        layers = model.config.num_hidden_layers
        assert len(stand_in) == layers and not masks  # one packed row through the kernel
        assert all(kw["window_size"] == (-1, 0) for kw in stand_in)  # causal
        real = td[ATTENTION_MASK][:, -td[RESPONSES].shape[1]:].bool()
        torch.testing.assert_close(lp, mask, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(lp[real], reference[real], atol=2e-5, rtol=1e-5)
        assert (lp[~real] == 0).all()
    assert model.config._attn_implementation == varlen.IMPLEMENTATION


def test_an_installed_model_is_sdpa_for_every_other_layout(tiny_model_dir, stand_in):
    """Once on ``toolrl_varlen`` the padded, shared-prefix and mask-packed forwards are sdpa's
    own: bit for bit the log-probs of the model before the switch."""
    td = make_batch(8, seed=6, group_size=4)
    model = _model(tiny_model_dir)
    layouts = ("padded", "shared_prefix", "packed")
    with torch.no_grad():
        before = [score_responses(model, td, layout=lay, packed_attention="mask")[0]
                  for lay in layouts]
        score_responses(model, td, layout="packed", packed_attention="varlen")
        stand_in.clear()
        after = [score_responses(model, td, layout=lay, packed_attention="mask")[0]
                 for lay in layouts]
    assert model.config._attn_implementation == varlen.IMPLEMENTATION
    assert not stand_in
    for layout, a, b in zip(layouts, before, after, strict=True):
        assert torch.equal(a, b), layout


def test_the_varlen_route_with_gradient_checkpointing_gives_the_padded_gradients(
        tiny_model_dir, stand_in):
    """Checkpointing replays each layer in backward: the replay must attend through the same
    kernel (the layer's keywords carry the lengths), or the gradients go wrong silently."""
    td = make_batch(8, seed=9)
    mask = td[RESPONSE_MASK].float()

    def grads(model, **kwargs):
        model.zero_grad(set_to_none=True)
        lp, ent = score_responses(model, td, with_entropy=True, entropy_grad=True, **kwargs)
        weights = torch.linspace(-1, 1, lp.numel()).reshape(lp.shape)
        ((lp * weights * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    expected = grads(_model(tiny_model_dir), layout="padded")
    model = _model(tiny_model_dir).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    stand_in.clear()
    got = grads(model, layout="packed", packed_attention="varlen")
    layers = model.config.num_hidden_layers
    assert len(stand_in) == 2 * layers  # forward, then each layer's replay in backward
    assert set(got) == set(expected)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=2e-6 * float(grad.abs().max()),
                                   rtol=1e-4, msg=name)


def test_auto_packs_where_the_packed_row_would_take_varlen(tiny_model_dir, stand_in,
                                                            monkeypatch):
    """Where a packed forward would take torch's varlen kernel (faked here: the route is told
    CUDA and bfloat16, the stand-in runs the kernel) the ``auto`` layout packs, with gradient
    checkpointing too, and gives the padded log-probs; with the mask forced it shares prompts.
    The route is asked with the trunk's own device and dtype, read inside the forward."""
    route, seen = varlen.packed_route, []

    def on_cuda(config, device, dtype, choice="auto"):
        seen.append((device.type, dtype, choice))
        return route(config, torch.device("cuda"), torch.bfloat16, choice)

    monkeypatch.setattr(varlen, "packed_route", on_cuda)
    model = _model(tiny_model_dir)
    td = make_batch(12, seed=5, group_size=4)
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        padded, _ = score_responses(model, td, layout="padded")
        shared, _ = score_responses(model, td, layout="shared_prefix")
        assert not stand_in and not seen
        lp, _ = score_responses(model, td)  # the trainer's call: both choices auto
        assert len(stand_in) == layers  # one packed row through the kernel
        assert seen[0] == ("cpu", torch.float32, "auto")
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        stand_in.clear()
        checkpointed, _ = score_responses(model, td)
        assert len(stand_in) == layers
        model.gradient_checkpointing_disable()
        model.eval()
        stand_in.clear()
        masked, _ = score_responses(model, td, packed_attention="mask")
        assert not stand_in
    torch.testing.assert_close(lp, padded, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(checkpointed, lp, atol=2e-5, rtol=1e-5)
    assert torch.equal(masked, shared)


def _fake_kernels():
    """Stand-ins with the signatures of torch 2.10 (``is_causal``), 2.11 (``window_size``,
    no ``enable_gqa``) and 2.13 (``enable_gqa``); each refuses what its torch refuses."""
    ref = varlen.reference_varlen_attn

    def torch_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
                   return_aux=None):
        assert key.shape[1] == query.shape[1] and is_causal
        return ref(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size=(-1, 0))

    def torch_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
                   scale=None, window_size=(-1, -1)):
        assert key.shape[1] == query.shape[1]
        return ref(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                   window_size=window_size)

    def torch_2_13(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
                   scale=None, window_size=(-1, -1), enable_gqa=False):
        return ref(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                   window_size=window_size, enable_gqa=enable_gqa)

    return {"2.10": torch_2_10, "2.11": torch_2_11, "2.13": torch_2_13}


@pytest.mark.parametrize("version", ["2.10", "2.11", "2.13"])
def test_the_kernel_shim_speaks_each_torchs_signature(version):
    """Causal, grouped K/V heads (repeated where the kernel has no ``enable_gqa``), the
    model's scale: per sample, what sdpa gives on that sample alone."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 1, 9, 3])
    total, heads, kv_heads, dim = int(lengths.sum()), 4, 2, 8
    q = torch.randn(total, heads, dim, generator=g)
    k = torch.randn(total, kv_heads, dim, generator=g)
    v = torch.randn(total, kv_heads, dim, generator=g)
    cu = varlen.cu_seqlens(lengths)
    scale = dim ** -0.5 if version == "2.10" else 0.3
    out = varlen.causal_varlen(q, k, v, cu, int(lengths.max()), scale,
                               kernel=_fake_kernels()[version])
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        alone = torch.nn.functional.scaled_dot_product_attention(
            q[s:e].transpose(0, 1), k[s:e].repeat_interleave(2, 1).transpose(0, 1),
            v[s:e].repeat_interleave(2, 1).transpose(0, 1), is_causal=True, scale=scale)
        torch.testing.assert_close(out[s:e], alone.transpose(0, 1), atol=1e-6, rtol=1e-6)
    if version == "2.10":
        with pytest.raises(ValueError, match="takes no scale"):
            varlen.causal_varlen(q, k, v, cu, 9, 0.3, kernel=_fake_kernels()[version])


def test_auto_takes_varlen_only_where_the_kernel_runs(tiny_model_dir, monkeypatch):
    """Pure logic: CUDA in half precision on an sdpa model with full-attention layers."""
    config = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(varlen, "torch_varlen_attn", lambda: varlen.reference_varlen_attn)
    route = varlen.packed_route
    assert route(config, cuda, torch.bfloat16) == ("varlen", "CUDA, bfloat16")
    assert route(config, cuda, torch.float16)[0] == "varlen"
    assert route(config, cpu, torch.bfloat16) == ("mask",
                                                  "varlen_attn runs on CUDA only, not cpu")
    assert "float16/bfloat16" in route(config, cuda, torch.float32)[1]
    assert route(config, cuda, torch.bfloat16, "mask") == ("mask", "asked for")
    assert route(config, cpu, torch.float32, "varlen") == ("varlen", "asked for")
    config._attn_implementation = "eager"
    assert route(config, cuda, torch.bfloat16) == ("mask", "its attention implementation is "
                                                           "'eager', not 'sdpa'")
    with pytest.raises(ValueError, match="'eager', not 'sdpa'"):
        route(config, cuda, torch.bfloat16, "varlen")
    config._attn_implementation = "sdpa"
    config.layer_types = ["sliding_attention", *config.layer_types[1:]]
    assert route(config, cuda, torch.bfloat16) == ("mask", "it has sliding-window layers")
    monkeypatch.setattr(varlen, "torch_varlen_attn", lambda: None)
    assert "no torch.nn.attention.varlen" in route(config, cuda, torch.bfloat16)[1]
    with pytest.raises(ValueError, match="unknown packed attention"):
        route(config, cuda, torch.bfloat16, "flash")


def test_the_cpu_path_is_unchanged_and_says_why(tiny_model_dir, caplog):
    """On the CPU ``auto`` keeps the mask (torch's varlen kernel is CUDA-only) and the model's
    attention implementation stays sdpa; asking for varlen there reaches torch's CUDA kernel."""
    model = _model(tiny_model_dir)
    td = make_batch(4, seed=1)
    varlen._LOGGED.clear()
    with caplog.at_level("INFO", logger="toolrl.workers.varlen"), torch.no_grad():
        auto, _ = score_responses(model, td, layout="packed")
        mask, _ = score_responses(model, td, layout="packed", packed_attention="mask")
    assert torch.equal(auto, mask)
    assert model.config._attn_implementation == "sdpa"
    assert "packed layout: block-diagonal mask (varlen_attn runs on CUDA only, not cpu)" in \
        caplog.messages
    with pytest.raises(ValueError, match="unknown packed attention"):
        score_responses(model, td, layout="packed", packed_attention="flex")
    if varlen.torch_varlen_attn() is not None:  # torch >= 2.10: its kernel has no CPU backend
        with pytest.raises(NotImplementedError), torch.no_grad():
            score_responses(model, td, layout="packed", packed_attention="varlen")


@pytest.mark.gpu
def test_on_cuda_auto_runs_torchs_varlen_kernel(tiny_model_dir):
    """bf16 on CUDA: ``auto`` takes the varlen route, and the ``auto`` layout packs onto it;
    log-probs agree with the mask route and with transformers within bf16 noise; a backward
    goes through the kernel."""
    if varlen.torch_varlen_attn() is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    model = _model(tiny_model_dir, torch.bfloat16).cuda()
    td = _gapped(make_batch(12, seed=5, group_size=4)).to("cuda")
    with torch.no_grad():
        mask, _ = score_responses(model, td, layout="packed", packed_attention="mask")
        lp, _ = score_responses(model, td, layout="packed")
        padded, _ = score_responses(model, td, layout="padded")
        with mock.patch.object(varlen, "packed_call", wraps=varlen.packed_call) as spy:
            auto, _ = score_responses(model, td)  # the auto layout packs on the varlen route
    assert spy.called
    torch.testing.assert_close(auto, lp, atol=1e-3, rtol=0)
    assert model.config._attn_implementation == varlen.IMPLEMENTATION
    real = td[ATTENTION_MASK][:, -td[RESPONSES].shape[1]:].bool()
    assert float((lp - mask)[real].abs().mean()) < 0.02
    assert float((lp - padded)[real].abs().mean()) < 0.02
    lp, ent = score_responses(model, td, layout="packed", with_entropy=True)
    (lp.sum() + 0.01 * ent.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
