"""ta.attention_varlen (issue #15): packed sequences (flash_attn_varlen_func's meaning) against a
float64 dense reference per sequence, under the numerics rule (DESIGN §4).

Sequence b is q rows cu_seqlens_q[b]:cu_seqlens_q[b+1] against k/v rows cu_seqlens_k[b]:
cu_seqlens_k[b+1], bottom-right aligned by its own len_k − len_q, with causal, window, softcap and
ALiBi ((Hq,) or (B, Hq) slopes, B = the number of sequences). The reference, torch's own
computations and the lse/gradient rules are tests/test_attention_masks.py's, applied to each
sequence as a (1, Hq, len, D) problem; the packed results are compared as one tensor (e_ours and
e_torch over every sequence). Output (total_q, Hq, D); lse (Hq, total_q) float32 (flash-attn's
layout). Lengths include 0 (empty queries, empty keys, both) and 1, and len_q != len_k.

CPU (CI): backends "torch" and "triton" (the interpreter), lengths <= 45, D <= 64, heads <= 4.
CUDA: sequences up to 2048 on the triton backend too.
"""
from __future__ import annotations

import pytest
import torch

import tiled_attn as ta
from helpers import HAS_CUDA, assert_rule, backend_available, device_for, randn, skip_reason
from test_attention_masks import (ALL_DTYPES, BACKENDS, DT, GPU_GRID, Mods, assert_blind_rows, assert_grad,
                                  assert_lse, expected_backward, expected_forward, make_slopes, mods_id,
                                  on_this_device, require)


def cu(lengths, device) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def _seq(t: torch.Tensor, c: list, b: int) -> torch.Tensor:
    """Sequence b of a packed (total, H, D) tensor as (1, H, len, D)."""
    return t[c[b]:c[b + 1]].transpose(0, 1)[None]


def _slopes_of(slopes, b):
    if slopes is None:
        return None
    return slopes if slopes.dim() == 1 else slopes[b:b + 1]


def _packed_inputs(lq, lk, hq, hkv, d, dtype, device, gen, extra_q=0, extra_k=0):
    """q (sum lq + extra_q, Hq, D), k, v (sum lk + extra_k, Hkv, D): extra rows past the last
    sequence (cu_seqlens may end before the tensor does)."""
    q = randn((sum(lq) + extra_q, hq, d), dtype, device, gen)
    k = randn((sum(lk) + extra_k, hkv, d), dtype, device, gen)
    v = randn((sum(lk) + extra_k, hkv, d), dtype, device, gen)
    return q, k, v


def check_varlen_forward(out, lse, q, k, v, lq, lk, seed, what, *, slopes=None, **mods):
    """The rule on the packed out and lse (Hq, total_q): every sequence's rows against its dense
    reference; rows that see no key exactly 0 / −inf."""
    hq, d = q.shape[1], q.shape[2]
    assert out.shape == q.shape and out.dtype == q.dtype, f"[{what}] out {tuple(out.shape)} {out.dtype}"
    if lse is not None:
        assert lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32, \
            f"[{what}] lse {tuple(lse.shape)} {lse.dtype}, expected ({hq}, {q.shape[0]}) float32"
    cq, ck = cu(lq, "cpu").tolist(), cu(lk, "cpu").tolist()
    n = cq[-1]
    refs, touts, rl, tl, slack = [], [], [], [], 0.0
    for b in range(len(lq)):
        qs, ks, vs = _seq(q, cq, b), _seq(k, ck, b), _seq(v, ck, b)
        m = Mods(qs, ks, slopes=_slopes_of(slopes, b), **mods)
        ro, rlse, to, tlse, sl = expected_forward(qs, ks, vs, m)
        refs.append(ro[0].transpose(0, 1))
        touts.append(to[0].transpose(0, 1).double())
        rl.append(rlse[0].double())
        tl.append(tlse[0].double())
        slack = max(slack, sl)
        assert_blind_rows(out[cq[b]:cq[b + 1]].transpose(0, 1),
                          None if lse is None else lse[:, cq[b]:cq[b + 1]], m.seen, seed, f"{what} seq {b}")
    empty = torch.zeros(0, hq, d, dtype=torch.float64, device=q.device)
    ref, tout = torch.cat(refs or [empty]), torch.cat(touts or [empty])
    assert_rule(out[:n], ref, tout, dtype=q.dtype, seed=seed, what=f"{what} out")
    if lse is not None:
        none = torch.zeros(hq, 0, dtype=torch.float64, device=q.device)
        assert_lse(lse[:, :n], torch.cat(rl or [none], 1), torch.cat(tl or [none], 1), q.dtype, seed, what, slack)


def check_varlen_backward(grads, q, k, v, go, gl, lq, lk, seed, what, *, slopes=None, **mods):
    """The rule on the packed dq, dk, dv against float64 autograd per sequence."""
    cq, ck = cu(lq, "cpu").tolist(), cu(lk, "cpu").tolist()
    ref = [torch.zeros_like(t, dtype=torch.float64) for t in (q, k, v)]
    tg = [torch.zeros_like(t, dtype=torch.float64) for t in (q, k, v)]
    slack = [0.0, 0.0, 0.0]
    for b in range(len(lq)):
        qs, ks, vs = _seq(q, cq, b), _seq(k, ck, b), _seq(v, ck, b)
        gos = _seq(go, cq, b)
        gls = None if gl is None else gl[:, cq[b]:cq[b + 1]][None]
        m = Mods(qs, ks, slopes=_slopes_of(slopes, b), **mods)
        r, t, sl = expected_backward(qs, ks, vs, gos, gls, m)
        for i, (c, lo, hi) in enumerate(((cq, cq[b], cq[b + 1]), (ck, ck[b], ck[b + 1]), (ck, ck[b], ck[b + 1]))):
            ref[i][lo:hi] = r[i][0].transpose(0, 1)
            tg[i][lo:hi] = t[i][0].transpose(0, 1).double()
            slack[i] = max(slack[i], sl[i])
        blind = ~m.seen.cpu()
        if blind.any():
            dqb = grads[0][cq[b]:cq[b + 1]].detach().float().cpu()[blind]
            assert torch.equal(dqb, torch.zeros_like(dqb)), f"[{what} seq {b} seed={seed}] dq of blind rows must be 0"
    for name, ours, r, t, x, sl in zip(("dq", "dk", "dv"), grads, ref, tg, (q, k, v), slack):
        assert ours.shape == x.shape and ours.dtype == x.dtype, f"[{what}] {name} {tuple(ours.shape)} {ours.dtype}"
        assert_grad(ours, r, t, sl, q.dtype, seed, f"{what} {name}")


def random_lengths(gen, b, most):
    """b lengths drawn in [0, most]."""
    return [int(x) for x in torch.randint(0, most + 1, (b,), generator=gen)]


def _split(mods, b, hq, gen, device):
    kw = {k: v for k, v in mods.items() if k != "alibi"}
    return kw, make_slopes(mods.get("alibi"), b, hq, gen, device)


def run_varlen(backend, lq, lk, hq, hkv, d, dtype, mods, seed, *, backward=False, lse_grad=False,
               extra_q=0, extra_k=0, strided_cu=False):
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _packed_inputs(lq, lk, hq, hkv, d, dtype, device, gen, extra_q, extra_k)
    kw, slopes = _split(mods, len(lq), hq, gen, device)
    cq, ck = cu(lq, device), cu(lk, device)
    if strided_cu:  # step-2 views: the kernels read cu_seqlens at unit stride
        cq, ck = (torch.stack([c, c.flip(0)], 1)[:, 0] for c in (cq, ck))
        assert cq.stride(0) == 2 and ck.stride(0) == 2
    what = f"{backend} lq={lq} lk={lk} H={hq}/{hkv} D={d} {DT[dtype]} {mods_id(mods)}"

    def fn(q_, k_, v_):
        return ta.attention_varlen(q_, k_, v_, cq, ck, max(lq, default=0), max(lk, default=0), return_lse=True,
                                   alibi_slopes=slopes, backend=backend, **kw)

    if not backward:
        out, lse = fn(q, k, v)
        check_varlen_forward(out, lse, q, k, v, lq, lk, seed, what, slopes=slopes, **kw)
        return out, lse
    go = randn(q.shape, dtype, device, gen)
    gl = randn((hq, q.shape[0]), torch.float32, device, gen) if lse_grad else None
    qd, kd, vd = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = fn(qd, kd, vd)
    outs, gs = ([out], [go]) if gl is None else ([out, lse], [go, gl])
    grads = torch.autograd.grad(outs, (qd, kd, vd), gs)
    check_varlen_backward(grads, q, k, v, go, gl, lq, lk, seed, what + (" +lse" if lse_grad else ""),
                          slopes=slopes, **kw)
    return grads


# ==================================================================================================
# the reduced grid: runs everywhere (CPU interpreter; GPU too)
# ==================================================================================================
# (lq, lk): empty q, empty k, both empty, length 1, len_q < len_k, len_q > len_k (with causal: rows
# that see no key), equal.
LENGTHS = [
    ([5, 0, 17, 1, 33], [9, 4, 17, 0, 40]),
    ([30, 1, 0, 12], [7, 1, 0, 45]),
    ([1, 1, 1], [23, 1, 64]),       # decode-like
]
HEADS = [(4, 2), (4, 1), (2, 2), (3, 3)]
DIMS = [32, 40, 59, 64, 16]
VARLEN_MODS = [
    dict(),
    dict(causal=True),
    dict(window=(3, -1), causal=True),
    dict(window=(2, 5)),
    dict(window=(0, 0)),
    dict(window=(-1, 1)),
    dict(window=(1000, 1000)),
    dict(softcap=1.0, causal=True),
    dict(softcap=30.0),
    dict(alibi="batch"),
    dict(alibi="head", causal=True),
    dict(softcap=2.0, alibi="batch", window=(8, 2), causal=True),
]


def _cases():
    out = []
    for i, mods in enumerate(VARLEN_MODS):
        for j in range(2):
            li = (i + j) % len(LENGTHS)
            heads, d, dtype = HEADS[(i + 2 * j) % len(HEADS)], DIMS[(i + j) % len(DIMS)], ALL_DTYPES[(i + 2 * j) % 3]
            out.append(pytest.param(li, heads, d, dtype, mods,
                                    id=f"{mods_id(mods)}-L{li}-{heads[0]}_{heads[1]}-{d}-{DT[dtype]}"))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("li,heads,d,dtype,mods", _cases())
def test_forward(backend, li, heads, d, dtype, mods, seed):
    on_this_device(backend)
    lq, lk = LENGTHS[li]
    run_varlen(backend, lq, lk, *heads, d, dtype, mods, seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DT.get)
def test_random_lengths(backend, dtype, seed):
    """Lengths drawn from the seed (0 to 40, a 0 and a 1 forced in), causal or a window."""
    on_this_device(backend)
    gen = torch.Generator().manual_seed(seed)
    lq, lk = random_lengths(gen, 5, 40), random_lengths(gen, 5, 40)
    lq[1], lk[3] = 0, 1
    mods = [dict(causal=True), dict(window=(4, 1)), dict(alibi="batch", softcap=3.0)][ALL_DTYPES.index(dtype)]
    run_varlen(backend, lq, lk, 4, 2, 32, dtype, mods, seed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_past_the_last_sequence(backend, seed):
    """cu_seqlens may end before the tensors do (flash-attn's meaning: last <= total): the rows past
    it are ignored; every sequence's rows are right."""
    on_this_device(backend)
    run_varlen(backend, [6, 11], [9, 3], 2, 1, 32, torch.float16, dict(causal=True), seed, extra_q=5, extra_k=7)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_strided_cu_seqlens(backend, backward, seed):
    """cu_seqlens given as step-2 views (the second call runs from the cached signature)."""
    on_this_device(backend)
    for _ in range(2):
        run_varlen(backend, [6, 0, 11], [9, 3, 14], 2, 1, 32, torch.float16, dict(causal=True), seed,
                   backward=backward, strided_cu=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_empty(backend, seed):
    """Every sequence empty (q, k or both): out all zeros where a sequence has rows, lse −inf."""
    on_this_device(backend)
    out, lse = run_varlen(backend, [0, 3, 0], [0, 0, 5], 2, 2, 16, torch.bfloat16, dict(causal=True), seed)
    assert torch.equal(out.float().cpu(), torch.zeros(out.shape))
    assert bool((lse == float("-inf")).all())


BWD_CASES = [
    (0, (4, 2), 32, torch.float32, dict(), False),
    (1, (4, 1), 40, torch.float16, dict(causal=True), True),
    (0, (2, 2), 59, torch.bfloat16, dict(window=(3, 2)), False),
    (1, (4, 2), 32, torch.float32, dict(softcap=1.0, causal=True), True),
    (2, (3, 3), 16, torch.float16, dict(alibi="batch"), False),
    (0, (4, 1), 24, torch.bfloat16, dict(softcap=2.0, alibi="head", window=(8, -1), causal=True), True),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("li,heads,d,dtype,mods,lse_grad", [
    pytest.param(*c, id=f"{mods_id(c[4])}-L{c[0]}-{c[1][0]}_{c[1][1]}-{c[2]}-{DT[c[3]]}{'-lse' if c[5] else ''}")
    for c in BWD_CASES])
def test_backward(backend, li, heads, d, dtype, mods, lse_grad, seed):
    """dq, dk, dv (and through lse, whose layout is (Hq, total_q)) against float64 autograd."""
    on_this_device(backend)
    lq, lk = LENGTHS[li]
    run_varlen(backend, lq, lk, *heads, d, dtype, mods, seed, backward=True, lse_grad=lse_grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_dense_batch(backend, seed):
    """Equal lengths: varlen is ta.attention on the (B, H, N, D) batch (same backend; the rule holds
    for both against the same reference, and they agree to the 16-bit output's rounding)."""
    on_this_device(backend)
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    b, n, m_, hq, hkv, d = 2, 21, 34, 4, 2, 32
    q4 = randn((b, hq, n, d), torch.bfloat16, device, gen)
    k4 = randn((b, hkv, m_, d), torch.bfloat16, device, gen)
    v4 = randn((b, hkv, m_, d), torch.bfloat16, device, gen)
    slopes = make_slopes("batch", b, hq, gen, device)
    kw = dict(causal=True, window=(7, -1), alibi_slopes=slopes, backend=backend)
    dense_out = ta.attention(q4, k4, v4, **kw)
    packed = [t.transpose(1, 2).reshape(-1, t.shape[1], d) for t in (q4, k4, v4)]
    out = ta.attention_varlen(*packed, cu([n] * b, device), cu([m_] * b, device), n, m_, **kw)
    out4 = out.reshape(b, n, hq, d).transpose(1, 2)
    torch.testing.assert_close(out4.float(), dense_out.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mods", [dict(), dict(causal=True), dict(window=(5, 2), alibi="batch"),
                                  dict(softcap=20.0, causal=True, alibi="head")], ids=mods_id)
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_equal_lengths_run_the_dense_call(backend, mods, backward, monkeypatch, seed):
    """Every sequence exactly max_seqlen_q / max_seqlen_k long (Nq != Nk, GQA): the call is
    ta.attention's on the (B, N) batch (varlen.py), meeting the same rule, gradients and lse
    included; with a row past the last sequence, or one sequence shorter, it is the varlen kernel's."""
    on_this_device(backend)
    from tiled_attn import varlen
    dense = []
    real = varlen._dense_attention

    def counting(*a, **kw):
        dense.append(kw["backend"])
        return real(*a, **kw)
    monkeypatch.setattr(varlen, "_dense_attention", counting)
    run_varlen(backend, [13, 13, 13], [29, 29, 29], 4, 2, 32, torch.float16, mods, seed, backward=backward,
               lse_grad=backward)
    assert dense == ([] if backend == "torch" else [backend])
    run_varlen(backend, [13, 13, 13], [29, 29, 29], 4, 2, 32, torch.float16, mods, seed, extra_q=2)
    run_varlen(backend, [13, 12, 13], [29, 29, 29], 4, 2, 32, torch.float16, mods, seed)
    assert len(dense) == (0 if backend == "torch" else 1)


# ==================================================================================================
# bad input: ValueError/TypeError naming the argument, before any launch
# ==================================================================================================
def _bad_cases():
    i32 = torch.int32
    q, kv = torch.zeros(10, 4, 16), torch.zeros(12, 2, 16)
    ok_q, ok_k = torch.tensor([0, 4, 10], dtype=i32), torch.tensor([0, 5, 12], dtype=i32)
    base = dict(q=q, k=kv, v=kv, cu_seqlens_q=ok_q, cu_seqlens_k=ok_k, max_seqlen_q=6, max_seqlen_k=7)
    cases = {
        "cu_q_int64": (dict(cu_seqlens_q=ok_q.long()), TypeError, "cu_seqlens_q"),
        "cu_k_int64": (dict(cu_seqlens_k=ok_k.long()), TypeError, "cu_seqlens_k"),
        "cu_q_float": (dict(cu_seqlens_q=ok_q.float()), TypeError, "cu_seqlens_q"),
        "cu_q_list": (dict(cu_seqlens_q=[0, 4, 10]), TypeError, "cu_seqlens_q"),
        "cu_q_2d": (dict(cu_seqlens_q=ok_q[None]), ValueError, "cu_seqlens_q"),
        "cu_k_2d": (dict(cu_seqlens_k=ok_k[:, None]), ValueError, "cu_seqlens_k"),
        "cu_q_scalar": (dict(cu_seqlens_q=torch.tensor(0, dtype=i32)), ValueError, "cu_seqlens_q"),
        "cu_q_empty": (dict(cu_seqlens_q=torch.zeros(0, dtype=i32)), ValueError, "cu_seqlens_q"),
        "cu_q_start": (dict(cu_seqlens_q=torch.tensor([1, 4, 10], dtype=i32)), ValueError, "cu_seqlens_q"),
        "cu_k_start": (dict(cu_seqlens_k=torch.tensor([2, 5, 12], dtype=i32)), ValueError, "cu_seqlens_k"),
        "cu_q_decreasing": (dict(cu_seqlens_q=torch.tensor([0, 6, 4], dtype=i32)), ValueError, "cu_seqlens_q"),
        "cu_k_decreasing": (dict(cu_seqlens_k=torch.tensor([0, 7, 3], dtype=i32)), ValueError, "cu_seqlens_k"),
        "cu_q_negative": (dict(cu_seqlens_q=torch.tensor([0, -2, 10], dtype=i32)), ValueError, "cu_seqlens_q"),
        "cu_q_past": (dict(cu_seqlens_q=torch.tensor([0, 4, 11], dtype=i32)), ValueError, "cu_seqlens_q"),
        "cu_k_past": (dict(cu_seqlens_k=torch.tensor([0, 5, 13], dtype=i32)), ValueError, "cu_seqlens_k"),
        "batch_mismatch": (dict(cu_seqlens_k=torch.tensor([0, 12], dtype=i32)), ValueError, "cu_seqlens"),
        "max_q_small": (dict(max_seqlen_q=5), ValueError, "max_seqlen_q"),
        "max_k_small": (dict(max_seqlen_k=6), ValueError, "max_seqlen_k"),
        "max_q_negative": (dict(max_seqlen_q=-1), (TypeError, ValueError), "max_seqlen_q"),
        "max_k_float": (dict(max_seqlen_k=7.0), TypeError, "max_seqlen_k"),
        "max_q_tensor": (dict(max_seqlen_q=torch.tensor([6])), TypeError, "max_seqlen_q"),
        "q_rank4": (dict(q=q[None]), ValueError, r"\bq\b"),
        "k_rank2": (dict(k=kv[:, 0]), ValueError, r"\bk\b"),
        "v_rank4": (dict(v=kv[None]), ValueError, r"\bv\b"),
        "kv_shape": (dict(v=torch.zeros(12, 2, 8)), ValueError, r"\bv\b"),
        "kv_rows": (dict(v=torch.zeros(11, 2, 16)), ValueError, r"\bv\b|\bk\b"),
        "heads": (dict(k=torch.zeros(12, 3, 16), v=torch.zeros(12, 3, 16)), ValueError, "heads"),
        "dtype": (dict(k=kv.half(), v=kv.half()), TypeError, r"\bk\b"),
        "window": (dict(window=(1, -3)), ValueError, "window"),
        "softcap": (dict(softcap=-2.0), ValueError, "softcap"),
        "alibi_shape": (dict(alibi_slopes=torch.zeros(3, 4)), ValueError, "alibi_slopes"),
        "alibi_dtype": (dict(alibi_slopes=torch.zeros(2, 4, dtype=torch.float16)), TypeError, "alibi_slopes"),
        "causal_int": (dict(causal=1), TypeError, "causal"),
    }
    return base, cases


_BASE, _BAD = _bad_cases()


@pytest.mark.parametrize("backend", [None, "torch", "triton"])
@pytest.mark.parametrize("name", list(_BAD))
def test_bad_input(name, backend, kernel_calls):
    if backend == "triton" and not backend_available("triton"):
        pytest.skip(skip_reason("triton"))
    change, exc, match = _BAD[name]
    dev = device_for("triton")
    args = dict(_BASE, **change)
    args = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    pos = [args.pop(n) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")]
    with pytest.raises(exc, match=match):
        ta.attention_varlen(*pos, backend=backend, **args)
    assert kernel_calls == []


@pytest.mark.parametrize("bad", [[1, 4, 10], [0, 6, 4], [0, 4, 11], [0, 7, 10]],
                         ids=["start", "decreasing", "past", "max_seqlen"])
def test_bad_values_in_a_recycled_tensor(bad):
    """A new cu_seqlens tensor with bad values raises even where the allocator puts it at the address
    of one checked before, freed since (CUDA's caching allocator hands the same block back at once:
    a check remembered by address and version counter would pass it unread)."""
    dev = device_for("triton")
    q = torch.zeros(10, 2, 16, device=dev)
    ck = torch.tensor([0, 4, 10], dtype=torch.int32, device=dev)
    for _ in range(3):
        good = torch.tensor([0, 4, 10], dtype=torch.int32, device=dev)
        ta.attention_varlen(q, q, q, good, ck, 6, 6)
        del good
        bad_t = torch.tensor(bad, dtype=torch.int32, device=dev)
        with pytest.raises(ValueError, match="cu_seqlens_q|max_seqlen_q"):
            ta.attention_varlen(q, q, q, bad_t, ck, 6, 6)
        del bad_t


@pytest.mark.skipif(not HAS_CUDA, reason="needs a second device")
def test_cu_seqlens_on_another_device(kernel_calls):
    q = torch.zeros(10, 4, 16, device="cuda")
    cuq = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        ta.attention_varlen(q, q, q, cuq, cuq.cuda(), 6, 6)
    assert kernel_calls == []


def test_cuda_backend_refuses_varlen(kernel_calls):
    dev = "cuda" if HAS_CUDA else "cpu"
    q = torch.zeros(10, 2, 32, dtype=torch.float16, device=dev)
    c = torch.tensor([0, 4, 10], dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="backend"):
        ta.attention_varlen(q, q, q, c, c, 6, 6, backend="cuda")
    assert kernel_calls == []


# ==================================================================================================
# GPU: long sequences on the triton backend
# ==================================================================================================
GPU_LENGTHS = [
    ([513, 0, 1, 2000, 77, 1024], [700, 5, 1, 2000, 0, 300]),
    ([1, 1, 1, 1, 1, 1, 1, 1], [4096, 17, 0, 1, 2048, 999, 128, 256]),
    ([128, 1000, 2048], [128, 1000, 2048]),
]
GPU_MODS = [dict(), dict(causal=True), dict(window=(256, 0)), dict(window=(64, 64), causal=True),
            dict(softcap=50.0, causal=True), dict(alibi="batch", causal=True),
            dict(softcap=30.0, alibi="head", window=(512, -1), causal=True)]


def _gpu_cases():
    if not GPU_GRID:
        return [pytest.param(None, None, None, None, None, id="gpu-grid",
                             marks=pytest.mark.skip(reason="the GPU grid runs on a CUDA device"))]
    heads = [(8, 2), (4, 4), (8, 1)]
    dims = [64, 128, 256, 96]
    return [pytest.param(li, heads[(li + mi) % 3], dims[(li + mi) % 4], ALL_DTYPES[(li + 2 * mi) % 3], mods,
                         id=f"L{li}-{mods_id(mods)}", marks=pytest.mark.gpu)
            for li in range(len(GPU_LENGTHS)) for mi, mods in enumerate(GPU_MODS)]


@pytest.mark.skipif(not GPU_GRID, reason="the GPU grid runs on a CUDA device")
@pytest.mark.parametrize("li,heads,d,dtype,mods", _gpu_cases())
def test_gpu_forward(li, heads, d, dtype, mods, seed):
    lq, lk = GPU_LENGTHS[li]
    run_varlen("triton", lq, lk, *heads, d, dtype, mods, seed)


@pytest.mark.skipif(not GPU_GRID, reason="the GPU grid runs on a CUDA device")
@pytest.mark.parametrize("li,heads,d,dtype,mods", _gpu_cases()[::3])
def test_gpu_backward(li, heads, d, dtype, mods, seed):
    lq, lk = GPU_LENGTHS[li]
    run_varlen("triton", lq, lk, *heads, d, dtype, mods, seed, backward=True, lse_grad=li == 0)
