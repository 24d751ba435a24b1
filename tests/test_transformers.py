"""attn_implementation="tiled_attn" in a tiny random Llama against "sdpa" on the same weights.

Rule (DESIGN §4) on the logits: reference = the "sdpa" model in float64 (same rounded weights);
torch's error = the "sdpa" model in the test dtype (float32 on the CPU, bfloat16 on CUDA).
Skipped when transformers is not installed (it is the optional `transformers` extra).
"""
import copy
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import tiled_attn as ta
from tiled_attn import configs
from helpers import HAS_CUDA, assert_rule

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
DTYPE = torch.bfloat16 if HAS_CUDA else torch.float32


def _models(seed):
    """(ours, sdpa in DTYPE, sdpa in float64), one set of weights."""
    ta.integrations.transformers.register()
    torch.manual_seed(seed)
    # initializer_range 0.2 (not Llama's 0.02) so attention scores are far from uniform.
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                         max_position_embeddings=128, initializer_range=0.2)
    models = {}
    base = LlamaForCausalLM(config).to(DEVICE, DTYPE).eval()
    for impl, dtype in (("tiled_attn", DTYPE), ("sdpa", DTYPE), ("sdpa", torch.float64)):
        m = copy.deepcopy(base).to(dtype)
        m.set_attn_implementation(impl)
        models[(impl, dtype)] = m
    assert models[("tiled_attn", DTYPE)].config._attn_implementation == "tiled_attn"
    return models[("tiled_attn", DTYPE)], models[("sdpa", DTYPE)], models[("sdpa", torch.float64)]


def _inputs(seed, batch=3, n=21):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (batch, n), generator=gen).to(DEVICE)
    mask = torch.ones(batch, n, dtype=torch.long, device=DEVICE)
    mask[0, :5] = 0  # left padding
    mask[1, :1] = 0
    return ids, mask


def _logits(model, **kw):
    with torch.no_grad():
        return model(**kw).logits


def test_logits_match_sdpa_without_padding(seed, kernel_calls):
    ours, theirs, ref = _models(seed)
    ids, _ = _inputs(seed)
    out = _logits(ours, input_ids=ids)
    assert len(kernel_calls) == 2  # one per layer: the causal case runs our kernels
    assert_rule(out, _logits(ref, input_ids=ids), _logits(theirs, input_ids=ids), dtype=DTYPE,
                seed=seed, what="llama, no padding")


def test_logits_match_sdpa_with_left_padding(seed, kernel_calls):
    ours, theirs, ref = _models(seed)
    ids, mask = _inputs(seed)
    out = _logits(ours, input_ids=ids, attention_mask=mask)
    assert_rule(out, _logits(ref, input_ids=ids, attention_mask=mask),
                _logits(theirs, input_ids=ids, attention_mask=mask), dtype=DTYPE, seed=seed,
                what="llama, left padding")
    # The padding mask reached the attention (it went to torch's SDPA with it): the padded rows
    # differ from an unpadded run, the unpadded row does not.
    plain = _logits(ours, input_ids=ids)
    assert not torch.allclose(out[0, 5:], plain[0, 5:])
    torch.testing.assert_close(out[2], plain[2])


def test_decode_with_kv_cache_matches_sdpa(seed, kernel_calls):
    # Prefill, then one token at a time: one query against the cached keys (GQA, no mask).
    ours, theirs, ref = _models(seed)
    ids, _ = _inputs(seed, batch=2, n=16)
    outs = {}
    for name, model in (("ours", ours), ("theirs", theirs), ("ref", ref)):
        with torch.no_grad():
            step = model(input_ids=ids[:, :12], use_cache=True)
            logits = [step.logits[:, -1]]
            cache = step.past_key_values
            for t in range(12, 16):
                step = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
                cache = step.past_key_values
                logits.append(step.logits[:, -1])
        outs[name] = torch.stack(logits, 1)
    assert len(kernel_calls) == 2 * 5  # prefill + 4 decode steps, 2 layers, all ours
    assert_rule(outs["ours"], outs["ref"], outs["theirs"], dtype=DTYPE, seed=seed, what="decode")


def test_importing_tiled_attn_does_not_import_transformers():
    code = "import sys, tiled_attn; assert 'transformers' not in sys.modules, 'imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True)


# The backend a training step of ours runs: backend None's on CUDA (triton); on the CPU, where None
# is torch's own SDPA, the torch and triton (interpreter) backends forced in its place.
TRAIN_BACKENDS = [None] if HAS_CUDA else ["torch", "triton"]


@pytest.mark.parametrize("backend", TRAIN_BACKENDS)
def test_training_step_runs_our_kernels(backend, seed, kernel_calls, backward_calls, monkeypatch):
    """A training step of the "tiled_attn" model (train mode, a next-token loss, backward) runs
    our forward and backward plans, one each per layer; its per-token losses and the gradients of
    every attention projection follow the rule against the float64 "sdpa" model, with the "sdpa"
    model in the same dtype as torch's own error (per token: a scalar loss's error can be 0 for
    torch by luck of its last rounding)."""
    if backend is not None:
        monkeypatch.setattr(sys.modules["tiled_attn.attention"], "_backend_for", lambda *a: backend)
    ours, theirs, ref = _models(seed)
    ids, _ = _inputs(seed, batch=2, n=13)
    losses, grads = [], []
    for m in (ours, theirs, ref):
        m.train()
        logits = m(input_ids=ids).logits
        per_token = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(),
                                    reduction="none")
        per_token.mean().backward()
        losses.append(per_token.detach())
        grads.append([getattr(layer.self_attn, name).weight.grad for layer in m.model.layers
                      for name in ("q_proj", "k_proj", "v_proj", "o_proj")])
        m.eval()
    expected = backend or configs.DEFAULT_BACKEND[("attention", DEVICE)]
    assert kernel_calls == [expected] * 2  # one forward plan per layer, ours (not "native")
    assert backward_calls == [expected] * 2
    assert_rule(losses[0], losses[2], losses[1], dtype=DTYPE, seed=seed, what="per-token loss")
    for i, (a, r, t) in enumerate(zip(grads[0], grads[2], grads[1])):
        assert_rule(a, r, t, dtype=DTYPE, seed=seed, what=f"gradient {i} (layer {i // 4})")
