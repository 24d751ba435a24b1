"""ta.attention_kvcache (issue #15): decode and prefill against a KV cache, contiguous (B, Nmax, Hkv, D)
or paged (num_pages, page_size, Hkv, D) through a shuffled block_table, with k_new/v_new appended in
place first (flash_attn_with_kvcache's meaning), against a float64 dense reference per row under the
numerics rule (DESIGN §4).

Row b attends to its first cache_seqlens[b] cached keys then the Nq_new appended ones, Nk_b =
cache_seqlens[b] + Nq_new keys, bottom-right aligned (off_b = Nk_b − Nq). The reference, torch's own
computations and the lse rule are tests/test_attention_masks.py's, applied per row as a (1, Hq, Nq,
D) problem against the row's logical keys; the results are compared as one (B, Hq, Nq, D) tensor.

Also: the cache after the call holds exactly the old contents with k_new/v_new written at positions
cache_seqlens[b] .. + Nq_new − 1 (through the table when paged; appends that cross a page boundary;
pages no row uses untouched), cache_seqlens is not updated, the paged result is bitwise the
contiguous one on the same logical cache, and bad input raises before any launch and before the
cache is written.

CPU (CI): backends "torch" and "triton" (the interpreter); page sizes 1, 4, 16; Nmax 48. CUDA: page
sizes 16/64/256 on caches of 4096 keys, Nq 1 to 200.
"""
from __future__ import annotations

import pytest
import torch

import tiled_attn as ta
from helpers import HAS_CUDA, assert_rule, backend_available, device_for, randn, skip_reason
from test_attention_masks import (ALL_DTYPES, BACKENDS, DT, GPU_GRID, Mods, assert_blind_rows, assert_lse,
                                  expected_forward, make_slopes, mods_id, on_this_device, require)


class Cache:
    """One logical cache (B, Nmax, Hkv, D) for K and V, and what the call is handed: the same
    tensors (contiguous) or pages laid out through a shuffled block table, with spare pages no row
    uses (random contents, which must stay as they are)."""

    def __init__(self, b, nmax, hkv, d, dtype, device, gen, page=None, spare=3):
        self.page, self.device = page, device
        self.k = randn((b, nmax, hkv, d), dtype, device, gen)
        self.v = randn((b, nmax, hkv, d), dtype, device, gen)
        if page is None:
            self.table = None
            self.k_cache, self.v_cache = self.k.clone(), self.v.clone()
            return
        assert nmax % page == 0
        per_row = nmax // page
        n_pages = b * per_row + spare
        perm = torch.randperm(n_pages, generator=gen)[:b * per_row]
        self.table = perm.reshape(b, per_row).to(torch.int32).to(device)
        self.k_cache = randn((n_pages, page, hkv, d), dtype, device, gen)
        self.v_cache = randn((n_pages, page, hkv, d), dtype, device, gen)
        self._scatter(self.k_cache, self.k)
        self._scatter(self.v_cache, self.v)

    def _scatter(self, pages, logical):
        b, nmax = logical.shape[:2]
        for r in range(b):
            for p in range(nmax // self.page):
                pages[int(self.table[r, p])] = logical[r, p * self.page:(p + 1) * self.page]

    def append(self, lens, k_new, v_new):
        """The expected state after the call: k_new/v_new (B, Hkv, n, D) written at lens[b] ...; returns
        the expected (k_cache, v_cache) as handed to the call."""
        if k_new is None:
            return self.k_cache.clone(), self.v_cache.clone()
        n = k_new.shape[2]
        for r, start in enumerate(lens):
            self.k[r, start:start + n] = k_new[r].transpose(0, 1)
            self.v[r, start:start + n] = v_new[r].transpose(0, 1)
        if self.page is None:
            return self.k.clone(), self.v.clone()
        k_exp, v_exp = self.k_cache.clone(), self.v_cache.clone()
        self._scatter(k_exp, self.k)
        self._scatter(v_exp, self.v)
        return k_exp, v_exp


def check_kvcache(out, lse, q, cache: Cache, lens, n_new, seed, what, *, slopes=None, **mods):
    """The rule on out (B, Hq, Nq, D) and lse (B, Hq, Nq): row b against its logical keys after the
    append, cache.k[b, :lens[b] + n_new]."""
    b, hq, nq, d = q.shape
    assert out.shape == q.shape and out.dtype == q.dtype, f"[{what}] out {tuple(out.shape)} {out.dtype}"
    refs, touts, rl, tl, slack = [], [], [], [], 0.0
    for r in range(b):
        nk = lens[r] + n_new
        qs = q[r:r + 1]
        ks = cache.k[r:r + 1, :nk].transpose(1, 2)
        vs = cache.v[r:r + 1, :nk].transpose(1, 2)
        sl = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[r:r + 1])
        m = Mods(qs, ks, slopes=sl, **mods)
        ro, rlse, to, tlse, s = expected_forward(qs, ks, vs, m)
        refs.append(ro)
        touts.append(to.double())
        rl.append(rlse.double())
        tl.append(tlse.double())
        slack = max(slack, s)
        assert_blind_rows(out[r:r + 1], None if lse is None else lse[r:r + 1], m.seen, seed, f"{what} row {r}")
    assert_rule(out, torch.cat(refs), torch.cat(touts), dtype=q.dtype, seed=seed, what=f"{what} out")
    if lse is not None:
        assert lse.shape == (b, hq, nq) and lse.dtype == torch.float32, f"[{what}] lse {tuple(lse.shape)} {lse.dtype}"
        assert_lse(lse, torch.cat(rl), torch.cat(tl), q.dtype, seed, what, slack)


def run_kvcache(backend, *, b, hq, hkv, d, nq, n_new, nmax, lens, page, dtype, mods, seed, int_lens=False,
                compare_contiguous=True):
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    cache = Cache(b, nmax, hkv, d, dtype, device, gen, page)
    q = randn((b, hq, nq, d), dtype, device, gen)
    k_new = randn((b, hkv, n_new, d), dtype, device, gen) if n_new else None
    v_new = randn((b, hkv, n_new, d), dtype, device, gen) if n_new else None
    kw = {k: v for k, v in mods.items() if k != "alibi"}
    slopes = make_slopes(mods.get("alibi"), b, hq, gen, device)
    seqlens = lens[0] if int_lens else torch.tensor(lens, dtype=torch.int32, device=device)
    lens = [lens[0]] * b if int_lens else list(lens)
    seq_before = None if int_lens else seqlens.clone()
    logical_k, logical_v = cache.k.clone(), cache.v.clone()
    out, lse = ta.attention_kvcache(q, cache.k_cache, cache.v_cache, seqlens, k_new=k_new, v_new=v_new,
                                    block_table=cache.table, return_lse=True, alibi_slopes=slopes,
                                    backend=backend, **kw)
    what = (f"{backend} page={page} B={b} H={hq}/{hkv} D={d} Nq={nq} new={n_new} lens={lens} "
            f"{DT[dtype]} {mods_id(mods)}")
    # the cache: the appended keys where they belong, nothing else changed; cache_seqlens not updated
    k_exp, v_exp = cache.append(lens, k_new, v_new)
    assert torch.equal(cache.k_cache, k_exp), f"[{what}] k_cache after the call differs from the expected append"
    assert torch.equal(cache.v_cache, v_exp), f"[{what}] v_cache after the call differs from the expected append"
    if seq_before is not None:
        assert torch.equal(seqlens, seq_before), f"[{what}] cache_seqlens must not be updated"
    check_kvcache(out, lse, q, cache, lens, n_new, seed, what, slopes=slopes, **kw)
    if page is not None and compare_contiguous:
        # the same call on the contiguous layout of the same logical cache gives the same bits
        kc, vc = logical_k.clone(), logical_v.clone()
        out_c, lse_c = ta.attention_kvcache(q, kc, vc, seqlens, k_new=k_new, v_new=v_new, return_lse=True,
                                            alibi_slopes=slopes, backend=backend, **kw)
        assert torch.equal(kc, cache.k) and torch.equal(vc, cache.v)
        assert torch.equal(out, out_c), f"[{what}] paged out differs from contiguous: " \
            f"{(out.float() - out_c.float()).abs().max().item():.3e}"
        assert torch.equal(lse, lse_c), f"[{what}] paged lse differs from contiguous"
    return out, lse


# ==================================================================================================
# the reduced grid: runs everywhere (CPU interpreter; GPU too)
# ==================================================================================================
CPU_PAGES = [None, 1, 4, 16]
# (Nq, Nq_new): decode without and with an append, a prefill chunk appended, queries attending to
# the cache only, more new keys than queries, more queries than new keys.
CPU_STEPS = [(1, 0), (1, 1), (4, 4), (3, 0), (2, 7), (5, 2)]
CPU_MODS = [dict(causal=True), dict(), dict(causal=True, window=(5, -1)), dict(softcap=2.0, causal=True),
            dict(alibi="batch", causal=True), dict(alibi="head", window=(3, 3)),
            dict(softcap=1.0, alibi="batch", window=(9, 0))]
CPU_HEADS = [(4, 2), (4, 1), (2, 2), (4, 4)]
CPU_DIMS = [32, 40, 16, 64]


def _cpu_cases():
    out = []
    for pi, page in enumerate(CPU_PAGES):
        for si, (nq, n_new) in enumerate(CPU_STEPS):
            i = pi * len(CPU_STEPS) + si
            mods = CPU_MODS[i % len(CPU_MODS)]
            dtype = ALL_DTYPES[(pi + si) % 3]
            heads = CPU_HEADS[(pi + 2 * si) % len(CPU_HEADS)]
            d = CPU_DIMS[(2 * pi + si) % len(CPU_DIMS)]
            out.append(pytest.param(page, nq, n_new, heads, d, dtype, mods,
                                    id=f"page{page}-q{nq}-new{n_new}-{heads[0]}_{heads[1]}-{d}-{DT[dtype]}-"
                                       f"{mods_id(mods)}"))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page,nq,n_new,heads,d,dtype,mods", _cpu_cases())
def test_kvcache(backend, page, nq, n_new, heads, d, dtype, mods, seed):
    """Two rows: one filled up to the capacity after the append, one at 13 keys (an append from 13
    crosses the page boundary at 16 for page sizes 4 and 16)."""
    on_this_device(backend)
    nmax = 48
    run_kvcache(backend, b=2, hq=heads[0], hkv=heads[1], d=d, nq=nq, n_new=n_new, nmax=nmax,
                lens=[nmax - n_new, 13], page=page, dtype=dtype, mods=mods, seed=seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page", [None, 4])
@pytest.mark.parametrize("n_new", [0, 2])
def test_empty_rows(backend, page, n_new, seed):
    """cache_seqlens 0: without an append the row sees no key (out 0, lse −inf); with one it sees
    only the new keys. Nq = 3 > Nk for the other row with causal: its first rows see nothing."""
    on_this_device(backend)
    out, lse = run_kvcache(backend, b=2, hq=4, hkv=2, d=32, nq=3, n_new=n_new, nmax=16, lens=[0, 1], page=page,
                           dtype=torch.float16, mods=dict(causal=True), seed=seed)
    if n_new == 0:
        assert torch.equal(out[0].float().cpu(), torch.zeros(out[0].shape))
        assert bool((lse[0] == float("-inf")).all())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page", [None, 4])
def test_int_cache_seqlens(backend, page, seed):
    """cache_seqlens as a python int: the same length for every row."""
    on_this_device(backend)
    run_kvcache(backend, b=2, hq=4, hkv=1, d=32, nq=2, n_new=2, nmax=32, lens=[17], int_lens=True, page=page,
                dtype=torch.bfloat16, mods=dict(causal=True), seed=seed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_appends_in_steps(backend, seed):
    """Decoding several steps: each call appends one key at cache_seqlens (the caller advances it),
    across page boundaries of a 4-key page; after every step the output is right and the cache
    holds every appended key."""
    on_this_device(backend)
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, d, nmax, page = 2, 4, 2, 32, 24, 4
    dtype = torch.float16
    cache = Cache(b, nmax, hkv, d, dtype, device, gen, page)
    lens = [2, 7]
    for step in range(5):
        q = randn((b, hq, 1, d), dtype, device, gen)
        kn, vn = randn((b, hkv, 1, d), dtype, device, gen), randn((b, hkv, 1, d), dtype, device, gen)
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        out, lse = ta.attention_kvcache(q, cache.k_cache, cache.v_cache, seqlens, k_new=kn, v_new=vn,
                                        block_table=cache.table, causal=True, return_lse=True, backend=backend)
        k_exp, v_exp = cache.append(lens, kn, vn)
        assert torch.equal(cache.k_cache, k_exp) and torch.equal(cache.v_cache, v_exp), f"step {step}"
        check_kvcache(out, lse, q, cache, lens, 1, seed, f"{backend} step {step}", causal=True)
        lens = [n + 1 for n in lens]


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_query(backend, seed):
    """q a (B, Nq, Hq, D) transpose (the layout a model's projection gives), k_new/v_new too."""
    on_this_device(backend)
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, d, nq, nmax = 2, 4, 2, 32, 3, 16
    cache = Cache(b, nmax, hkv, d, torch.bfloat16, device, gen, 4)
    q = randn((b, nq, hq, d), torch.bfloat16, device, gen).transpose(1, 2)
    kn = randn((b, nq, hkv, d), torch.bfloat16, device, gen).transpose(1, 2)
    vn = randn((b, nq, hkv, d), torch.bfloat16, device, gen).transpose(1, 2)
    lens = [5, 9]
    out, lse = ta.attention_kvcache(q, cache.k_cache, cache.v_cache, torch.tensor(lens, dtype=torch.int32,
                                                                                 device=device),
                                    k_new=kn, v_new=vn, block_table=cache.table, causal=True, return_lse=True,
                                    backend=backend)
    k_exp, _ = cache.append(lens, kn, vn)
    assert torch.equal(cache.k_cache, k_exp)
    check_kvcache(out, lse, q, cache, lens, nq, seed, f"{backend} strided", causal=True)


@pytest.mark.parametrize("page", [None, 16])
@pytest.mark.parametrize("nq,splits", [(1, 1), (1, 3), (20, None)])
def test_out_alone_without_return_lse(page, nq, splits, monkeypatch, seed):
    """A call without return_lse plans kernels that write out alone (no lse allocated or stored:
    decode without and with splits, the forward kernel at Nq = 20); its out is bitwise the out of
    the call with return_lse (the same kernels but for the lse stores), which follows the rule."""
    device = require("triton")
    if splits is not None:  # the decode kernel, its split count forced on these small caches
        from tiled_attn.triton import attention as triton_attention
        real = triton_attention.plan_forward_ext
        monkeypatch.setattr(triton_attention, "plan_forward_ext",
                            lambda *a, **kw: real(*a, **{**kw, "kernel": "decode", "num_splits": splits}))
    gen = torch.Generator().manual_seed(seed)
    cache = Cache(2, 64, 2, 32, torch.float16, device, gen, page)
    q = randn((2, 4, nq, 32), torch.float16, device, gen)
    lens = [37, 64 - nq]
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    from tiled_attn import kvcache
    kvcache._PLANS.clear()
    out = ta.attention_kvcache(q, cache.k_cache, cache.v_cache, seqlens, block_table=cache.table, causal=True,
                               backend="triton")
    plan, = kvcache._PLANS.values()
    assert not plan.attn.store_lse
    out2, lse = ta.attention_kvcache(q, cache.k_cache, cache.v_cache, seqlens, block_table=cache.table,
                                     causal=True, backend="triton", return_lse=True)
    assert len(kvcache._PLANS) == 2
    assert torch.equal(out, out2), "out-alone kernels differ from the lse kernels in out"
    check_kvcache(out2, lse, q, cache, lens, 0, seed, f"page={page} nq={nq} splits={splits}", causal=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_metadata(backend, seed):
    """cache_seqlens a step-2 view and block_table a transposed one (column stride != 1): the
    kernels read both at unit stride, so the call must hand them a layout they read right. Called
    twice: the second call runs from the plan the first made."""
    on_this_device(backend)
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, d, nq, nmax, page = 3, 4, 2, 32, 2, 16, 4
    cache = Cache(b, nmax, hkv, d, torch.float16, device, gen, page)
    table = cache.table.t().contiguous().t()
    assert table.stride(1) != 1 and torch.equal(table, cache.table)
    lens = [5, 11, 2]
    wide = torch.tensor([[n, -7] for n in lens], dtype=torch.int32, device=device)
    seqlens = wide[:, 0]
    assert seqlens.stride(0) == 2
    for call in range(2):
        q = randn((b, hq, nq, d), torch.float16, device, gen)
        kn, vn = randn((b, hkv, nq, d), torch.float16, device, gen), randn((b, hkv, nq, d), torch.float16, device, gen)
        out, lse = ta.attention_kvcache(q, cache.k_cache, cache.v_cache, seqlens, k_new=kn, v_new=vn,
                                        block_table=table, causal=True, return_lse=True, backend=backend)
        k_exp, v_exp = cache.append(lens, kn, vn)
        assert torch.equal(cache.k_cache, k_exp) and torch.equal(cache.v_cache, v_exp), f"call {call}"
        check_kvcache(out, lse, q, cache, lens, nq, seed, f"{backend} strided metadata call {call}", causal=True)


def test_default_backend(seed, kernel_calls):
    """backend=None: triton on CUDA, the torch backend on the CPU."""
    device = device_for("torch")
    gen = torch.Generator().manual_seed(seed)
    cache = Cache(2, 8, 1, 16, torch.float32, device, gen)
    q = randn((2, 2, 1, 16), torch.float32, device, gen)
    lens = [3, 7]
    out = ta.attention_kvcache(q, cache.k_cache, cache.v_cache, torch.tensor(lens, dtype=torch.int32, device=device))
    check_kvcache(out, None, q, cache, lens, 0, seed, "backend None")
    if HAS_CUDA:
        assert kernel_calls == ["triton"]
    else:
        assert kernel_calls in ([], ["torch"])  # the torch backend need not run an attention plan


# ==================================================================================================
# bad input: ValueError/TypeError naming the argument, before any launch and before any write
# ==================================================================================================
def _bad_cases():
    """(change to the base call, exception(s), match). Base: q (2, 4, 1, 16); contiguous cache (2, 8,
    2, 16), lengths [3, 7]; paged: 6 pages of 4 (table (2, 2))."""
    i32 = torch.int32
    z = torch.zeros
    return {
        # block_table
        "table_int64": (dict(paged=True, block_table=torch.tensor([[0, 1], [2, 3]])), TypeError, "block_table"),
        "table_float": (dict(paged=True, block_table=z(2, 2)), TypeError, "block_table"),
        "table_1d": (dict(paged=True, block_table=torch.tensor([0, 1, 2, 3], dtype=i32)), ValueError, "block_table"),
        "table_3d": (dict(paged=True, block_table=torch.tensor([[[0, 1], [2, 3]]], dtype=i32)), ValueError,
                     "block_table"),
        "table_rows": (dict(paged=True, block_table=torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=i32)), ValueError,
                       "block_table"),
        "table_negative": (dict(paged=True, block_table=torch.tensor([[0, 1], [-1, 3]], dtype=i32)), ValueError,
                           "block_table"),
        "table_past": (dict(paged=True, block_table=torch.tensor([[0, 1], [2, 6]], dtype=i32)), ValueError,
                       "block_table"),
        "table_list": (dict(paged=True, block_table=[[0, 1], [2, 3]]), (TypeError, ValueError), "block_table"),
        # cache_seqlens
        "lens_int64": (dict(cache_seqlens=torch.tensor([3, 7])), TypeError, "cache_seqlens"),
        "lens_float": (dict(cache_seqlens=torch.tensor([3.0, 7.0])), TypeError, "cache_seqlens"),
        "lens_shape": (dict(cache_seqlens=torch.tensor([3, 7, 1], dtype=i32)), ValueError, "cache_seqlens"),
        "lens_2d": (dict(cache_seqlens=torch.tensor([[3, 7]], dtype=i32)), ValueError, "cache_seqlens"),
        "lens_negative": (dict(cache_seqlens=torch.tensor([3, -1], dtype=i32)), ValueError, "cache_seqlens"),
        "lens_past": (dict(cache_seqlens=torch.tensor([3, 9], dtype=i32)), ValueError, "cache_seqlens"),
        "lens_plus_new_past": (dict(cache_seqlens=torch.tensor([3, 8], dtype=i32), new=1), ValueError,
                               "cache_seqlens"),
        "lens_plus_new_past_paged": (dict(paged=True, cache_seqlens=torch.tensor([6, 3], dtype=i32), new=3),
                                     ValueError, "cache_seqlens"),
        "lens_int_past": (dict(cache_seqlens=9), ValueError, "cache_seqlens"),
        "lens_int_negative": (dict(cache_seqlens=-1), ValueError, "cache_seqlens"),
        "lens_py_float": (dict(cache_seqlens=3.0), TypeError, "cache_seqlens"),
        "lens_list": (dict(cache_seqlens=[3, 7]), TypeError, "cache_seqlens"),
        # k_new / v_new
        "k_new_alone": (dict(new=1, drop="v_new"), ValueError, "k_new|v_new"),
        "v_new_alone": (dict(new=1, drop="k_new"), ValueError, "k_new|v_new"),
        "k_new_heads": (dict(new=1, k_new=z(2, 4, 1, 16), v_new=z(2, 4, 1, 16)), ValueError, "k_new"),
        "k_new_batch": (dict(new=1, k_new=z(1, 2, 1, 16), v_new=z(1, 2, 1, 16)), ValueError, "k_new"),
        "k_new_dim": (dict(new=1, k_new=z(2, 2, 1, 8), v_new=z(2, 2, 1, 8)), ValueError, "k_new"),
        "v_new_len": (dict(new=1, v_new=z(2, 2, 2, 16)), ValueError, "v_new"),
        "k_new_rank": (dict(new=1, k_new=z(2, 2, 16), v_new=z(2, 2, 16)), ValueError, "k_new"),
        "k_new_dtype": (dict(new=1, k_new=z(2, 2, 1, 16, dtype=torch.float16),
                             v_new=z(2, 2, 1, 16, dtype=torch.float16)), TypeError, "k_new"),
        # shapes
        "q_rank": (dict(q=z(2, 4, 16)), ValueError, r"\bq\b"),
        "k_cache_rank": (dict(k_cache=z(2, 8, 32), v_cache=z(2, 8, 32)), ValueError, "k_cache"),
        "cache_mismatch": (dict(v_cache=z(2, 8, 2, 8)), ValueError, "v_cache"),
        "cache_batch": (dict(k_cache=z(3, 8, 2, 16), v_cache=z(3, 8, 2, 16)), ValueError, "k_cache|batch"),
        "cache_heads": (dict(k_cache=z(2, 8, 3, 16), v_cache=z(2, 8, 3, 16)), ValueError, "heads"),
        "cache_dim": (dict(k_cache=z(2, 8, 2, 32), v_cache=z(2, 8, 2, 32)), ValueError, "head dim|k_cache"),
        "cache_dtype": (dict(k_cache=z(2, 8, 2, 16, dtype=torch.float16), v_cache=z(2, 8, 2, 16, dtype=torch.float16)),
                        TypeError, "dtype"),
        # modifications
        "window": (dict(window=(1,)), (TypeError, ValueError), "window"),
        "softcap": (dict(softcap=0.0), ValueError, "softcap"),
        "alibi": (dict(alibi_slopes=z(2)), ValueError, "alibi_slopes"),
        "causal": (dict(causal="yes"), TypeError, "causal"),
        # inference only
        "grad_q": (dict(grad="q"), (ValueError, TypeError), "grad"),
        "grad_k_cache": (dict(grad="k_cache"), (ValueError, TypeError), "grad"),
        "grad_k_new": (dict(new=1, grad="k_new"), (ValueError, TypeError), "grad"),
    }


_BAD = _bad_cases()


@pytest.mark.parametrize("backend", [None, "torch", "triton"])
@pytest.mark.parametrize("name", list(_BAD))
def test_bad_input(name, backend, kernel_calls):
    if backend == "triton" and not backend_available("triton"):
        pytest.skip(skip_reason("triton"))
    change, exc, match = _BAD[name]
    change = dict(change)
    dev = device_for("triton")
    paged, new, drop, grad = change.pop("paged", False), change.pop("new", 0), change.pop("drop", None), \
        change.pop("grad", None)
    args = dict(q=torch.zeros(2, 4, 1, 16), cache_seqlens=torch.tensor([3, 7], dtype=torch.int32))
    if paged:
        args.update(k_cache=torch.randn(6, 4, 2, 16), v_cache=torch.randn(6, 4, 2, 16),
                    block_table=torch.tensor([[4, 1], [0, 3]], dtype=torch.int32))
    else:
        args.update(k_cache=torch.randn(2, 8, 2, 16), v_cache=torch.randn(2, 8, 2, 16))
    if new:
        args.update(k_new=torch.randn(2, 2, new, 16), v_new=torch.randn(2, 2, new, 16))
    args.update(change)
    if drop:
        del args[drop]
    args = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    if grad:
        args[grad].requires_grad_()
    before = {k: args[k].detach().clone() for k in ("k_cache", "v_cache") if isinstance(args.get(k), torch.Tensor)}
    pos = [args.pop(n) for n in ("q", "k_cache", "v_cache", "cache_seqlens")]
    with pytest.raises(exc, match=match):
        ta.attention_kvcache(*pos, backend=backend, **args)
    assert kernel_calls == []
    for name_, t in zip(("k_cache", "v_cache"), pos[1:3]):
        if name_ in before and t.shape == before[name_].shape:
            assert torch.equal(t.detach(), before[name_]), f"{name_} was written before the input was refused"


@pytest.mark.parametrize("bad", ["lens_negative", "lens_past", "table_negative", "table_past"])
def test_bad_values_in_a_recycled_tensor(bad):
    """A new cache_seqlens/block_table with bad values raises even where the allocator puts it at the
    address of one checked before, freed since (CUDA's caching allocator hands the same block back
    at once: a check remembered by address and version counter would pass it unread). No k_new:
    an unchecked bad length must not reach the append."""
    dev = device_for("triton")
    q = torch.zeros(2, 4, 1, 16, device=dev)
    kc = torch.randn(6, 4, 2, 16, device=dev)
    lens_kept = torch.tensor([3, 7], dtype=torch.int32, device=dev)
    table_kept = torch.tensor([[4, 1], [0, 3]], dtype=torch.int32, device=dev)
    values = {"lens_negative": [3, -1], "lens_past": [3, 9], "table_negative": [[4, 1], [-1, 3]],
              "table_past": [[4, 1], [0, 6]]}[bad]
    for _ in range(3):
        if bad.startswith("lens"):
            good = torch.tensor([3, 7], dtype=torch.int32, device=dev)
            ta.attention_kvcache(q, kc, kc, good, block_table=table_kept)
            del good
            bad_t = torch.tensor(values, dtype=torch.int32, device=dev)
            with pytest.raises(ValueError, match="cache_seqlens"):
                ta.attention_kvcache(q, kc, kc, bad_t, block_table=table_kept)
        else:
            good = torch.tensor([[4, 1], [0, 3]], dtype=torch.int32, device=dev)
            ta.attention_kvcache(q, kc, kc, lens_kept, block_table=good)
            del good
            bad_t = torch.tensor(values, dtype=torch.int32, device=dev)
            with pytest.raises(ValueError, match="block_table"):
                ta.attention_kvcache(q, kc, kc, lens_kept, block_table=bad_t)
        del bad_t


def test_cuda_backend_refuses_kvcache(kernel_calls):
    dev = "cuda" if HAS_CUDA else "cpu"
    q = torch.zeros(2, 4, 1, 32, dtype=torch.float16, device=dev)
    kc = torch.zeros(2, 8, 2, 32, dtype=torch.float16, device=dev)
    with pytest.raises(ValueError, match="backend"):
        ta.attention_kvcache(q, kc, kc, torch.tensor([3, 7], dtype=torch.int32, device=dev), backend="cuda")
    assert kernel_calls == []


# ==================================================================================================
# GPU: caches of 4096 keys, page sizes 16/64/256
# ==================================================================================================
GPU_PAGES = [None, 16, 64, 256]
GPU_STEPS = [(1, 0), (1, 1), (4, 4), (64, 64), (200, 0), (16, 3)]
GPU_MODS = [dict(causal=True), dict(causal=True, window=(1024, -1)), dict(softcap=50.0, causal=True),
            dict(alibi="batch", causal=True), dict(), dict(softcap=30.0, alibi="head", window=(256, 0))]


def _gpu_cases():
    if not GPU_GRID:
        return [pytest.param(None, None, None, None, None, id="gpu-grid",
                             marks=pytest.mark.skip(reason="the GPU grid runs on a CUDA device"))]
    out = []
    for pi, page in enumerate(GPU_PAGES):
        for si, (nq, n_new) in enumerate(GPU_STEPS):
            mods = GPU_MODS[(pi + si) % len(GPU_MODS)]
            dtype = ALL_DTYPES[(pi + 2 * si) % 3]
            out.append(pytest.param(page, nq, n_new, dtype, mods, marks=pytest.mark.gpu,
                                    id=f"page{page}-q{nq}-new{n_new}-{DT[dtype]}-{mods_id(mods)}"))
    return out


@pytest.mark.skipif(not GPU_GRID, reason="the GPU grid runs on a CUDA device")
@pytest.mark.parametrize("page,nq,n_new,dtype,mods", _gpu_cases())
def test_gpu_kvcache(page, nq, n_new, dtype, mods, seed):
    """Three rows: 3000 cached keys, none, and full to the capacity after the append; GQA 16/4 at
    D = 128. An append at 3000 crosses a page boundary (3008 for 16, 3008 for 64, 3072 for 256) when
    Nq_new is large enough (64)."""
    nmax = 4096
    run_kvcache("triton", b=3, hq=16, hkv=4, d=128, nq=nq, n_new=n_new, nmax=nmax,
                lens=[3000, 0, nmax - n_new], page=page, dtype=dtype, mods=mods, seed=seed)


@pytest.mark.skipif(not GPU_GRID, reason="the GPU grid runs on a CUDA device")
@pytest.mark.parametrize("page", [16, 64, 256])
def test_gpu_long_decode(page, seed):
    """Split-KV decode over a 32k paged cache, bf16, GQA 32/8 (the benchmark's shape), vs contiguous."""
    run_kvcache("triton", b=2, hq=32, hkv=8, d=128, nq=1, n_new=1, nmax=32768, lens=[32767, 20000], page=page,
                dtype=torch.bfloat16, mods=dict(causal=True), seed=seed)


# ==================================================================================================
# offline (CPU CI): the paged kernels keep the dense kernels' K/V pipelining depth on sm_90a
# ==================================================================================================
def _kv_buffers(kernel, const: dict, opts: dict) -> tuple[int, str]:
    """(shared-memory buffers of each K/V tile in the sm_90a TTGIR, ptxas problems) of one build."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from helpers import sm90a_build_problem, with_constexpr_defaults
    signature, attrs, consts = {}, {}, with_constexpr_defaults(kernel, const)
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name in ("Q", "K", "V", "Out", "Lse", "Part", "Slopes", "SeqK", "BlockTable", "KeyMask"):
            signature[name] = {"Lse": "*fp32", "Part": "*fp32", "Slopes": "*fp32", "SeqK": "*i32",
                               "BlockTable": "*i32", "KeyMask": "*u8"}.get(name, "*bf16")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("qk_scale", "cap_in", "cap_out"):
            signature[name] = "fp32"
        elif name.startswith("stride") and name.endswith("d"):
            signature[name], consts[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if name.startswith("stride"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    ir = triton.compile(ASTSource(kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                        options=opts).asm["ttgir"]
    tile = f"x{const['BLOCK_N']}x{const['BLOCK_D']}xbf16"
    depths = {int(n) for n in re.findall(r"memdesc<(\d+)" + tile, ir)}
    problem = sm90a_build_problem(f"{kernel.fn.__name__} {const.get('PAGE')}", kernel, signature, consts, attrs, opts)
    return (max(depths) if depths else 0), problem


def _paged_depth_problems() -> list[str]:
    """For the sm90 decode row and the D = 128 forward rows, bf16: the paged ext kernels (PAGE
    16/64/256) at the planner's stages against the dense kernels at the row's, and no register
    spills, except on the forward's 128x128 tile for pages < 128 keys (the per-row gather): it
    spills 28-108 bytes at every stage count from 3 to 5 (fewest at the planner's 5), a known cost
    of paged prefill at long Nk."""
    from tiled_attn.triton import attention as ta_triton
    from tiled_attn.triton.attention_decode import attention_decode_ext_kernel, attention_decode_kernel
    from tiled_attn.triton.attention_fwd import attention_fwd_ext_kernel, attention_fwd_kernel
    problems = []
    for kind, n_k in (("decode", 4096), ("fwd", 512), ("fwd", 4096)):
        row = ta_triton.config(kind, torch.device("cpu"), torch.bfloat16, 128, True, n_k, "sm90")
        base = dict(BLOCK_N=row["BLOCK_N"], HEAD_DIM=128, BLOCK_D=128, EVEN_D=True, PRECISION="tf32",
                    UPCAST=False, WIDE=False, RAW=True, FMA=bool(row["FMA"]), LATE_L=bool(row["LATE_L"]),
                    SPLIT_D=1, ACCURATE=False, ADDR="offs" if row["ADDR"] == "tma" else row["ADDR"])
        base.update(dict(BLOCK_M=16, SPLIT=True) if kind == "decode" else dict(BLOCK_M=row["BLOCK_M"]))
        dense_kernel, ext_kernel = ((attention_decode_kernel, attention_decode_ext_kernel) if kind == "decode"
                                    else (attention_fwd_kernel, attention_fwd_ext_kernel))
        opts = dict(num_warps=row["num_warps"], num_stages=row["num_stages"])
        dense, _ = _kv_buffers(dense_kernel, dict(base, CAUSAL=True), opts)
        extra = ta_triton.PAGED_EXTRA_STAGES
        # (page, PAGE_VEC, stages) as the planner builds them: a table read per tile takes the extra
        # stages; the decode's short splits (their table entries in registers, PAGE_VEC) do not.
        builds = [(page, 0, opts["num_stages"] + extra) for page in (16, 64, 256)]
        if kind == "decode":
            builds += [(page, 8, opts["num_stages"]) for page in (64, 256)]
        for page, page_vec, stages in builds:
            ext = dict(base, HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False, ALIBI=False, KEY_MASK=0, SEQ_K=True,
                       PAGED=True, PAGE=page)
            if kind == "fwd":
                ext["VARLEN"] = False
            else:
                ext["PAGE_VEC"] = page_vec
            paged, problem = _kv_buffers(ext_kernel, ext, dict(opts, num_stages=stages))
            if problem and not (kind == "fwd" and base["BLOCK_N"] > page):
                problems.append(problem)
            if paged < dense:
                problems.append(f"{kind} Nk={n_k} page {page} PAGE_VEC {page_vec}: {paged} K/V buffers, "
                                f"dense {dense}")
    return problems


@pytest.mark.skipif(HAS_CUDA, reason="offline compile check (CPU CI); the GPU run times the kernels")
def test_paged_pipeline_depth_for_sm90a():
    """A paged tile's address waits on its block-table entry: the planner adds stages
    (PAGED_EXTRA_STAGES) so the K/V copies still run as many tiles ahead as the dense kernel's,
    with no register spills (tiled_attn/triton/attention.py says what was measured)."""
    from helpers import assert_none_without_interpreter
    assert_none_without_interpreter("test_attention_kvcache", "_paged_depth_problems()", 1200)
