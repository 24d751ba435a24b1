"""ta.nn.Attention against a plain-PyTorch implementation of the same module with the same weights.

Rule (DESIGN §4): reference = the plain implementation in float64 on the module's (rounded) weights
and input, with RoPE written as a complex rotation (independent of the module's rotate_half form);
torch's error = the plain implementation in the module's dtype, with torch's SDPA.
"""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import tiled_attn as ta
from tiled_attn import configs
from helpers import HAS_CUDA, INTERPRET, assert_rule, randn

DEVICE = "cuda" if HAS_CUDA else "cpu"


def _rope_complex(x, theta):
    """RoPE as a rotation of the complex numbers x[..., i] + i·x[..., i + D/2] by pos·theta^(-2i/D)."""
    n, d = x.shape[-2], x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    rot = torch.polar(torch.ones(n, d // 2, dtype=torch.float64, device=x.device),
                      torch.outer(torch.arange(n, dtype=torch.float64, device=x.device), freq))
    z = torch.complex(x[..., :d // 2], x[..., d // 2:]) * rot
    return torch.cat((z.real, z.imag), dim=-1)


def _rope_llama(x, theta):
    """Hugging Face Llama's form: cos/sin from float32 angles, rounded to x's dtype."""
    n, d = x.shape[-2], x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = torch.outer(torch.arange(n, dtype=torch.float32, device=x.device), freq).repeat(1, 2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def plain_attention_module(m: "ta.nn.Attention", x: torch.Tensor) -> torch.Tensor:
    """The same module written out: separate q/k/v weights, repeated k/v heads, torch SDPA."""
    h, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    w = m.qkv_proj.weight.to(x.dtype)
    bias = m.qkv_proj.bias.to(x.dtype) if m.qkv_proj.bias is not None else None
    splits = (h * d, hkv * d, hkv * d)
    ws = w.split(splits)
    bs = bias.split(splits) if bias is not None else (None,) * 3
    b, n, _ = x.shape
    q, k, v = (F.linear(x, wi, bi).view(b, n, -1, d).transpose(1, 2) for wi, bi in zip(ws, bs))
    if m.rope_theta is not None:
        rope = _rope_complex if x.dtype == torch.float64 else _rope_llama
        q, k = rope(q, m.rope_theta), rope(k, m.rope_theta)
    k, v = k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=m.causal)
    o = o.transpose(1, 2).reshape(b, n, h * d)
    wo = m.out_proj.weight.to(x.dtype)
    bo = m.out_proj.bias.to(x.dtype) if m.out_proj.bias is not None else None
    return F.linear(o, wo, bo)


def _module(seed, embed_dim, num_heads, num_kv_heads=None, dtype=torch.float32, **kw):
    torch.manual_seed(seed)
    m = ta.nn.Attention(embed_dim, num_heads, num_kv_heads, **kw).to(DEVICE)
    if kw.get("bias"):
        with torch.no_grad():  # default biases start at zero-ish scale: make them matter
            for p in (m.qkv_proj.bias, m.out_proj.bias):
                p.normal_()
    return m.to(dtype)


def _check(m, x, seed, what):
    with torch.no_grad():
        ours = m(x)
        ref = plain_attention_module(m, x.double())
        theirs = plain_attention_module(m, x)
    assert ours.shape == x.shape and ours.dtype == x.dtype
    assert_rule(ours, ref, theirs, dtype=x.dtype, seed=seed, what=what)
    return ours


CONFIGS = [
    # (embed_dim, num_heads, num_kv_heads, causal, bias, rope_theta)
    (64, 4, None, True, False, None),
    (64, 4, 2, True, False, 10000.0),
    (96, 6, 1, False, True, None),
    (128, 2, 2, False, False, 500000.0),
    (256, 8, 4, True, True, 10000.0),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_plain_pytorch(cfg, dtype, seed, kernel_calls):
    e, h, hkv, causal, bias, theta = cfg
    m = _module(seed, e, h, hkv, dtype, causal=causal, bias=bias, rope_theta=theta)
    gen = torch.Generator().manual_seed(seed)
    for n in (1, 13, 70):
        _check(m, randn((2, n, e), dtype, DEVICE, gen), seed, f"{cfg} N={n}")
    assert len(kernel_calls) == 3  # no_grad: our kernels ran


def test_rope_tables_cached_per_length_device_dtype(seed):
    m = _module(seed, 64, 4, 2, rope_theta=10000.0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        m(randn((1, 40, 64), torch.float32, DEVICE, gen))
        (cos40, _), = m._rope_cache.values()
        _check(m, randn((1, 9, 64), torch.float32, DEVICE, gen), seed, "shorter after longer")
        (cos, _), = m._rope_cache.values()
        assert cos is cos40  # shorter sequences slice the table
        _check(m.bfloat16(), randn((1, 50, 64), torch.bfloat16, DEVICE, gen), seed, "bf16, longer")
    assert len(m._rope_cache) == 2


def test_rope_is_relative(seed):
    # RoPE's defining property: q·k depends on the positions only through their difference, so
    # shifting every position by 5 leaves the scores unchanged; and the table form equals the
    # complex rotation.
    gen = torch.Generator().manual_seed(seed)
    q, k = randn((1, 1, 8, 16), torch.float64, "cpu", gen), randn((1, 1, 8, 16), torch.float64, "cpu", gen)
    cos, sin = ta.nn.rotary_tables(20, 16, 10000.0, torch.float64, "cpu")
    qa, ka = ta.nn.apply_rotary(q, cos[:8], sin[:8]), ta.nn.apply_rotary(k, cos[:8], sin[:8])
    qb, kb = ta.nn.apply_rotary(q, cos[5:13], sin[5:13]), ta.nn.apply_rotary(k, cos[5:13], sin[5:13])
    torch.testing.assert_close(qa @ ka.transpose(-1, -2), qb @ kb.transpose(-1, -2))
    torch.testing.assert_close(qa, _rope_complex(q, 10000.0))


def test_causal_vs_not(seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((2, 12, 64), torch.float32, DEVICE, gen)
    x2 = x.clone()
    x2[:, 7:] = randn((2, 5, 64), torch.float32, DEVICE, gen)  # change the future of token 6
    for causal in (True, False):
        m = _module(seed, 64, 4, 2, causal=causal, rope_theta=10000.0)
        with torch.no_grad():
            a, b = _check(m, x, seed, f"causal={causal}"), m(x2)
        prefix_equal = torch.equal(a[:, :7], b[:, :7])
        assert prefix_equal == causal


@pytest.mark.parametrize("backend", [None, "torch", "triton"])
def test_trains_on_our_kernels(seed, kernel_calls, backward_calls, backend):
    """Grad mode with trainable parameters: the attention step is ta.attention forward and backward
    (backend None on the CPU is torch's own SDPA, which then does the backward); parameter
    gradients follow the rule against the plain float64 module."""
    if backend == "triton" and not (HAS_CUDA or INTERPRET):
        pytest.skip("the triton backend needs CUDA or the interpreter")
    m = _module(seed, 64, 4, 2, bias=True, rope_theta=10000.0, backend=backend)
    gen = torch.Generator().manual_seed(seed)
    x = randn((2, 11, 64), torch.float32, DEVICE, gen)
    dy = randn((2, 11, 64), torch.float32, DEVICE, gen)
    grads = {}
    copies = {torch.float64: copy.deepcopy(m).double(), torch.float32: copy.deepcopy(m)}
    for name, dtype in (("ours", None), ("ref", torch.float64), ("torch", torch.float32)):
        mm = m if dtype is None else copies[dtype]
        out = mm(x) if dtype is None else plain_attention_module(mm, x.to(dtype))
        out.backward(dy.to(out.dtype))
        grads[name] = [p.grad for p in mm.parameters()]
    expected = backend or ("native" if DEVICE == "cpu" else configs.DEFAULT_BACKEND[("attention", DEVICE)])
    assert kernel_calls == [expected]
    # backend None on the CPU is torch's SDPA, whose autograd does the backward: no plan of ours.
    assert backward_calls == ([] if expected == "native" else [expected])
    for i, (a, r, t) in enumerate(zip(grads["ours"], grads["ref"], grads["torch"])):
        assert_rule(a, r, t, dtype=torch.float32, seed=seed, what=f"grad of parameter {i}")


def test_frozen_parameters_use_our_kernels(seed, kernel_calls):
    m = _module(seed, 64, 4, rope_theta=10000.0).requires_grad_(False)
    m(torch.zeros(1, 5, 64, device=DEVICE))
    assert len(kernel_calls) == 1


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((63, 4), {}, ValueError, "embed_dim .63. must be a multiple of num_heads .4."),
    ((64, 4, 3), {}, ValueError, "num_heads .4. must be a multiple of num_kv_heads .3."),
    ((1024, 2), {}, ValueError, "head dim .* = 512 must be <= 256"),
    ((64, 0), {}, ValueError, "num_heads must be positive"),
    ((64.0, 4), {}, TypeError, "embed_dim must be an int"),
    ((60, 4), {"rope_theta": 10000.0}, ValueError, "even head dim"),
    ((64, 4), {"rope_theta": 0.5}, ValueError, "rope_theta must be"),
    ((64, 4), {"causal": "yes"}, TypeError, "causal must be a bool"),
    ((64, 4), {"backend": "tpu"}, ValueError, "backend must be"),
])
def test_bad_args(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ta.nn.Attention(*args, **kwargs)


def test_bad_input():
    m = ta.nn.Attention(64, 4)
    with pytest.raises(ValueError, match=r"x must have 3 dims \(B, N, embed_dim\)"):
        m(torch.zeros(5, 64))
    with pytest.raises(ValueError, match="embed_dim=64"):
        m(torch.zeros(1, 5, 32))


def test_head_dim_256_is_accepted(seed):
    m = _module(seed, 512, 2, rope_theta=10000.0)
    assert m.head_dim == 256
    gen = torch.Generator().manual_seed(seed)
    _check(m, randn((1, 9, 512), torch.float32, DEVICE, gen), seed, "D=256")
    assert math.isclose(m.rope_theta, 10000.0)
