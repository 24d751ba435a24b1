"""ta.scaled_dot_product_attention against torch's SDPA (DESIGN §3, §4).

Reference: torch SDPA in float64 on the same rounded inputs; torch's error: torch SDPA in the input
dtype, or (4-D calls without a mask) the larger of that and the same attention written in torch with
FlashAttention's rounding points (test_attention._torch_own): SDPA's backend choice may be a more
exact algorithm than the one the rule is about, and with huge scores one implementation's rounding
can be luckier than another's by 10x (H200, 2026-11-26, test_large_magnitudes at
TILED_ATTN_SEED=352025247: ours 2.5e-3, the same as the formula's rounding in the interpreter,
against SDPA's 2.3e-4). Calls our kernels do not cover must give exactly torch's output (they are
torch's call).
Runs on CUDA when present (default backend: triton), else on the CPU (default: torch's SDPA itself).
"""
import sys

import pytest
import torch
import torch.nn.functional as F

import tiled_attn as ta
from tiled_attn import configs
from helpers import HAS_CUDA, INTERPRET, assert_rule, max_err, randn
from test_attention import _torch_own

DEVICE = "cuda" if HAS_CUDA else "cpu"
ATTN = sys.modules["tiled_attn.attention"]  # the module (ta.attention is the function)
# What backend=None runs: triton on CUDA; on the CPU torch's own SDPA (tiled_attn.attention.NATIVE).
DEFAULT_BACKEND = ATTN.NATIVE if DEVICE == "cpu" else configs.DEFAULT_BACKEND[("attention", DEVICE)]


def _qkv(qshape, kshape, dtype, gen, vdim=None, scale=1.0):
    vshape = kshape[:-1] + (vdim or kshape[-1],)
    return (randn(qshape, dtype, DEVICE, gen, scale), randn(kshape, dtype, DEVICE, gen, scale),
            randn(vshape, dtype, DEVICE, gen, scale))


def _check(q, k, v, seed, what, **kw):
    ours = ta.scaled_dot_product_attention(q, k, v, **kw)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)
    theirs = F.scaled_dot_product_attention(q, k, v, **kw)
    if q.dim() == 4 and kw.get("attn_mask") is None and q.shape[2] and k.shape[2]:
        scale = kw.get("scale") or q.shape[-1] ** -0.5
        formula = _torch_own(q, k, v, kw.get("is_causal", False), 0, scale)[0][1]
        theirs = max((theirs, formula), key=lambda t: max_err(t, ref))
    assert ours.dtype == q.dtype and ours.shape == theirs.shape
    assert_rule(ours, ref, theirs, dtype=q.dtype, seed=seed, what=what)
    return ours


# (B, Hq, Hkv, Nq, Nk, D): Nq != Nk both ways (top-left causal differs from bottom-right there),
# one query (decode), odd sizes, head dims from 16 to 256.
SHAPES = [
    (1, 1, 1, 1, 1, 16),
    (2, 4, 4, 17, 33, 32),
    (2, 4, 4, 33, 17, 64),
    (1, 3, 3, 1, 129, 64),
    (2, 2, 2, 65, 65, 128),
    (1, 2, 2, 9, 40, 256),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_torch(shape, is_causal, dtype, seed, kernel_calls):
    b, hq, hkv, nq, nk, d = shape
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv((b, hq, nq, d), (b, hkv, nk, d), dtype, gen)
    _check(q, k, v, seed, f"{shape} causal={is_causal}", is_causal=is_causal)
    assert kernel_calls == [DEFAULT_BACKEND]  # our kernels, not torch's


def test_causal_is_top_left_like_torch(seed):
    # Nq > Nk: with torch's top-left mask row i sees keys 0..i, so the last Nk rows see every key and
    # the first row sees only key 0; bottom-right alignment would leave the first rows empty.
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv((1, 2, 12, 16), (1, 2, 5, 16), torch.float32, gen)
    out = _check(q, k, v, seed, "Nq > Nk", is_causal=True)
    first = F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1])
    torch.testing.assert_close(out[:, :, :1], first)
    assert out[:, :, 0].abs().sum() > 0  # bottom-right would give output 0 for this row


@pytest.mark.parametrize("hq,hkv", [(8, 2), (6, 1), (4, 4)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_enable_gqa(hq, hkv, is_causal, seed, kernel_calls):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv((2, hq, 19, 32), (2, hkv, 23, 32), torch.bfloat16, gen)
    _check(q, k, v, seed, f"gqa {hq}/{hkv}", is_causal=is_causal, enable_gqa=True)
    assert len(kernel_calls) == 1


def test_single_kv_head_broadcasts_without_enable_gqa(seed, kernel_calls):
    # torch broadcasts one key/value head over the query heads (matmul semantics): that is MQA.
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv((2, 4, 11, 32), (2, 1, 13, 32), torch.float32, gen)
    _check(q, k, v, seed, "mqa broadcast")
    assert len(kernel_calls) == 1


@pytest.mark.parametrize("scale", [0.05, 1.0, 3.5])
def test_scale(scale, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv((1, 2, 21, 64), (1, 2, 30, 64), torch.float16, gen)
    _check(q, k, v, seed, f"scale={scale}", scale=scale, is_causal=True)


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)], ids=["3-D", "4-D", "5-D"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_3d_and_5d_inputs(batch, is_causal, seed, kernel_calls):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(batch + (4, 10, 32), batch + (2, 14, 32), torch.float32, gen)
    out = _check(q, k, v, seed, f"batch {batch}", is_causal=is_causal, enable_gqa=True)
    assert out.shape == batch + (4, 10, 32)
    assert len(kernel_calls) == 1


def test_non_contiguous_inputs(seed, kernel_calls):
    # (B, N, H, D) storage seen as (B, H, N, D), and a step-sliced key sequence.
    gen = torch.Generator().manual_seed(seed)
    q = randn((2, 13, 4, 32), torch.bfloat16, DEVICE, gen).transpose(1, 2)
    k = randn((2, 40, 4, 32), torch.bfloat16, DEVICE, gen).transpose(1, 2)[:, :, ::2]
    v = randn((2, 4, 32, 20), torch.bfloat16, DEVICE, gen).transpose(-1, -2)
    _check(q, k, v, seed, "strided", is_causal=True)
    assert len(kernel_calls) == 1


def test_large_magnitudes(seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv((1, 2, 16, 32), (1, 2, 48, 32), torch.float32, gen, scale=30.0)
    _check(q, k, v, seed, "large scores", is_causal=True)


@pytest.mark.parametrize("nq,nk", [(0, 5), (5, 0), (0, 0)])
def test_empty(nq, nk, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv((2, 2, nq, 16), (2, 2, nk, 16), torch.float32, gen)
    for is_causal in (False, True):
        out = ta.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal))


# ------------------------------------------------------------------------------------------------
# Calls that go to torch's own SDPA: exactly torch's output, and no launch of ours.
# ------------------------------------------------------------------------------------------------
def _same_as_torch(kernel_calls, *args, **kwargs):
    ours = ta.scaled_dot_product_attention(*args, **kwargs)
    theirs = F.scaled_dot_product_attention(*args, **kwargs)
    assert torch.equal(ours, theirs)
    assert kernel_calls == []
    return ours


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_attn_mask_routes_to_torch(kind, seed, kernel_calls):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv((2, 4, 9, 32), (2, 4, 12, 32), torch.float32, gen)
    keep = torch.rand((2, 1, 9, 12), generator=gen) > 0.3
    keep[..., 0] = True
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    _same_as_torch(kernel_calls, q, k, v, attn_mask=mask.to(DEVICE))


def test_dropout_routes_to_torch(seed, kernel_calls):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv((2, 2, 8, 16), (2, 2, 8, 16), torch.float32, gen)
    torch.manual_seed(seed)
    ours = ta.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
    torch.manual_seed(seed)
    theirs = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
    assert torch.equal(ours, theirs)
    assert kernel_calls == []


# Inputs that need a gradient, as (leaves, make, kwargs): make(*leaves) -> (q, k, v).
# "gqa": (B, H, N, D) leaves, GQA, top-left causal with Nq < Nk (bottom-right would differ);
# "packed": q, k, v strided views of one (B, N, 3, H, D) fused projection (their gradients are not
# dense: our backward writes them through a (B, N, H, D) layout); "3-D": batchless (H, L, E)
# inputs, run as (1, H, L, E) views.
# float16: the rule holds for 16-bit gradients as it is; float32's figure at these tiny sizes needs
# the first-order recompute slack of tests/test_attention_backward.py (torch's float32 error can be
# its final rounding alone), so its gradients are tested there.
GRAD_DTYPE = torch.float16


def _grad_case(layout, gen):
    if layout == "gqa":
        leaves = _qkv((2, 4, 10, 16), (2, 2, 14, 16), GRAD_DTYPE, gen)
        return leaves, (lambda q, k, v: (q, k, v)), dict(is_causal=True, enable_gqa=True)
    if layout == "packed":
        leaves = (randn((2, 9, 3, 2, 16), GRAD_DTYPE, DEVICE, gen),)
        return leaves, (lambda x: tuple(t.transpose(1, 2) for t in x.unbind(2))), dict(is_causal=True)
    leaves = _qkv((4, 7, 16), (4, 12, 16), GRAD_DTYPE, gen)
    return leaves, (lambda q, k, v: (q, k, v)), {}


@pytest.mark.parametrize("layout", ["gqa", "packed", "3-D"])
@pytest.mark.parametrize("backend", [None, "torch", "triton"])
def test_requires_grad_runs_our_backward(backend, layout, seed, kernel_calls, backward_calls, monkeypatch):
    """A call that needs a gradient runs our forward and backward plans, and the gradients follow
    the rule against float64 autograd (torch's own op in float16 is the e_torch). backend None is
    what a user gets: triton on CUDA; on the CPU torch's own SDPA (NATIVE), whose autograd then
    gives exactly torch's gradients and no backward plan of ours runs. "torch"/"triton" force that
    backend in backend None's place (_backend_for), proving our backward on the CPU too."""
    if backend == "triton" and not (HAS_CUDA or INTERPRET):
        pytest.skip("the triton backend needs CUDA or the interpreter")
    if backend is not None:
        monkeypatch.setattr(ATTN, "_backend_for", lambda *a: backend)
    expected = backend or DEFAULT_BACKEND
    gen = torch.Generator().manual_seed(seed)
    leaves, make, kw = _grad_case(layout, gen)
    leaves = [t.requires_grad_() for t in leaves]
    ours = ta.scaled_dot_product_attention(*make(*leaves), **kw)
    dout = randn(ours.shape, GRAD_DTYPE, DEVICE, gen)
    g_ours = torch.autograd.grad(ours, leaves, dout)
    assert kernel_calls == [expected]
    assert backward_calls == ([] if expected == ATTN.NATIVE else [expected])
    l64 = [t.detach().double().requires_grad_() for t in leaves]
    g_ref = torch.autograd.grad(F.scaled_dot_product_attention(*make(*l64), **kw), l64, dout.double())
    g_torch = torch.autograd.grad(F.scaled_dot_product_attention(*make(*leaves), **kw), leaves, dout)
    for i, (a, r, t) in enumerate(zip(g_ours, g_ref, g_torch)):
        assert a.shape == r.shape and a.dtype == GRAD_DTYPE
        if expected == ATTN.NATIVE and layout != "3-D":  # 3-D: torch's call on (1, H, L, E) views
            assert torch.equal(a, t), f"gradient {i}: torch's own SDPA gives torch's gradient"
        assert_rule(a, r, t, dtype=GRAD_DTYPE, seed=seed, what=f"{layout} gradient {i}")


@pytest.mark.parametrize("why", ["attn_mask", "dropout_p"])
def test_requires_grad_what_ours_does_not_cover_still_goes_to_torch(why, seed, kernel_calls, backward_calls):
    """A mask tensor or dropout with inputs that need a gradient: torch's own SDPA forward and
    backward, bitwise (the same RNG draws for dropout), and no plan of ours."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (t.requires_grad_() for t in _qkv((2, 2, 6, 16), (2, 2, 6, 16), torch.float32, gen))
    dout = randn((2, 2, 6, 16), torch.float32, DEVICE, gen)
    if why == "attn_mask":
        mask = torch.rand(6, 6, generator=gen).to(DEVICE) > 0.3
        mask[:, 0] = True
        kw = dict(attn_mask=mask)
    else:
        kw = dict(dropout_p=0.5, is_causal=True)
    results = []
    for fn in (ta.scaled_dot_product_attention, F.scaled_dot_product_attention):
        torch.manual_seed(seed)
        out = fn(q, k, v, **kw)
        results.append((out, *torch.autograd.grad(out, (q, k, v), dout)))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert kernel_calls == [] and backward_calls == []


def test_other_shapes_route_to_torch(seed, kernel_calls):
    gen = torch.Generator().manual_seed(seed)
    # value head dim != query head dim
    q, k, v = _qkv((2, 2, 7, 16), (2, 2, 9, 16), torch.float32, gen, vdim=24)
    _same_as_torch(kernel_calls, q, k, v, is_causal=True)
    # leading dims that broadcast
    q, k, v = _qkv((3, 2, 7, 16), (1, 2, 9, 16), torch.float32, gen)
    _same_as_torch(kernel_calls, q, k, v)
    # one query head against several key heads (torch broadcasts the query)
    q, k, v = _qkv((2, 1, 7, 16), (2, 3, 9, 16), torch.float32, gen)
    _same_as_torch(kernel_calls, q, k, v)
    # 2-D inputs
    q, k, v = _qkv((7, 16), (9, 16), torch.float32, gen)
    _same_as_torch(kernel_calls, q, k, v)
    # float64
    q, k, v = _qkv((1, 2, 7, 16), (1, 2, 9, 16), torch.float64, gen)
    _same_as_torch(kernel_calls, q, k, v, is_causal=True)


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------
def test_gqa_without_enable_gqa_raises():
    q, k = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match="enable_gqa"):
        ta.scaled_dot_product_attention(q, k, k)


def test_attn_mask_with_is_causal_raises():
    q = torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match="attn_mask and is_causal"):
        ta.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool),
                                        is_causal=True)


def test_bad_inputs_raise():
    q = torch.zeros(1, 4, 3, 8)
    with pytest.raises(TypeError, match="key must be a torch.Tensor"):
        ta.scaled_dot_product_attention(q, [1.0], q)
    with pytest.raises(TypeError, match="query must be a floating-point tensor"):
        ta.scaled_dot_product_attention(q.long(), q, q)
    with pytest.raises(ValueError, match="multiple of k/v's heads"):
        ta.scaled_dot_product_attention(q, q[:, :3], q[:, :3], enable_gqa=True)
    with pytest.raises(TypeError, match="k must have q's dtype"):
        ta.scaled_dot_product_attention(q, q.half(), q.half())
