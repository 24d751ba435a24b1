"""ta.scaled_dot_product_attention against torch's SDPA (DESIGN §3, §4).

Reference: torch SDPA in float64 on the same rounded inputs; torch's error: torch SDPA in the input
dtype. Calls our kernels do not cover must give exactly torch's output (they are torch's call).
Runs on CUDA when present (default backend: triton), else on the CPU (default: torch's SDPA itself).
"""
import sys

import pytest
import torch
import torch.nn.functional as F

import tiled_attn as ta
from tiled_attn import configs
from helpers import HAS_CUDA, assert_rule, randn

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


def test_requires_grad_runs_our_backward(seed, kernel_calls, backward_calls, monkeypatch):
    """A call that needs a gradient runs our forward and backward plans (on the CPU, where
    backend=None would be torch's own SDPA, the torch backend is forced in its place), and the
    gradients follow the rule against float64 autograd; torch's own op in float32 is the e_torch."""
    if DEVICE == "cpu":
        monkeypatch.setattr(ATTN, "_backend_for", lambda *a: "torch")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (t.requires_grad_() for t in _qkv((2, 4, 10, 16), (2, 2, 14, 16), torch.float32, gen))
    ours = ta.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    dout = randn(ours.shape, torch.float32, DEVICE, gen)
    g_ours = torch.autograd.grad(ours, (q, k, v), dout)
    assert len(kernel_calls) == 1 and kernel_calls[0] != ATTN.NATIVE
    assert backward_calls == kernel_calls
    q6, k6, v6 = (t.detach().double().requires_grad_() for t in (q, k, v))
    g_ref = torch.autograd.grad(F.scaled_dot_product_attention(q6, k6, v6, is_causal=True, enable_gqa=True),
                                (q6, k6, v6), dout.double())
    g_torch = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                                  (q, k, v), dout)
    for name, a, r, t in zip("qkv", g_ours, g_ref, g_torch):
        assert_rule(a, r, t, dtype=torch.float32, seed=seed, what=f"d{name}")


def test_requires_grad_with_a_mask_still_goes_to_torch(seed, kernel_calls, backward_calls):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (t.requires_grad_() for t in _qkv((2, 2, 6, 16), (2, 2, 6, 16), torch.float32, gen))
    mask = torch.rand(6, 6, generator=gen).to(DEVICE) > 0.3
    mask[:, 0] = True
    ours = ta.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(ours, theirs)
    ours.sum().backward()
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
