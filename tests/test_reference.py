"""The pure-PyTorch reference: its online verbs against the direct float64 formulas."""
import math

import pytest
import torch

from tiled_attn import reference as R
from helpers import randn

NEG_INF = float("-inf")


def _direct_softmax(x, dim):
    return torch.softmax(x.double(), dim)


@pytest.mark.parametrize("shape,dim", [((1, 1), -1), ((3, 17), -1), ((5, 4, 9), 1), ((7, 33), 0)])
@pytest.mark.parametrize("fn", [R.safe_softmax, R.online_softmax,
                                lambda x, d: R.tiled_softmax(x, d, tile=4)])
def test_softmax_algorithms_match_direct_formula(shape, dim, fn, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn(shape, torch.float64, "cpu", gen, scale=5.0)
    torch.testing.assert_close(fn(x, dim), _direct_softmax(x, dim), rtol=1e-12, atol=1e-14,
                               msg=lambda m: f"seed={seed}: {m}")


def test_tiled_softmax_keeps_float_input_dtype_and_accumulates_in_float32():
    x = torch.full((2, 70000), 1.0, dtype=torch.bfloat16)
    y = R.tiled_softmax(x, -1, tile=1024)
    assert y.dtype == torch.bfloat16
    # 70000 equal entries: each 1/70000, representable to bf16 rounding only if the sum is exact.
    assert torch.allclose(y.double(), torch.full_like(y.double(), 1 / 70000), rtol=2 ** -8)


@pytest.mark.parametrize("fn", [R.safe_softmax, R.online_softmax, R.tiled_softmax])
def test_minus_inf_rows_follow_torch(fn):
    x = torch.tensor([[NEG_INF, NEG_INF, NEG_INF], [NEG_INF, 2.0, NEG_INF], [1.0, NEG_INF, 3.0]],
                     dtype=torch.float64)
    torch.testing.assert_close(fn(x, -1), torch.softmax(x, -1), equal_nan=True)


def test_identity_state_merges_without_nan():
    e = R.identity_state((2, 1), torch.float64)
    s = R.tile_state(torch.tensor([[1.0, 2.0], [NEG_INF, NEG_INF]], dtype=torch.float64))
    for a, b in ((e, s), (s, e), (e, e)):
        m = R.merge_states(a, b)
        assert not torch.isnan(m.m).any() and not torch.isnan(m.l).any()
    m = R.merge_states(e, s)
    assert torch.equal(m.m, s.m) and torch.equal(m.l, s.l)
    u = R.update(e, torch.full((2, 3), NEG_INF, dtype=torch.float64))
    assert torch.equal(u.l, torch.zeros(2, 1, dtype=torch.float64))


def test_merge_is_order_free(seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((4, 30), torch.float64, "cpu", gen, scale=30.0)
    parts = [R.tile_state(x[:, i:i + 7]) for i in range(0, 30, 7)]
    fwd, bwd = parts[0], parts[-1]
    for p in parts[1:]:
        fwd = R.merge_states(fwd, p)
    for p in reversed(parts[:-1]):
        bwd = R.merge_states(p, bwd)
    whole = R.tile_state(x)
    for s in (fwd, bwd):
        torch.testing.assert_close(s.m, whole.m)
        torch.testing.assert_close(s.l, whole.l, rtol=1e-12, atol=0)


def test_softmax_backward_matches_autograd(seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((3, 11), torch.float64, "cpu", gen).requires_grad_()
    dy = randn((3, 11), torch.float64, "cpu", gen)
    y = torch.softmax(x, -1)
    (gx,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(R.softmax_backward(y.detach(), dy, -1), gx)


@pytest.mark.parametrize("shape,dim", [((1, 1), -1), ((3, 17), -1), ((5, 4, 9), 1), ((7, 33), 0)])
@pytest.mark.parametrize("fn", [lambda x, d: R.safe_softmax(x, d, log=True), R.log_softmax,
                                lambda x, d: R.tiled_softmax(x, d, tile=4, log=True)])
def test_log_softmax_algorithms_match_direct_formula(shape, dim, fn, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn(shape, torch.float64, "cpu", gen, scale=5.0)
    d = x - x.amax(dim, keepdim=True)
    direct = d - torch.exp(d).sum(dim, keepdim=True).log()
    torch.testing.assert_close(fn(x, dim), direct, rtol=1e-12, atol=1e-13, msg=lambda m: f"seed={seed}: {m}")


@pytest.mark.parametrize("fn", [lambda x, d: R.safe_softmax(x, d, log=True), R.log_softmax])
def test_log_softmax_minus_inf_rows_follow_torch(fn):
    # A row of only -inf: NaN (-inf − log 0 = -inf − (-inf)); a -inf entry: -inf.
    x = torch.tensor([[NEG_INF, NEG_INF, NEG_INF], [NEG_INF, 2.0, NEG_INF], [1.0, NEG_INF, 3.0]],
                     dtype=torch.float64)
    torch.testing.assert_close(fn(x, -1), torch.log_softmax(x, -1), equal_nan=True)


def test_log_softmax_backward_matches_autograd(seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn((3, 11), torch.float64, "cpu", gen).requires_grad_()
    dy = randn((3, 11), torch.float64, "cpu", gen)
    y = torch.log_softmax(x, -1)
    (gx,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(R.softmax_backward(y.detach(), dy, -1, log=True), gx)


def _direct_attention(q, k, v, causal, scale, offset):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(q.shape[2])[:, None]
        j = torch.arange(k.shape[2])[None, :]
        s = s.masked_fill(j > i + offset, NEG_INF)
    p = torch.softmax(s, -1).nan_to_num(0.0)  # a fully masked row is all NaN in torch: 0 by contract
    return p @ v


@pytest.mark.parametrize("nq,nk", [(1, 1), (5, 13), (13, 5), (16, 16), (3, 0)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
def test_attention_reference_and_blockwise(nq, nk, causal, hq, hkv, seed):
    gen = torch.Generator().manual_seed(seed)
    q = randn((2, hq, nq, 8), torch.float64, "cpu", gen)
    k = randn((2, hkv, nk, 8), torch.float64, "cpu", gen)
    v = randn((2, hkv, nk, 8), torch.float64, "cpu", gen)
    scale = 1 / math.sqrt(8)
    want = _direct_attention(q, k, v, causal, scale, nk - nq)
    out, lse = R.attention(q, k, v, causal=causal, return_lse=True)
    torch.testing.assert_close(out, want, msg=lambda m: f"seed={seed}: {m}")
    for splits in (1, 3):
        o2, l2 = R.blockwise_attention(q, k, v, causal=causal, return_lse=True, block_n=4,
                                       num_splits=splits)
        torch.testing.assert_close(o2, want, msg=lambda m: f"seed={seed} splits={splits}: {m}")
        # float64 inputs keep a float64 lse (the torch backend's backward recomputes P from it).
        assert l2.dtype == torch.float64
        torch.testing.assert_close(l2, lse, msg=lambda m: f"seed={seed} splits={splits}: {m}")
    if causal and nq > nk:  # rows that see no key: output 0 and lse -inf
        dead = slice(0, nq - nk)
        assert torch.equal(out[:, :, dead], torch.zeros_like(out[:, :, dead]))
        assert torch.isneginf(lse[:, :, dead]).all()


@pytest.mark.parametrize("split", [0, 1, 6, 13])
@pytest.mark.parametrize("causal", [False, True])
def test_merge_attention_outputs_of_disjoint_keys(split, causal, seed):
    """Two finished results over keys [0, split) and [split, Nk) merge into the whole one, in either
    order; a side that saw no key (causal rows before the split, an empty side) is the identity and
    two of them give 0 and -inf, never NaN (DESIGN §1's guard)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (randn((2, 3, n, 8), torch.float64, "cpu", gen, scale=3.0) for n in (7, 13, 13))
    whole = R.attention(q, k, v, causal=causal, return_lse=True, causal_offset=0)
    a = R.attention(q, k[:, :, :split], v[:, :, :split], causal=causal, return_lse=True, causal_offset=0)
    b = R.attention(q, k[:, :, split:], v[:, :, split:], causal=causal, return_lse=True,
                    causal_offset=-split)
    for x, y in ((a, b), (b, a)):
        out, lse = R.merge_attention_outputs(*x, *y)
        torch.testing.assert_close(out, whole[0], rtol=1e-12, atol=1e-14, msg=lambda m: f"seed={seed}: {m}")
        torch.testing.assert_close(lse, whole[1], rtol=1e-12, atol=1e-14, msg=lambda m: f"seed={seed}: {m}")
    empty = (torch.zeros_like(whole[0]), torch.full_like(whole[1], NEG_INF))
    out, lse = R.merge_attention_outputs(*empty, *empty)
    assert torch.equal(out, empty[0]) and torch.equal(lse, empty[1])
    out, lse = R.merge_attention_outputs(*empty, *whole)
    assert torch.equal(out, whole[0]) and torch.equal(lse, whole[1])


@pytest.mark.parametrize("nq,nk", [(1, 1), (5, 13), (13, 5), (16, 16), (3, 0), (0, 4)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
def test_blockwise_attention_backward(nq, nk, causal, hq, hkv, seed):
    """The tiled backward (P from the saved lse, dK/dV summed over the GQA group, a gradient of
    lse too) equals float64 autograd through the materialized reference."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (randn(s, torch.float64, "cpu", gen).requires_grad_()
               for s in ((2, hq, nq, 8), (2, hkv, nk, 8), (2, hkv, nk, 8)))
    out, lse = R.attention(q, k, v, causal=causal, return_lse=True)
    dout = randn(out.shape, torch.float64, "cpu", gen)
    dlse = randn(lse.shape, torch.float64, "cpu", gen)
    finite = torch.isfinite(lse)
    loss = (out * dout).sum() + torch.where(finite, lse * dlse, torch.zeros_like(lse)).sum()
    want = torch.autograd.grad(loss, (q, k, v), allow_unused=True, materialize_grads=True)
    got = R.blockwise_attention_backward(q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                                         dout, dlse, causal=causal, block_n=4)
    for name, g, w in zip("qkv", got, want):
        assert g.shape == w.shape and torch.isfinite(g).all()
        torch.testing.assert_close(g, w, msg=lambda m: f"seed={seed} d{name}: {m}")


# ----------------------------------------------------------------------------------------------
# the score model (DESIGN §3): windows, softcap, ALiBi, key masks; varlen and KV-cache loops
# ----------------------------------------------------------------------------------------------
def _formula(q, k, v, *, causal=False, scale=None, off=None, window=None, softcap=None, slopes=None,
             key_mask=None):
    """DESIGN §3 written out independently of tiled_attn.reference: the visibility and ALiBi
    distance matrices built entry by entry, then a float64 softmax. Returns (out, lse)."""
    b, hq, nq, d = q.shape
    nk = k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    off = nk - nq if off is None else off
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    visible = torch.zeros(nq, nk, dtype=torch.bool)
    dist = torch.zeros(nq, nk, dtype=torch.float64)
    for i in range(nq):
        for j in range(nk):
            visible[i, j] = (left < 0 or j >= i + off - left) and (right < 0 or j <= i + off + right)
            dist[i, j] = abs(i + off - j)
    g = hq // k.shape[1]
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        s = s - slopes.double().reshape(-1, hq).expand(b, hq)[:, :, None, None] * dist
    if key_mask is not None:
        if key_mask.dtype == torch.bool:
            s = torch.where(key_mask[:, None, None, :], s, torch.full_like(s, NEG_INF))
        else:
            s = s + key_mask.double()[:, None, None, :]
    s = torch.where(visible, s, torch.full_like(s, NEG_INF))
    lse = torch.logsumexp(s, -1) if nk else torch.full(s.shape[:-1], NEG_INF, dtype=torch.float64)
    p = torch.softmax(s, -1).nan_to_num(0.0)  # a row that sees no key: 0 by contract
    return p @ v, lse


MOD_CASES = {
    "win0": dict(window=(0, 0)),
    "win_left0": dict(window=(0, -1)),
    "win_right0": dict(window=(-1, 0)),
    "win_3_2": dict(window=(3, 2)),
    "win_wider_than_n": dict(window=(40, 40)),
    "win_random": dict(window="random"),
    "win_offset": dict(window=(2, 1), offset=-3),
    "causal_win": dict(causal=True, window=(2, 5)),
    "causal_win_right_unbounded": dict(causal=True, window=(-1, 3)),
    "causal_topleft_win": dict(causal=True, offset=0, window=(3, -1)),
    "softcap_small": dict(softcap=0.5),
    "softcap": dict(softcap=5.0),
    "alibi_head": dict(alibi="head"),
    "alibi_batch_offset": dict(alibi="batch", offset=4),
    "mask_bool": dict(key_mask="bool"),
    "mask_bool_dead_row": dict(key_mask="bool_dead"),
    "mask_float": dict(key_mask="float"),
    "mask_float_dead_row": dict(key_mask="float_dead"),
    "all_bool": dict(causal=True, softcap=2.0, alibi="batch", window=(4, -1), key_mask="bool"),
    "all_float": dict(softcap=1.0, alibi="head", key_mask="float", window=(1, 2)),
}


def _draw_mods(spec, gen, b, hq, nq, nk):
    """(reference keyword arguments, _formula keyword arguments) for one MOD_CASES entry."""
    kw = dict(causal=spec.get("causal", False))
    window = spec.get("window")
    if window == "random":
        window = tuple(int(w) for w in torch.randint(-1, max(nq, nk) + 3, (2,), generator=gen))
    if window is not None:
        kw["window"] = window
    if "offset" in spec:
        kw["causal_offset"] = spec["offset"]
    if "softcap" in spec:
        kw["softcap"] = spec["softcap"]
    alibi = spec.get("alibi")
    if alibi is not None:
        shape = (hq,) if alibi == "head" else (b, hq)
        kw["alibi_slopes"] = (torch.rand(shape, generator=gen, dtype=torch.float64) * 0.8).float()
    mask = spec.get("key_mask")
    if mask is not None:
        if mask.startswith("bool"):
            km = torch.rand(b, nk, generator=gen, dtype=torch.float64) < 0.6
            if mask.endswith("dead"):
                km[-1] = False  # the last batch row's keys are all hidden: every row sees no key
        else:
            km = randn((b, nk), torch.float64, "cpu", gen, scale=2.0)
            km = km.masked_fill(torch.rand(b, nk, generator=gen, dtype=torch.float64) < 0.2, NEG_INF)
            if mask.endswith("dead"):
                km[-1] = NEG_INF
        kw["key_mask"] = km
    formula = dict(causal=kw["causal"], off=kw.get("causal_offset"), window=kw.get("window"),
                   softcap=kw.get("softcap"), slopes=kw.get("alibi_slopes"), key_mask=kw.get("key_mask"))
    return kw, formula


def _qkv(gen, b, hq, hkv, nq, nk, d=8, grad=False, dtype=torch.float64):
    return tuple(randn(s, dtype, "cpu", gen).requires_grad_(grad)
                 for s in ((b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)))


TIGHT = dict(rtol=1e-10, atol=1e-12)
MOD_SHAPES = [(1, 1), (7, 13), (13, 7), (16, 16), (5, 0), (0, 4)]


@pytest.mark.parametrize("nq,nk", MOD_SHAPES)
@pytest.mark.parametrize("case", list(MOD_CASES))
def test_attention_score_model(case, nq, nk, seed):
    """The dense reference against the entry-by-entry formula; the blockwise forward (blocks of 4,
    1 or 3 splits) against the dense one, tightly; rows that see no key give exactly 0 and −inf."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(gen, 2, 4, 2, nq, nk)
    kw, fkw = _draw_mods(MOD_CASES[case], gen, 2, 4, nq, nk)
    want_out, want_lse = _formula(q, k, v, **fkw)
    out, lse = R.attention(q, k, v, return_lse=True, **kw)
    tag = f"seed={seed} {kw.get('window')}"
    torch.testing.assert_close(out, want_out, **TIGHT, msg=lambda m: f"{tag}: {m}")
    torch.testing.assert_close(lse, want_lse, **TIGHT, msg=lambda m: f"{tag}: {m}")
    dead = torch.isneginf(lse)
    assert torch.equal(dead, torch.isneginf(want_lse))
    assert torch.equal(out[dead], torch.zeros_like(out[dead]))
    for splits in (1, 3):
        o2, l2 = R.blockwise_attention(q, k, v, return_lse=True, block_n=4, num_splits=splits, **kw)
        assert l2.dtype == torch.float64
        torch.testing.assert_close(o2, out, **TIGHT, msg=lambda m: f"{tag} splits={splits}: {m}")
        torch.testing.assert_close(l2, lse, **TIGHT, msg=lambda m: f"{tag} splits={splits}: {m}")
        assert torch.equal(o2[dead], torch.zeros_like(o2[dead]))


@pytest.mark.parametrize("nq,nk", [(1, 1), (7, 13), (13, 7), (16, 16), (5, 0)])
@pytest.mark.parametrize("case", list(MOD_CASES))
def test_blockwise_backward_score_model(case, nq, nk, seed):
    """blockwise_attention_backward (and torch's autograd through the blockwise forward, which the
    varlen torch backend relies on) equals float64 autograd through the dense reference, which is
    itself NaN-free on rows that see no key; those rows' dq is exactly 0."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(gen, 2, 4, 2, nq, nk, grad=True)
    kw, _ = _draw_mods(MOD_CASES[case], gen, 2, 4, nq, nk)
    out, lse = R.attention(q, k, v, return_lse=True, **kw)
    dout = randn(out.shape, torch.float64, "cpu", gen)
    dlse = randn(lse.shape, torch.float64, "cpu", gen)
    finite = torch.isfinite(lse)

    def loss(o, l):
        return (o * dout).sum() + torch.where(finite, l * dlse, torch.zeros_like(l)).sum()

    want = torch.autograd.grad(loss(out, lse), (q, k, v), allow_unused=True, materialize_grads=True)
    assert all(torch.isfinite(w).all() for w in want)
    got = R.blockwise_attention_backward(q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                                         dout, dlse, block_n=4, **kw)
    o2, l2 = R.blockwise_attention(q, k, v, return_lse=True, block_n=4, num_splits=2, **kw)
    l_blockwise = loss(o2, l2)
    # No key walked at all (no keys, or a window that hides them all): the forward's result is
    # constant, outside the graph, and its gradients are zeros.
    auto = (torch.autograd.grad(l_blockwise, (q, k, v), allow_unused=True, materialize_grads=True)
            if l_blockwise.requires_grad else tuple(torch.zeros_like(t) for t in (q, k, v)))
    for name, g, a, w in zip("qkv", got, auto, want):
        assert g.shape == w.shape and g.dtype == torch.float64
        torch.testing.assert_close(g, w, **TIGHT, msg=lambda m: f"seed={seed} d{name}: {m}")
        torch.testing.assert_close(a, w, **TIGHT, msg=lambda m: f"seed={seed} autograd d{name}: {m}")
    dead = ~finite
    assert torch.equal(got[0][dead], torch.zeros_like(got[0][dead]))


def test_positional_arguments_unchanged(seed):
    """The torch backend passes causal, scale and causal_offset positionally (attention.py)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(gen, 1, 2, 1, 6, 9)
    out, lse = R.attention(q, k, v, True, 0.3, True, 1)
    torch.testing.assert_close(out, _formula(q, k, v, causal=True, scale=0.3, off=1)[0], **TIGHT)
    o2, l2 = R.blockwise_attention(q, k, v, True, 0.3, True, 4, 2, 1)
    torch.testing.assert_close(o2, out, **TIGHT)
    do = randn(out.shape, torch.float64, "cpu", gen)
    g1 = R.blockwise_attention_backward(q, k, v, out, lse, do, None, True, 0.3, 1, 4)
    g2 = R.blockwise_attention_backward(q, k, v, out, lse, do, None, causal=True, scale=0.3, causal_offset=1)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, **TIGHT)


def test_blockwise_16bit_computes_in_float32(seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(gen, 2, 4, 2, 9, 21, dtype=torch.bfloat16)
    kw, fkw = _draw_mods(MOD_CASES["all_float"], gen, 2, 4, 9, 21)
    out, lse = R.blockwise_attention(q, k, v, return_lse=True, block_n=8, **kw)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    want_out, want_lse = _formula(q, k, v, **fkw)
    torch.testing.assert_close(out.double(), want_out, rtol=2 ** -7, atol=2 ** -7)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
    grads = R.blockwise_attention_backward(q, k, v, out, lse, torch.ones_like(out), None, block_n=8, **kw)
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3


class _Blockwise(torch.autograd.Function):
    """The torch backend's pair: blockwise forward, blockwise_attention_backward."""

    @staticmethod
    def forward(ctx, q, k, v, kw):
        out, lse = R.blockwise_attention(q, k, v, return_lse=True, block_n=2, **kw)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kw = kw
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        return (*R.blockwise_attention_backward(q, k, v, out, lse, dout, dlse, block_n=2, **ctx.kw), None)


@pytest.mark.parametrize("kw", [dict(softcap=0.8, scale=2.0),
                                dict(softcap=0.8, scale=2.0, window=(3, 1), causal=True),
                                dict(softcap=1.5, window=(3, 1), key_mask="float")],
                         ids=["softcap", "softcap_causal_window", "softcap_window_mask"])
def test_blockwise_backward_gradcheck(kw, seed):
    """Finite differences of the blockwise forward agree with its backward (softcap's 1 − tanh²
    chain factor included), on a tiny case where every row sees a key (lse finite)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(gen, 1, 2, 1, 3, 6, d=4, grad=True)
    kw = dict(kw, alibi_slopes=torch.tensor([0.25, 0.5]))
    if kw.get("key_mask") == "float":
        kw["key_mask"] = randn((1, 6), torch.float64, "cpu", gen)
    assert torch.autograd.gradcheck(lambda q, k, v: _Blockwise.apply(q, k, v, kw), (q, k, v))


def _pack(gen, lens, h, d, extra):
    return randn((sum(lens) + extra, h, d), torch.float64, "cpu", gen)


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


VARLEN_MODS = {"plain": dict(), "causal": dict(causal=True), "window": dict(window=(2, 1)),
               "softcap_alibi_batch": dict(softcap=2.0, alibi="batch", causal=True),
               "alibi_head_window": dict(alibi="head", window=(-1, 2))}


@pytest.mark.parametrize("blockwise", [False, True])
@pytest.mark.parametrize("case", list(VARLEN_MODS))
def test_attention_varlen_per_sequence(case, blockwise, seed):
    """attention_varlen equals one dense call per sequence (empty q, empty k, length 1, Nq > Nk),
    rows past the last sequence are 0 / −inf, and autograd through it matches the per-sequence
    dense gradients."""
    gen = torch.Generator().manual_seed(seed)
    lq, lk = [3, 0, 1, 7, 4, 5], [5, 4, 1, 2, 0, 9]
    hq, hkv, d = 4, 2, 8
    q = _pack(gen, lq, hq, d, 2).requires_grad_()
    k, v = (_pack(gen, lk, hkv, d, 3).requires_grad_() for _ in range(2))
    spec = VARLEN_MODS[case]
    kw = {key: val for key, val in spec.items() if key != "alibi"}
    if "alibi" in spec:
        shape = (hq,) if spec["alibi"] == "head" else (len(lq), hq)
        kw["alibi_slopes"] = (torch.rand(shape, generator=gen, dtype=torch.float64) * 0.8).float()
    cq, ck = _cu(lq), _cu(lk)
    out, lse = R.attention_varlen(q, k, v, cq, ck, return_lse=True, blockwise=blockwise, block_n=2, **kw)
    assert out.shape == q.shape and lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float64
    outs, lses = [], []
    for b in range(len(lq)):
        one = dict(kw)
        if "alibi_slopes" in kw and kw["alibi_slopes"].dim() == 2:
            one["alibi_slopes"] = kw["alibi_slopes"][b]
        o, l = R.attention(*(t[c[b]:c[b + 1]].transpose(0, 1)[None] for t, c in ((q, cq), (k, ck), (v, ck))),
                           return_lse=True, **one)
        outs.append(o[0].transpose(0, 1))
        lses.append(l[0])
    n = int(cq[-1])
    want_out, want_lse = torch.cat(outs), torch.cat(lses, 1)
    torch.testing.assert_close(out[:n], want_out, **TIGHT, msg=lambda m: f"seed={seed}: {m}")
    torch.testing.assert_close(lse[:, :n], want_lse, **TIGHT, msg=lambda m: f"seed={seed}: {m}")
    assert torch.equal(out[n:], torch.zeros_like(out[n:])) and torch.isneginf(lse[:, n:]).all()
    assert torch.isneginf(lse[:, int(cq[4]):int(cq[5])]).all()  # sequence 4 has no keys

    dout = randn(out.shape, torch.float64, "cpu", gen)
    got = torch.autograd.grad((out * dout).sum(), (q, k, v))
    want = torch.autograd.grad((want_out * dout[:n]).sum(), (q, k, v), allow_unused=True, materialize_grads=True)
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, **TIGHT, msg=lambda m: f"seed={seed} d{name}: {m}")


def _kvcache_case(gen, page, lens, n_new, hkv=2, d=8):
    """Logical per-row keys/values (B, Hkv, cap, D) and a cache holding their first lens[b] keys —
    contiguous (page None) or paged through a shuffled block table — NaN everywhere else, so a read
    of any wrong slot shows."""
    b = len(lens)
    cap = max(lens) + n_new
    k_log, v_log = (randn((b, hkv, cap, d), torch.float64, "cpu", gen) for _ in range(2))
    if page is None:
        k_cache = torch.full((b, cap + 2, hkv, d), float("nan"), dtype=torch.float64)
        v_cache = k_cache.clone()
        for r, n in enumerate(lens):
            k_cache[r, :n], v_cache[r, :n] = k_log[r, :, :n].transpose(0, 1), v_log[r, :, :n].transpose(0, 1)
        return k_log, v_log, k_cache, v_cache, None
    width = -(-cap // page) + 1
    num_pages = b * width + 3
    table = torch.randperm(num_pages, generator=gen)[:b * width].view(b, width).to(torch.int32)
    k_cache = torch.full((num_pages, page, hkv, d), float("nan"), dtype=torch.float64)
    v_cache = k_cache.clone()
    for r, n in enumerate(lens):
        for p in range(n):
            slot = (int(table[r, p // page]), p % page)
            k_cache[slot], v_cache[slot] = k_log[r, :, p], v_log[r, :, p]
    return k_log, v_log, k_cache, v_cache, table


@pytest.mark.parametrize("page", [None, 1, 3, 8, 16])
@pytest.mark.parametrize("n_new", [0, 3])
def test_kvcache_keys(page, n_new, seed):
    """kvcache_keys gathers each row's keys in order (through the block table, appends crossing a
    page) and leaves the cache as it was."""
    gen = torch.Generator().manual_seed(seed)
    p = page or 8
    lens = [0, max(p - 1, 1), 2 * p + 1, 1]  # empty, an append crossing a page, several pages, one key
    k_log, v_log, k_cache, v_cache, table = _kvcache_case(gen, page, lens, n_new)
    k_new, v_new = (randn((4, 2, n_new, 8), torch.float64, "cpu", gen) for _ in range(2)) if n_new else (None, None)
    before = k_cache.clone(), v_cache.clone()
    rows = R.kvcache_keys(k_cache, v_cache, torch.tensor(lens, dtype=torch.int32), table, k_new, v_new)
    assert len(rows) == len(lens)
    for r, (kb, vb) in enumerate(rows):
        for got, log, new in ((kb, k_log, k_new), (vb, v_log, v_new)):
            want = log[r:r + 1, :, :lens[r]]
            if new is not None:
                want = torch.cat([want, new[r:r + 1]], 2)
            assert got.shape == (1, 2, lens[r] + n_new, 8)
            assert torch.equal(got, want), f"seed={seed} row {r}"
    for t, b in zip((k_cache, v_cache), before):
        torch.testing.assert_close(t, b, rtol=0, atol=0, equal_nan=True)


KV_MODS = {"causal_window_alibi_batch": dict(causal=True, window=(3, -1), alibi="batch"),
           "softcap_alibi_head": dict(softcap=1.5, alibi="head")}


@pytest.mark.parametrize("blockwise", [False, True])
@pytest.mark.parametrize("case", list(KV_MODS))
@pytest.mark.parametrize("page,n_new,nq", [(None, 0, 2), (None, 3, 3), (1, 3, 3), (5, 3, 2), (16, 0, 1),
                                           (16, 4, 4)])
def test_attention_kvcache_per_row(page, n_new, nq, case, blockwise, seed):
    """attention_kvcache equals one dense call per row on that row's logical keys (off_b = Nk_b − Nq);
    a row with no keys gives 0 and −inf."""
    gen = torch.Generator().manual_seed(seed)
    p = page or 8
    lens = [0, max(p - 1, 1), 2 * p + 1, 1]
    hq = 4
    k_log, v_log, k_cache, v_cache, table = _kvcache_case(gen, page, lens, n_new)
    k_new, v_new = (randn((4, 2, n_new, 8), torch.float64, "cpu", gen) for _ in range(2)) if n_new else (None, None)
    q = randn((4, hq, nq, 8), torch.float64, "cpu", gen)
    spec = KV_MODS[case]
    kw = {key: val for key, val in spec.items() if key != "alibi"}
    shape = (hq,) if spec["alibi"] == "head" else (4, hq)
    kw["alibi_slopes"] = (torch.rand(shape, generator=gen, dtype=torch.float64) * 0.8).float()
    out, lse = R.attention_kvcache(q, k_cache, v_cache, torch.tensor(lens, dtype=torch.int32), k_new=k_new,
                                   v_new=v_new, block_table=table, return_lse=True, blockwise=blockwise,
                                   block_n=4, **kw)
    assert out.shape == q.shape and lse.shape == (4, hq, nq)
    for r, n in enumerate(lens):
        kb, vb = k_log[r:r + 1, :, :n], v_log[r:r + 1, :, :n]
        if n_new:
            kb, vb = torch.cat([kb, k_new[r:r + 1]], 2), torch.cat([vb, v_new[r:r + 1]], 2)
        one = dict(kw, alibi_slopes=kw["alibi_slopes"][r] if len(shape) == 2 else kw["alibi_slopes"])
        o, l = R.attention(q[r:r + 1], kb, vb, return_lse=True, **one)
        torch.testing.assert_close(out[r:r + 1], o, **TIGHT, msg=lambda m: f"seed={seed} row {r}: {m}")
        torch.testing.assert_close(lse[r:r + 1], l, **TIGHT, msg=lambda m: f"seed={seed} row {r}: {m}")
    if not n_new:  # row 0 is empty
        assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isneginf(lse[0]).all()


def test_attention_kvcache_int_seqlens(seed):
    """A python int cache_seqlens means the same length for every row."""
    gen = torch.Generator().manual_seed(seed)
    k_log, v_log, k_cache, v_cache, table = _kvcache_case(gen, 4, [6, 6], 2)
    k_new, v_new = (randn((2, 2, 2, 8), torch.float64, "cpu", gen) for _ in range(2))
    q = randn((2, 4, 2, 8), torch.float64, "cpu", gen)
    a = R.attention_kvcache(q, k_cache, v_cache, 6, k_new=k_new, v_new=v_new, block_table=table, causal=True)
    b = R.attention_kvcache(q, k_cache, v_cache, torch.tensor([6, 6], dtype=torch.int32), k_new=k_new,
                            v_new=v_new, block_table=table, causal=True)
    assert torch.equal(a, b) and torch.isfinite(a).all()
