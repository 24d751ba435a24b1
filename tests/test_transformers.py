"""attn_implementation="tiled_attn" in tiny random Llama, Mistral and Gemma 2 models against
"sdpa"/"eager" on the same weights.

Rule (DESIGN §4) on the logits (on the valid, unpadded positions of padded batches): reference = the
"sdpa" (Llama) or "eager" (Mistral, Gemma 2: window, softcap) model in float64 on the same rounded
weights; torch's error = that model in the test dtype (float32 on the CPU, bfloat16 on CUDA).
Padded batches, sliding windows and softcaps must run our kernels (kernel_calls names the backend
of every attention plan that ran); on the CPU, where backend=None is torch's own SDPA for plain
causal calls and the pure-PyTorch "torch" backend for masked ones, the "torch" and "triton"
(interpreter) backends are forced in turn. Skipped when transformers is not installed (it is the
optional `transformers` extra).
"""
import copy
import importlib
import inspect
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
ATTENTION = sys.modules["tiled_attn.attention"]
TT = importlib.import_module("tiled_attn.integrations.transformers")

try:
    from transformers import masking_utils
    HAS_MASK_INTERFACE = hasattr(masking_utils, "AttentionMaskInterface")
except ImportError:
    masking_utils, HAS_MASK_INTERFACE = None, False
# transformers < 4.53 builds a 4-D mask for every padded call (module doc of the integration):
# those go to torch's SDPA, so the tests that padded batches run our kernels need the interface.
needs_mask_interface = pytest.mark.skipif(not HAS_MASK_INTERFACE,
                                          reason="transformers < 4.53 has no AttentionMaskInterface")

# The backends a masked call of ours runs: backend None's on CUDA (triton); on the CPU both the
# pure-PyTorch torch backend (None's choice there for masked calls) and the triton interpreter,
# forced through _backend_for (plain causal calls would otherwise be torch's own SDPA: "native").
BACKENDS = [None] if HAS_CUDA else ["torch", "triton"]


def _force(backend, monkeypatch) -> str:
    """Force `backend` for every call of ours (None: leave the default); the backend the calls
    then report."""
    if backend is not None:
        monkeypatch.setattr(ATTENTION, "_backend_for", lambda *a: backend)
    return backend or configs.DEFAULT_BACKEND[("attention", DEVICE)]


def _family(config, model_cls, impls, seed):
    """{(impl, dtype): model}, one set of random weights; impls is [(impl, dtype), ...]."""
    ta.integrations.transformers.register()
    torch.manual_seed(seed)
    base = model_cls(config).to(DEVICE, DTYPE).eval()
    models = {}
    for impl, dtype in impls:
        m = copy.deepcopy(base).to(dtype)
        m.set_attn_implementation(impl)
        assert m.config._attn_implementation == impl
        models[(impl, dtype)] = m
    return models


def _eager_float64(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None,
                   **kwargs):
    """transformers' eager attention (Gemma 2's formula: softmax(softcap(scale·q kᵀ) + mask) v)
    with the softmax in the inputs' dtype: "eager" itself takes its softmax in float32 whatever
    the dtype, so in float64 it is no float64 reference (and its fully masked rows, float64's
    minimum cast to float32 = -inf, give NaN that spreads through P·V)."""
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    s = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if attention_mask is not None:
        s = s + attention_mask[:, :, :, :key.shape[2]]
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, value).transpose(1, 2).contiguous(), p


EAGER64 = "eager_float64_test"


def _register_eager_float64():
    from transformers import AttentionInterface
    AttentionInterface.register(EAGER64, _eager_float64)
    masking_utils.AttentionMaskInterface.register(EAGER64, masking_utils.eager_mask)


def _trio(config, model_cls, seed, theirs="sdpa"):
    """(ours in DTYPE, `theirs` in DTYPE, the float64 reference): "sdpa" in float64, or for
    "eager" the same formula with a float64 softmax (_eager_float64)."""
    reference = theirs
    if theirs == "eager":
        _register_eager_float64()
        reference = EAGER64
    impls = [("tiled_attn", DTYPE), (theirs, DTYPE), (reference, torch.float64)]
    models = _family(config, model_cls, impls, seed)
    return tuple(models[i] for i in impls)


# initializer_range 0.2 (not 0.02) so attention scores are far from uniform; pad 0, no EOS (a
# generate() runs its full length).
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=128, initializer_range=0.2,
               pad_token_id=0, bos_token_id=None, eos_token_id=None)


def _models(seed):
    """(ours, sdpa in DTYPE, sdpa in float64) of a tiny Llama (GQA)."""
    return _trio(LlamaConfig(**_COMMON), LlamaForCausalLM, seed)


def _mistral(seed, window=5):
    from transformers import MistralConfig, MistralForCausalLM
    config = MistralConfig(**_COMMON, head_dim=16, sliding_window=window)
    return _trio(config, MistralForCausalLM, seed, theirs="eager")


def _gemma2(seed, window=5, softcap=5.0):
    """Gemma 2: layer 0 sliding-window, layer 1 full attention, both with the logit softcap
    (5.0 binds: the scaled scores of these weights reach several units)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM
    config = Gemma2Config(**_COMMON, head_dim=16, sliding_window=window, attn_logit_softcapping=softcap,
                          query_pre_attn_scalar=16, final_logit_softcapping=None)
    return _trio(config, Gemma2ForCausalLM, seed, theirs="eager")


def _inputs(seed, batch=3, n=21):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 128, (batch, n), generator=gen).to(DEVICE)
    mask = torch.ones(batch, n, dtype=torch.long, device=DEVICE)
    mask[0, :5] = 0  # left padding
    mask[1, :1] = 0
    return ids, mask


def _padded(seed, side, batch=3, n=21):
    """ids and a padding mask: "left" (rows padded 5, 1, 0 at the start), "right" (5, 1, 0 at the
    end) or "none"."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 128, (batch, n), generator=gen).to(DEVICE)
    mask = torch.ones(batch, n, dtype=torch.long, device=DEVICE)
    for row, pad in zip(range(batch), (5, 1)):
        if side == "left":
            mask[row, :pad] = 0
        elif side == "right":
            mask[row, n - pad:] = 0
    return ids, mask


def _logits(model, **kw):
    with torch.no_grad():
        return model(**kw).logits


def _check_valid(ours, theirs, ref, ids, mask, seed, what):
    """The rule on the logits of the valid (unpadded) positions: what a padded position computes
    is each implementation's own business (ours gives 0 attention there, eager a uniform one)."""
    kw = dict(input_ids=ids, attention_mask=mask)
    valid = mask.bool()
    out = _logits(ours, **kw)
    assert_rule(out[valid], _logits(ref, **kw)[valid], _logits(theirs, **kw)[valid], dtype=DTYPE, seed=seed,
                what=what)
    return out


def test_logits_match_sdpa_without_padding(seed, kernel_calls):
    ours, theirs, ref = _models(seed)
    ids, _ = _inputs(seed)
    out = _logits(ours, input_ids=ids)
    assert len(kernel_calls) == 2  # one per layer: the causal case runs our kernels
    assert_rule(out, _logits(ref, input_ids=ids), _logits(theirs, input_ids=ids), dtype=DTYPE,
                seed=seed, what="llama, no padding")


@needs_mask_interface
def test_logits_match_sdpa_with_left_padding(seed, kernel_calls):
    ours, theirs, ref = _models(seed)
    ids, mask = _inputs(seed)
    out = _logits(ours, input_ids=ids, attention_mask=mask)
    assert_rule(out, _logits(ref, input_ids=ids, attention_mask=mask),
                _logits(theirs, input_ids=ids, attention_mask=mask), dtype=DTYPE, seed=seed,
                what="llama, left padding")
    # The padding mask reached the attention: the padded rows differ from an unpadded run, the
    # unpadded row does not.
    plain = _logits(ours, input_ids=ids)
    assert not torch.allclose(out[0, 5:], plain[0, 5:])
    torch.testing.assert_close(out[2], plain[2])


@needs_mask_interface
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_prefill_runs_our_kernels(side, backend, seed, kernel_calls, monkeypatch):
    """A left- or right-padded prefill: every layer runs our masked kernels (not torch's SDPA,
    not "native"); the valid positions' logits follow the rule against the float64 "sdpa" model."""
    expected = _force(backend, monkeypatch)
    ours, theirs, ref = _models(seed)
    ids, mask = _padded(seed, side)
    _check_valid(ours, theirs, ref, ids, mask, seed, f"llama, {side} padding")
    assert kernel_calls == [expected] * 2


def _generate(model, ids, mask, steps, **kw):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.scores, 1)


def _check_generate(models, ids, mask, steps, seed, what, **kw):
    """Greedy generate() with each of (ours, theirs, ref): the same tokens, and the scores of
    every step under the rule (the same tokens make every step's inputs the same)."""
    (tok, scores), (tok_t, scores_t), (tok_r, scores_r) = (_generate(m, ids, mask, steps, **kw) for m in models)
    assert torch.equal(tok, tok_t), f"{what}: tokens {tok.tolist()} != theirs {tok_t.tolist()}"
    assert torch.equal(tok_t, tok_r), f"{what}: float64 reference generated other tokens (a near tie)"
    assert_rule(scores, scores_r, scores_t, dtype=DTYPE, seed=seed, what=what)


@needs_mask_interface
@pytest.mark.parametrize("backend", BACKENDS)
def test_generate_left_padding_runs_our_kernels(backend, seed, kernel_calls, monkeypatch):
    """generate() of a left-padded batch (greedy, 4 tokens, the dynamic cache): the prefill and
    every decode step (one query against the cached keys, the padding still masked) run our
    kernels, and the tokens are "sdpa"'s."""
    expected = _force(backend, monkeypatch)
    models = _models(seed)
    ids, mask = _padded(seed, "left", batch=2, n=9)
    _check_generate(models, ids, mask, 4, seed, "llama generate, left padding")
    assert kernel_calls == [expected] * (2 * 4)  # 2 layers × (prefill + 3 decode steps), ours only


@needs_mask_interface
def test_generate_static_cache(seed, kernel_calls, monkeypatch):
    """generate() with a static cache (keys past the valid length are the cache's empty tail):
    the padded prefill runs our masked kernels over the valid keys only; the decode steps, whose
    mask transformers always materializes, get a mask that only pads keys (one query), which
    ta.scaled_dot_product_attention runs on our kernels too. On CUDA generate() compiles those
    decode steps (torch.compile): the mask builder then falls back to sdpa_mask, and our masked
    call must survive the tracing. Tokens are "sdpa"'s."""
    expected = _force(BACKENDS[-1], monkeypatch)
    models = _models(seed)
    ids, mask = _padded(seed, "left", batch=2, n=9)
    _check_generate(models, ids, mask, 3, seed, "llama generate, static cache", cache_implementation="static")
    assert kernel_calls == [expected] * (2 * 3)


@needs_mask_interface
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["none", "left", "right"])
def test_mistral_sliding_window_runs_our_kernels(side, backend, seed, kernel_calls, monkeypatch):
    """Mistral (sliding window 5 < 21 tokens): with padding or without, every layer runs our
    kernels with the window; the valid logits follow the rule against float64 "eager"."""
    expected = _force(backend, monkeypatch)
    ours, theirs, ref = _mistral(seed)
    ids, mask = _padded(seed, side)
    out = _check_valid(ours, theirs, ref, ids, mask, seed, f"mistral, window 5, {side} padding")
    assert kernel_calls == [expected] * 2
    if side == "none":  # the window reached the kernels: without it the last rows differ
        ours.config.sliding_window = 64
        assert not torch.allclose(out[:, -1], _logits(ours, input_ids=ids, attention_mask=mask)[:, -1])


@needs_mask_interface
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["none", "left"])
def test_gemma2_window_and_softcap_run_our_kernels(side, backend, seed, kernel_calls, monkeypatch):
    """Gemma 2 (layer 0: window 5 and softcap 5; layer 1: softcap, full attention): our kernels in
    both layers, padded or not; valid logits under the rule against float64 "eager"."""
    expected = _force(backend, monkeypatch)
    ours, theirs, ref = _gemma2(seed)
    ids, mask = _padded(seed, side)
    _check_valid(ours, theirs, ref, ids, mask, seed, f"gemma2, window 5, softcap 5, {side} padding")
    assert kernel_calls == [expected] * 2


@needs_mask_interface
@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma2_generate_past_the_window(backend, seed, kernel_calls, monkeypatch):
    """generate() on Gemma 2 with left padding, past the window: the sliding layer's cache keeps
    only the last window − 1 keys (the key mask is sliced to them), the full layer all; every call
    ours, tokens "eager"'s."""
    expected = _force(backend, monkeypatch)
    models = _gemma2(seed, window=4)
    ids, mask = _padded(seed, "left", batch=2, n=7)
    _check_generate(models, ids, mask, 4, seed, "gemma2 generate, window 4, left padding")
    assert kernel_calls == [expected] * (2 * 4)


@needs_mask_interface
def test_gemma2_unexpressible_mask_uses_eager_formula(seed, kernel_calls):
    """A mask our kernels do not express (packed sequences: position_ids restart inside a row, so
    transformers builds a block-diagonal 4-D mask) with a softcap (which torch's SDPA lacks) goes
    to the eager formula: no kernel of ours runs, the result is "eager"'s."""
    ours, theirs, ref = _gemma2(seed, window=64)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 128, (1, 14), generator=gen).to(DEVICE)
    pos = torch.cat([torch.arange(6), torch.arange(8)]).to(DEVICE)[None]
    kw = dict(input_ids=ids, position_ids=pos, use_cache=False)  # packing is detected without a cache
    out = _logits(ours, **kw)
    assert kernel_calls == []
    assert_rule(out, _logits(ref, **kw), _logits(theirs, **kw), dtype=DTYPE, seed=seed, what="gemma2, packed")


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


# -- the mask builder on its own: exactly the mask "sdpa" would build --------------------------------
def _expand(ours, nq: int, kv_length: int) -> torch.Tensor:
    """The (B or 1, 1, Nq, kv_length) boolean mask attention_forward computes from the builder's
    result: None with "sdpa"'s flags (Nq > 1: causal over the first Nq keys; one query: every
    key), else the 2-D key mask, queries bottom-right over its L keys, the tagged window, keys
    past L hidden."""
    if ours is None:
        dense = torch.ones(nq, kv_length, dtype=torch.bool)
        if nq > 1:
            dense = torch.zeros(nq, kv_length, dtype=torch.bool)
            dense[:, :nq] = torch.ones(nq, nq, dtype=torch.bool).tril()
        return dense[None, None]
    left, all_valid = getattr(ours, TT.TAG)
    assert not all_valid or bool(ours.all())
    dense = TT._dense(ours.cpu(), nq, left)
    return F.pad(dense, (0, kv_length - ours.shape[1]))


def _mask_kwargs(batch, nq, kv_length, q_offset, kv_offset, mask_function, attention_mask, window):
    from transformers.masking_utils import sdpa_mask
    kw = dict(batch_size=batch, kv_length=kv_length, kv_offset=kv_offset, mask_function=mask_function,
              attention_mask=attention_mask, local_size=window, allow_is_causal_skip=True,
              dtype=torch.float32, device="cpu")
    if "q_length" in inspect.signature(sdpa_mask).parameters:
        kw.update(q_length=nq, q_offset=q_offset)
    else:  # transformers 4.53 .. : the queries' positions
        kw.update(cache_position=torch.arange(q_offset, q_offset + nq))
    return kw


@needs_mask_interface
@pytest.mark.parametrize("window", [None, 1, 3, 6])
def test_mask_builder_is_sdpa_mask(window):
    """For causal and sliding-window patterns, over prefill (Nq == Nk), decode (one query), chunked
    prefill against a cache, a static cache's empty tail (kv_length past the valid keys), a
    sliding cache's offset keys, and left/right/no padding: what attention_forward computes from
    tiled_attn_mask's result is exactly sdpa_mask's materialized mask — and the builder returns a
    2-D key mask or None there, never a 4-D one."""
    TT.register()
    mu = masking_utils
    mask_function = mu.causal_mask_function if window is None else mu.sliding_window_causal_mask_function(window)
    cases = 0
    for nq in (1, 2, 5):
        for seen in (0, 3, 8):
            layouts = [("dynamic", 0, seen + nq), ("static", 0, seen + nq + 4)]
            if window is not None:
                start = max(seen - window + 1, 0)
                layouts.append(("sliding", start, seen + nq - start))
            for layout, kv_offset, kv_length in layouts:
                for pad in ("none", "left", "right"):
                    am = torch.ones(2, seen + nq, dtype=torch.bool)
                    if pad == "left":
                        am[0, :2] = False
                    elif pad == "right":
                        am[1, -1] = False
                    kw = _mask_kwargs(2, nq, kv_length, seen, kv_offset, mask_function, am, window)
                    ours = TT.tiled_attn_mask(**kw)
                    what = f"window={window} nq={nq} seen={seen} {layout} {pad}"
                    assert ours is None or ours.dim() == 2, what
                    expected = mu.sdpa_mask(**dict(kw, allow_is_causal_skip=False))
                    got = _expand(ours, nq, kv_length).expand_as(expected)
                    assert torch.equal(got, expected), what
                    cases += 1
    assert cases >= 54


@needs_mask_interface
def test_mask_builder_window_and_fallbacks():
    """The tag carries transformers' window (key j visible from query i iff i − j < w: our left
    edge w − 1); None without padding where "sdpa" gets None; sdpa_mask's own 4-D result for
    what our kernels do not express (an extra and/or mask function, allow_is_causal_skip=False)."""
    TT.register()
    mu = masking_utils
    am = torch.ones(2, 12, dtype=torch.bool)
    sliding = mu.sliding_window_causal_mask_function(4)
    m = TT.tiled_attn_mask(**_mask_kwargs(2, 12, 12, 0, 0, sliding, am, 4))
    assert m.shape == (2, 12) and getattr(m, TT.TAG) == (3, True)
    assert TT.tiled_attn_mask(**_mask_kwargs(2, 12, 12, 0, 0, mu.causal_mask_function, am, None)) is None
    assert TT.tiled_attn_mask(**_mask_kwargs(2, 12, 12, 0, 0, mu.causal_mask_function, None, None)) is None
    am[0, :3] = False
    m = TT.tiled_attn_mask(**_mask_kwargs(2, 12, 12, 0, 0, mu.causal_mask_function, am, None))
    assert getattr(m, TT.TAG) == (-1, False) and torch.equal(m, am)
    assert m is not am  # the tag is on a tensor of ours, never on the caller's mask
    odd = mu.and_masks(mu.causal_mask_function, lambda b, h, q, k: (q - k) % 2 == 0)
    for kw in (_mask_kwargs(2, 12, 12, 0, 0, odd, am, None),
               dict(_mask_kwargs(2, 12, 12, 0, 0, mu.causal_mask_function, am, None), allow_is_causal_skip=False)):
        m = TT.tiled_attn_mask(**kw)
        assert m is not None and m.dim() == 4 and not hasattr(m, TT.TAG)


def test_importing_tiled_attn_does_not_import_transformers():
    code = "import sys, tiled_attn; assert 'transformers' not in sys.modules, 'imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True)


# The backend a training step of ours runs: backend None's on CUDA (triton); on the CPU, where None
# is torch's own SDPA, the torch and triton (interpreter) backends forced in its place.
TRAIN_BACKENDS = [None] if HAS_CUDA else ["torch", "triton"]


def _train_step(models, ids, mask=None):
    """Per-token losses (valid targets only) and the gradients of every attention projection."""
    losses, grads = [], []
    valid = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    keep = (valid[:, :-1] & valid[:, 1:]).flatten()
    for m in models:
        m.train()
        logits = m(input_ids=ids, attention_mask=mask).logits
        per_token = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(),
                                    reduction="none")[keep]
        per_token.mean().backward()
        losses.append(per_token.detach())
        grads.append([getattr(layer.self_attn, name).weight.grad for layer in m.model.layers
                      for name in ("q_proj", "k_proj", "v_proj", "o_proj")])
        m.eval()
    return losses, grads


@pytest.mark.parametrize("backend", TRAIN_BACKENDS)
def test_training_step_runs_our_kernels(backend, seed, kernel_calls, backward_calls, monkeypatch):
    """A training step of the "tiled_attn" model (train mode, a next-token loss, backward) runs
    our forward and backward plans, one each per layer; its per-token losses and the gradients of
    every attention projection follow the rule against the float64 "sdpa" model, with the "sdpa"
    model in the same dtype as torch's own error (per token: a scalar loss's error can be 0 for
    torch by luck of its last rounding)."""
    if backend is not None:
        monkeypatch.setattr(ATTENTION, "_backend_for", lambda *a: backend)
    ours, theirs, ref = _models(seed)
    ids, _ = _inputs(seed, batch=2, n=13)
    losses, grads = _train_step((ours, theirs, ref), ids)
    expected = backend or configs.DEFAULT_BACKEND[("attention", DEVICE)]
    assert kernel_calls == [expected] * 2  # one forward plan per layer, ours (not "native")
    assert backward_calls == [expected] * 2
    assert_rule(losses[0], losses[2], losses[1], dtype=DTYPE, seed=seed, what="per-token loss")
    for i, (a, r, t) in enumerate(zip(grads[0], grads[2], grads[1])):
        assert_rule(a, r, t, dtype=DTYPE, seed=seed, what=f"gradient {i} (layer {i // 4})")


@needs_mask_interface
@pytest.mark.parametrize("backend", TRAIN_BACKENDS)
def test_padded_training_step_runs_our_kernels(backend, seed, kernel_calls, backward_calls, monkeypatch):
    """The same on a left-padded batch (losses on valid targets only): the masked forward and its
    backward are ours in every layer."""
    expected = _force(backend, monkeypatch)
    ours, theirs, ref = _models(seed)
    ids, mask = _padded(seed, "left", batch=2, n=13)
    losses, grads = _train_step((ours, theirs, ref), ids, mask)
    assert kernel_calls == [expected] * 2
    assert backward_calls == [expected] * 2
    assert_rule(losses[0], losses[2], losses[1], dtype=DTYPE, seed=seed, what="padded per-token loss")
    for i, (a, r, t) in enumerate(zip(grads[0], grads[2], grads[1])):
        assert_rule(a, r, t, dtype=DTYPE, seed=seed, what=f"padded gradient {i} (layer {i // 4})")
