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
