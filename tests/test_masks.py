"""Windows, softcap, ALiBi, key masks, varlen and KV caches (issue #15) on the Triton kernels,
against a float64 dense formula under the rule (DESIGN §4).

The reference is written here, independent of tiled_attn.reference: explicit score, bias and
visibility matrices, torch.softmax in float64 (rows that see no key: 0). torch's own error is the
same dense formula in the input dtype (float32 math for 16-bit inputs rounded as SDPA's math path
does: scores in float32, P rounded to the input dtype before P·V); for 16-bit inputs that is what
F.scaled_dot_product_attention with an equivalent float mask computes on its math backend.

CPU (CI): the interpreter at tiny sizes. GPU: larger shapes and every 16-bit dtype, the paged cache
at page sizes 16/64/256.
"""
from __future__ import annotations

import math

import pytest
import torch

import tiled_attn as ta
from tiled_attn.attention import masked_attention
from helpers import HAS_CUDA, INTERPRET, assert_rule, randn

DEVICE = "cuda" if HAS_CUDA else "cpu"
pytestmark = pytest.mark.skipif(not (HAS_CUDA or INTERPRET), reason="needs CUDA or the Triton interpreter")


def dense(q, k, v, *, causal=False, window=None, softcap=None, slopes=None, key_mask=None, offset=None,
          scale=None, compute=torch.float64, p_dtype=None):
    """softmax(mods(scale·q·kᵀ))·v for q (B, Hq, Nq, D), k/v (B, Hkv, Nk, D), in `compute`; P
    rounded to p_dtype before P·V when given (the 16-bit kernels' rounding point)."""
    b, hq, nq, d = q.shape
    nk = k.shape[2]
    g = hq // k.shape[1]
    q, k, v = (t.to(compute) for t in (q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)))
    scale = 1 / math.sqrt(d) if scale is None else scale
    off = nk - nq if offset is None else offset
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(nq, device=q.device)[:, None]
    j = torch.arange(nk, device=q.device)[None, :]
    if slopes is not None:
        sl = slopes.to(compute)
        sl = sl[None, :, None, None] if sl.dim() == 1 else sl[:, :, None, None]
        s = s - sl * (i + off - j).abs().to(compute)
    vis = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    left, right = window or (-1, -1)
    if causal:
        right = 0
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    s = s.masked_fill(~vis, float("-inf"))
    if key_mask is not None:
        if key_mask.dtype == torch.bool:
            s = s.masked_fill(~key_mask[:, None, None, :], float("-inf"))
        else:
            s = s + key_mask.to(compute)[:, None, None, :]
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if p_dtype is not None:
        p = p.to(p_dtype).to(compute)
    return p @ v


def check(out, q, k, v, dtype, seed, what, **kw):
    ref = dense(q, k, v, **kw)
    if dtype == torch.float32:
        theirs = dense(q, k, v, compute=torch.float32, **kw)
    else:
        theirs = dense(q, k, v, compute=torch.float32, p_dtype=dtype, **kw).to(dtype)
    assert_rule(out, ref, theirs, dtype=dtype, seed=seed, what=what)


DTYPES = [torch.float32, torch.bfloat16] if not HAS_CUDA else [torch.float16, torch.bfloat16, torch.float32]
# (Nq, Nk, D, Hq, Hkv): tiny in the interpreter; bigger on the GPU (ragged, GQA, odd D).
SHAPES = ([(37, 53, 40, 4, 2), (64, 29, 16, 2, 2), (1, 70, 32, 4, 1)] if not HAS_CUDA else
          [(37, 53, 40, 4, 2), (257, 1000, 64, 8, 2), (1000, 257, 128, 4, 4), (1, 4096, 128, 8, 1),
           (513, 513, 96, 6, 3), (128, 2048, 256, 2, 1)])
MODS = [dict(window=(5, 3)), dict(window=(7, -1), causal=True), dict(window=(-1, 2)), dict(window=(0, 0)),
        dict(window=(100000, 3)), dict(softcap=0.5), dict(softcap=30.0, causal=True),
        dict(alibi="head", causal=True), dict(alibi="batch", window=(9, 4)),
        dict(softcap=2.0, alibi="head", window=(16, -1), causal=True)]


def _mods_case(shape, mods, dtype, gen, with_dout: bool = False):
    """q, k, v (and dout) of a (Nq, Nk, D, Hq, Hkv) shape at B = 2, the mods as ta.attention's
    keywords, and the ALiBi slopes ("alibi": "head" or "batch") drawn last."""
    nq, nk, d, hq, hkv = shape
    b = 2
    tensors = [randn((b, hq, nq, d), dtype, DEVICE, gen), randn((b, hkv, nk, d), dtype, DEVICE, gen),
               randn((b, hkv, nk, d), dtype, DEVICE, gen)]
    if with_dout:
        tensors.append(randn((b, hq, nq, d), dtype, DEVICE, gen))
    kw = dict(mods)
    alibi = kw.pop("alibi", None)
    slopes = None
    if alibi is not None:
        slopes = (torch.rand((hq,) if alibi == "head" else (b, hq), generator=gen) * 0.5).to(DEVICE)
    return tensors, kw, slopes


@pytest.mark.parametrize("mods", MODS, ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention_mods_forward(shape, mods, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[seed % len(DTYPES)]
    (q, k, v), kw, slopes = _mods_case(shape, mods, dtype, gen)
    b, hq, nq = q.shape[:3]
    out, lse = ta.attention(q, k, v, alibi_slopes=slopes, backend="triton", return_lse=True, **kw)
    check(out, q, k, v, dtype, seed, f"{shape} {mods} {dtype}", slopes=slopes, **kw)
    assert lse.shape == (b, hq, nq) and not torch.isnan(lse).any()


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
def test_masked_attention_key_mask(kind, causal, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[seed % len(DTYPES)]
    b, hq, hkv, nq, nk, d = 3, 4, 2, (33 if not HAS_CUDA else 300), (45 if not HAS_CUDA else 700), 64
    q = randn((b, hq, nq, d), dtype, DEVICE, gen)
    k = randn((b, hkv, nk, d), dtype, DEVICE, gen)
    v = randn((b, hkv, nk, d), dtype, DEVICE, gen)
    valid = torch.rand(b, nk, generator=gen) > 0.3
    valid[2] = False  # a batch row with no key at all: its output is 0
    valid = valid.to(DEVICE)
    mask = valid if kind == "bool" else torch.where(valid, 0.0, float("-inf")).to(dtype)
    offset = nk - nq
    out = masked_attention(q, k, v, mask, causal=causal, causal_offset=offset, backend="triton")
    check(out, q, k, v, dtype, seed, f"key mask {kind} causal={causal}", causal=causal, key_mask=mask,
          offset=offset)
    assert torch.equal(out[2], torch.zeros_like(out[2]))


def test_sdpa_key_padding_mask_runs_ours(seed, kernel_calls):
    """A (B, 1, 1, S) padding mask through the SDPA drop-in runs our kernels, torch's result."""
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float32 if not HAS_CUDA else torch.bfloat16
    q = randn((2, 4, 20, 32), dtype, DEVICE, gen)
    k = randn((2, 2, 31, 32), dtype, DEVICE, gen)
    mask = torch.ones(2, 1, 1, 31, dtype=torch.bool)
    mask[0, ..., 25:] = False   # right padding
    mask[1, ..., :6] = False    # left padding
    mask = mask.to(DEVICE)
    if not HAS_CUDA:
        pytest.skip("on the CPU backend None is torch's reference path (the triton case is above)")
    out = ta.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
    assert kernel_calls == ["triton"]
    ref = dense(q, k, k, key_mask=mask[:, 0, 0])
    theirs = F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
    assert_rule(out, ref, theirs, dtype=dtype, seed=seed, what="sdpa key padding")


def _cu(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("mods", [dict(), dict(causal=True), dict(window=(3, -1), causal=True),
                                  dict(window=(2, 5)), dict(softcap=1.0, causal=True), dict(alibi=True)],
                         ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()) or "plain")
def test_varlen_forward(mods, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[seed % len(DTYPES)]
    if HAS_CUDA:
        lq = [513, 0, 1, 2000, 77, 1024]
        lk = [700, 5, 1, 2000, 0, 300]
        hq, hkv, d = 8, 2, 128
    else:
        lq, lk, hq, hkv, d = [5, 0, 17, 1, 33], [9, 4, 17, 0, 40], 4, 2, 32
    q = randn((sum(lq), hq, d), dtype, DEVICE, gen)
    k = randn((sum(lk), hkv, d), dtype, DEVICE, gen)
    v = randn((sum(lk), hkv, d), dtype, DEVICE, gen)
    kw = dict(mods)
    slopes = (torch.rand(len(lq), hq, generator=gen) * 0.3).to(DEVICE) if kw.pop("alibi", False) else None
    cq, ck = _cu(lq), _cu(lk)
    out, lse = ta.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), alibi_slopes=slopes, return_lse=True,
                                   backend="triton", **kw)
    assert out.shape == q.shape and lse.shape == (hq, sum(lq))
    for b in range(len(lq)):
        if lq[b] == 0:
            continue
        qs, ks, vs = (t[c[b]:c[b + 1]].transpose(0, 1)[None] for t, c in ((q, cq), (k, ck), (v, ck)))
        sl = None if slopes is None else slopes[b:b + 1]
        check(out[cq[b]:cq[b + 1]].transpose(0, 1)[None], qs, ks, vs, dtype, seed, f"varlen seq {b} {mods}",
              slopes=sl, **kw)


def test_varlen_bad_input():
    q = torch.zeros(10, 2, 16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32"):
        ta.attention_varlen(q, q, q, cu.long(), cu, 6, 6)
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        ta.attention_varlen(q, q, q, cu + 1, cu, 6, 6)
    with pytest.raises(ValueError, match="non-decreasing"):
        ta.attention_varlen(q, q, q, torch.tensor([0, 6, 4], dtype=torch.int32), cu, 6, 6)
    with pytest.raises(ValueError, match="past the tensor"):
        ta.attention_varlen(q, q, q, torch.tensor([0, 6, 12], dtype=torch.int32), cu, 6, 6)
    with pytest.raises(ValueError, match="max_seqlen_k = 5 is smaller"):
        ta.attention_varlen(q, q, q, cu, cu, 6, 5)
    with pytest.raises(ValueError, match="same length"):
        ta.attention_varlen(q, q, q, cu, torch.tensor([0, 10], dtype=torch.int32), 6, 10)
    with pytest.raises(ValueError, match="q must have 3 dims"):
        ta.attention_varlen(q[None], q, q, cu, cu, 6, 6)


@pytest.mark.parametrize("page", [None, 4, 32] if not HAS_CUDA else [None, 16, 64, 256])
@pytest.mark.parametrize("nq,n_new", [(1, 0), (1, 1), (4, 4), (3, 0)] if not HAS_CUDA else
                         [(1, 0), (1, 1), (4, 4), (64, 64), (200, 0)])
def test_kvcache(page, nq, n_new, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[seed % len(DTYPES)]
    if HAS_CUDA:
        b, hq, hkv, d, nmax = 3, 32, 8, 128, 4096
        lens = [3000, 0, 4096 - n_new]
    else:
        b, hq, hkv, d, nmax = 2, 4, 2, 32, 64
        lens = [20, 64 - n_new]
    kc = randn((b, nmax, hkv, d), dtype, DEVICE, gen)
    vc = randn((b, nmax, hkv, d), dtype, DEVICE, gen)
    q = randn((b, hq, nq, d), dtype, DEVICE, gen)
    kn = randn((b, hkv, n_new, d), dtype, DEVICE, gen) if n_new else None
    vn = randn((b, hkv, n_new, d), dtype, DEVICE, gen) if n_new else None
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    kw = dict(causal=True)
    if page is None:
        k_cache, v_cache, table = kc.clone(), vc.clone(), None
    else:
        per_row = nmax // page
        perm = torch.randperm(b * per_row, generator=gen)
        table = perm.reshape(b, per_row).to(torch.int32).to(DEVICE)
        k_cache = torch.zeros(b * per_row, page, hkv, d, dtype=dtype, device=DEVICE)
        v_cache = torch.zeros_like(k_cache)
        for r in range(b):
            for p in range(per_row):
                k_cache[table[r, p]] = kc[r, p * page:(p + 1) * page]
                v_cache[table[r, p]] = vc[r, p * page:(p + 1) * page]
    before = k_cache.clone()
    out = ta.attention_kvcache(q, k_cache, v_cache, seqlens, k_new=kn, v_new=vn, block_table=table,
                               backend="triton", **kw)
    for r in range(b):
        n = lens[r]
        kk, vv = kc[r, :n].transpose(0, 1)[None], vc[r, :n].transpose(0, 1)[None]
        if n_new:
            kk, vv = torch.cat([kk, kn[r:r + 1]], 2), torch.cat([vv, vn[r:r + 1]], 2)
            # the append went into the cache, at positions n .. n + n_new - 1 of row r
            pos = torch.arange(n, n + n_new)
            if table is None:
                got = k_cache[r, pos]
            else:
                got = k_cache[table[r, pos // page].long().cpu(), pos % page]
            assert torch.equal(got, kn[r].transpose(0, 1))
        check(out[r:r + 1], q[r:r + 1], kk, vv, dtype, seed, f"kvcache row {r} page={page}", **kw)
    if n_new == 0:
        assert torch.equal(k_cache, before)


def test_kvcache_bad_input():
    q = torch.zeros(2, 4, 1, 16)
    kc = torch.zeros(2, 8, 2, 16)
    lens = torch.tensor([3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="capacity"):
        ta.attention_kvcache(q, kc, kc, lens, k_new=torch.zeros(2, 2, 1, 16), v_new=torch.zeros(2, 2, 1, 16))
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        ta.attention_kvcache(q, kc, kc, lens.long())
    with pytest.raises(ValueError, match="k_new and v_new"):
        ta.attention_kvcache(q, kc, kc, lens, k_new=torch.zeros(2, 2, 1, 16))
    pages = torch.zeros(6, 4, 2, 16)
    with pytest.raises(ValueError, match="block_table\\[1\\] has page indices outside"):
        ta.attention_kvcache(q, pages, pages, lens, block_table=torch.tensor([[0, 1], [2, 9]], dtype=torch.int32))
    with pytest.raises(ValueError, match="inference only"):
        ta.attention_kvcache(q.clone().requires_grad_(), kc, kc, lens)


def test_mods_bad_input():
    q = torch.zeros(1, 2, 4, 16)
    with pytest.raises(TypeError, match="window must be None or a pair"):
        ta.attention(q, q, q, window=3)
    with pytest.raises(ValueError, match="window entries must be >= -1"):
        ta.attention(q, q, q, window=(-2, 0))
    with pytest.raises(ValueError, match="softcap must be a positive"):
        ta.attention(q, q, q, softcap=0.0)
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        ta.attention(q, q, q, alibi_slopes=torch.zeros(3))
    with pytest.raises(TypeError, match="alibi_slopes must be float32"):
        ta.attention(q, q, q, alibi_slopes=torch.zeros(2, dtype=torch.float64))


# -- gradients ------------------------------------------------------------------------------------
GRAD_DTYPES = [torch.bfloat16] if not HAS_CUDA else [torch.float16, torch.bfloat16]


def _grads(fn, leaves, dout):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    return torch.autograd.grad(fn(*leaves), leaves, dout)


def check_grads(ours_fn, ref_fn, leaves, dout, dtype, seed, what):
    """Gradients of ours against float64 autograd of ref_fn, torch's own error = the same formula
    in float32 with P rounded to the input dtype (the flash rounding point), cast to the dtype."""
    ours = _grads(ours_fn, leaves, dout)
    ref = _grads(lambda *t: ref_fn(*t), [t.double() for t in leaves], dout.double())
    theirs = _grads(lambda *t: ref_fn(*t, compute=torch.float32, p_dtype=dtype),
                    [t.float() for t in leaves], dout.float())
    for name, a, r, t in zip("qkv", ours, ref, theirs):
        assert_rule(a, r, t.to(dtype), dtype=dtype, seed=seed, what=f"{what} d{name}")


GRAD_MODS = [dict(window=(5, 3)), dict(window=(7, -1), causal=True), dict(softcap=2.0, causal=True),
             dict(alibi="head", window=(9, 4)), dict(softcap=0.5, alibi="batch")]


@pytest.mark.parametrize("mods", GRAD_MODS, ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()))
@pytest.mark.parametrize("shape", SHAPES[:2] if not HAS_CUDA else SHAPES[:4], ids=lambda s: "x".join(map(str, s)))
def test_attention_mods_backward(shape, mods, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = GRAD_DTYPES[seed % len(GRAD_DTYPES)]
    (q, k, v, dout), kw, slopes = _mods_case(shape, mods, dtype, gen, with_dout=True)
    check_grads(lambda q, k, v: ta.attention(q, k, v, alibi_slopes=slopes, backend="triton", **kw),
                lambda q, k, v, **c: dense(q, k, v, slopes=slopes, **kw, **c), (q, k, v), dout, dtype, seed,
                f"{shape} {mods} {dtype}")


@pytest.mark.parametrize("causal", [False, True])
def test_key_mask_backward(causal, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = GRAD_DTYPES[seed % len(GRAD_DTYPES)]
    b, hq, hkv, nq, nk, d = 2, 4, 2, (30 if not HAS_CUDA else 300), (45 if not HAS_CUDA else 700), 32
    q = randn((b, hq, nq, d), dtype, DEVICE, gen)
    k = randn((b, hkv, nk, d), dtype, DEVICE, gen)
    v = randn((b, hkv, nk, d), dtype, DEVICE, gen)
    dout = randn((b, hq, nq, d), dtype, DEVICE, gen)
    mask = (torch.rand(b, nk, generator=gen) > 0.3).to(DEVICE)
    off = nk - nq
    check_grads(lambda q, k, v: masked_attention(q, k, v, mask, causal=causal, causal_offset=off, backend="triton"),
                lambda q, k, v, **c: dense(q, k, v, causal=causal, key_mask=mask, offset=off, **c), (q, k, v), dout,
                dtype, seed, f"key mask causal={causal}")


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_backward(causal, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = GRAD_DTYPES[seed % len(GRAD_DTYPES)]
    if HAS_CUDA:
        lq, lk, hq, hkv, d = [513, 0, 1, 1000, 77], [700, 5, 1, 1000, 0], 8, 2, 64
    else:
        lq, lk, hq, hkv, d = [5, 0, 17, 1, 33], [9, 4, 17, 0, 40], 4, 2, 32
    q = randn((sum(lq), hq, d), dtype, DEVICE, gen)
    k = randn((sum(lk), hkv, d), dtype, DEVICE, gen)
    v = randn((sum(lk), hkv, d), dtype, DEVICE, gen)
    dout = randn((sum(lq), hq, d), dtype, DEVICE, gen)
    cq, ck = _cu(lq), _cu(lk)

    def ref(q, k, v, **c):
        outs = []
        for b in range(len(lq)):
            qs, ks, vs = (t[cu[b]:cu[b + 1]].transpose(0, 1)[None] for t, cu in ((q, cq), (k, ck), (v, ck)))
            outs.append(dense(qs, ks, vs, causal=causal, **c)[0].transpose(0, 1))
        return torch.cat(outs, 0)

    check_grads(lambda q, k, v: ta.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=causal,
                                                    backend="triton"),
                ref, (q, k, v), dout, dtype, seed, f"varlen causal={causal}")
