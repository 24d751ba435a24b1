"""ta.attention with a sliding window, softcap and ALiBi (issue #15): forward (out, lse) and backward
(dq, dk, dv, and through lse) against a float64 dense formula under the numerics rule (DESIGN §4).

Reference (written here, independent of tiled_attn.reference): explicit matrices in float64 on the
same rounded inputs: s = scale·q·kᵀ; s = c·tanh(s/c) (softcap); s −= slope·|i + off − j| (ALiBi,
slopes (Hq,) or (B, Hq)); s = −inf outside the window (causal forces right = 0); softmax, lse =
logsumexp; a row that sees no key gives out 0, lse −inf and no gradient. Gradients: float64
autograd through that formula.

torch's own error (e_torch), the larger of two of torch's computations in the input dtype, as
tests/test_attention.py (forward) and tests/test_attention_backward.py (backward) take it:
* torch's op: F.scaled_dot_product_attention with the equivalent float attn_mask (the ALiBi bias
  rounded to the input dtype, −inf outside the window) where SDPA can express the call; with a
  softcap (which SDPA cannot express) the eager path of transformers' Gemma 2 (q·kᵀ, tanh and the
  bias in the input dtype, softmax in float32 rounded to the input dtype, P·V in the input dtype);
  for the gradients torch's autograd through the same (plus logsumexp of the float32 scores for
  lse's gradient), on the rows that see a key;
* the same formula with FlashAttention's rounding points (float32 scores and modifications, P
  rounded to the input dtype before a float32 P·V; in the backward P recomputed from the float32
  lse, dS rounded to the input dtype, softcap's chain factor 1 − tanh² in float32).
lse: torch's error is logsumexp of its float32 modified scores, plus (as tests/test_attention.py's
_assert_lse) the float32 rounding bound of the dot products, 4 float32 ulps of |lse| and 4 ulps of
the modification's own magnitude (tanh's, the bias'), which torch's figure does not stand for.
float32 gradients get tests/test_attention_backward.py's first-order recompute slack, generalized
to the modified scores (_recompute_slack).

The dense reference and torch's two computations are the helpers at the top (dense, torch_outputs,
check_forward, check_backward), imported by tests/test_attention_varlen.py and
tests/test_attention_kvcache.py.

CPU (CI): backends "torch" and "triton" (Triton's interpreter), N <= 70, D <= 64, B <= 2, heads
<= 4. CUDA: the same, then flash-attn-sized grids on the triton backend (N up to 2048, D up to 256).
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import tiled_attn as ta
from helpers import (HAS_CUDA, INTERPRET, assert_rule, backend_available, device_for, fresh_seed, max_err,
                     randn, reproduce_hint, skip_reason)

NEG_INF = float("-inf")
LOG2E = 1.4426950408889634
EPS32 = torch.finfo(torch.float32).eps
U32 = EPS32 / 2
DT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS = ["torch", "triton"]
GPU_GRID = HAS_CUDA and not INTERPRET


# ==================================================================================================
# the float64 dense reference and torch's own computations (shared with the varlen/kvcache tests)
# ==================================================================================================
def visible(nq: int, nk: int, offset: int, causal: bool = False, window=None, device="cpu") -> torch.Tensor:
    """(Nq, Nk) bool: key j visible to query i (DESIGN §3: window (left, right), -1 unbounded,
    causal forces right = 0; off = the bottom-right alignment)."""
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    i = torch.arange(nq, device=device)[:, None] + offset
    j = torch.arange(nk, device=device)[None, :]
    vis = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if left >= 0:
        vis = vis & (j >= i - left)
    if right >= 0:
        vis = vis & (j <= i + right)
    return vis


def alibi_bias(slopes, nq: int, nk: int, offset: int, device) -> torch.Tensor | None:
    """float64 (1 or B, Hq, Nq, Nk): −slope·|i + off − j|; None without slopes."""
    if slopes is None:
        return None
    sl = slopes.detach().double().to(device)
    sl = sl[None, :, None, None] if sl.dim() == 1 else sl[:, :, None, None]
    dist = (torch.arange(nq, device=device)[:, None] + offset - torch.arange(nk, device=device)[None, :])
    return -sl * dist.abs().double()


def _rep(t: torch.Tensor, g: int) -> torch.Tensor:
    return t.repeat_interleave(g, dim=1) if g > 1 else t


def _sum_group(t: torch.Tensor, hkv: int) -> torch.Tensor:
    """(B, Hq, N, D) → (B, Hkv, N, D): the sum over each GQA group."""
    b, hq, n, d = t.shape
    return t.reshape(b, hkv, hq // hkv, n, d).sum(2)


class Mods:
    """One call's modifications and alignment, for (B, Hq, Nq, D) q against (B, Hkv, Nk, D) k."""

    def __init__(self, q, k, *, causal=False, window=None, softcap=None, slopes=None, scale=None, offset=None):
        self.nq, self.nk, self.d = q.shape[2], k.shape[2], q.shape[3]
        self.causal, self.window, self.softcap, self.slopes = causal, window, softcap, slopes
        self.scale = 1.0 / math.sqrt(self.d) if scale is None else scale
        self.offset = self.nk - self.nq if offset is None else offset
        self.g = q.shape[1] // k.shape[1]
        self.hkv = k.shape[1]
        dev = q.device
        self.vis = visible(self.nq, self.nk, self.offset, causal, window, dev)
        self.seen = self.vis.any(1)  # rows that see a key
        self.bias = alibi_bias(slopes, self.nq, self.nk, self.offset, dev)

    def apply(self, raw: torch.Tensor, compute) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(modified scores in `compute`, tanh(s/c) or None) from raw = q·kᵀ (unscaled) in compute."""
        s = raw * self.scale
        t = None
        if self.softcap:
            t = torch.tanh(s / self.softcap)
            s = self.softcap * t
        if self.bias is not None:
            s = s + self.bias.to(compute)
        return s.masked_fill(~self.vis, NEG_INF), t


def dense(q, k, v, m: Mods):
    """(out, lse) in float64, differentiable in q, k, v (float64 tensors). Rows that see no key: out
    0, lse −inf, and no gradient flows from them."""
    kr, vr = _rep(k, m.g), _rep(v, m.g)
    s, _ = m.apply(q @ kr.transpose(-1, -2), q.dtype)
    seen = m.seen[:, None]
    s_safe = s.masked_fill(~seen, 0.0)  # no −inf − (−inf) in a row that sees nothing
    lse = torch.logsumexp(s_safe, dim=-1)
    p = torch.exp(s_safe - lse[..., None]) * seen
    out = p @ vr
    return out, torch.where(m.seen, lse, torch.full_like(lse, NEG_INF))


def reference(q, k, v, m: Mods):
    return dense(q.double(), k.double(), v.double(), m)


def torch_outputs(q, k, v, m: Mods) -> tuple[list[torch.Tensor], torch.Tensor]:
    """torch's outputs in the input dtype (the two computations of the module doc) and its lse (from
    float32 scores); rows that see no key are left as torch gives them (callers replace them)."""
    dt = q.dtype
    kr, vr = _rep(k, m.g), _rep(v, m.g)
    outs = []
    if m.softcap:  # transformers' eager path (Gemma 2), in the input dtype
        w = torch.matmul(q, kr.transpose(-1, -2)) * m.scale
        w = torch.tanh(w / m.softcap) * m.softcap
        if m.bias is not None:
            w = w + m.bias.to(dt)
        w = w.masked_fill(~m.vis, NEG_INF)
        outs.append(torch.matmul(torch.softmax(w, dim=-1, dtype=torch.float32).to(dt), vr))
    else:  # SDPA with the equivalent float mask
        bias = torch.zeros(m.nq, m.nk, dtype=torch.float64, device=q.device) if m.bias is None else m.bias
        mask = bias.to(dt).masked_fill(~m.vis, NEG_INF)
        outs.append(F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, scale=m.scale))
    # FlashAttention's rounding points
    s, _ = m.apply(torch.matmul(q.float(), kr.float().transpose(-1, -2)), torch.float32)
    s_safe = s.masked_fill(~m.seen[:, None], 0.0)
    lse = torch.logsumexp(s_safe, dim=-1)
    p = torch.exp(s_safe - lse[..., None]) * m.seen[:, None]
    outs.append(torch.matmul(p.to(dt).float(), vr.float()).to(dt))
    return outs, torch.where(m.seen, lse, torch.full_like(lse, NEG_INF))


def score_slack(q, k, m: Mods) -> float:
    """What a float32 score may carry beyond torch's figure (module doc): the probabilistic bound on
    a length-D dot product's rounding (scale·√D·u·Σ|q_d k_d|, any summation order) plus 4 ulps of
    the modification's magnitude (tanh's c, the bias), max over visible pairs."""
    if m.nq == 0 or m.nk == 0 or not m.vis.any():
        return 0.0
    qa, ka = q.double().abs(), _rep(k.double().abs(), m.g)
    bound = torch.matmul(qa, ka.transpose(-1, -2)) * (abs(m.scale) * math.sqrt(m.d) * U32)
    mag = torch.zeros_like(bound)
    if m.softcap:
        mag = mag + m.softcap
    if m.bias is not None:
        mag = mag + m.bias.abs()
    bound = bound + 4 * EPS32 * mag
    bound = torch.where(m.vis, torch.nan_to_num(bound, nan=0.0, posinf=0.0), torch.zeros_like(bound))
    return bound.max().item()


def assert_lse(lse, ref, t_lse, dtype, seed, what, slack=0.0):
    """The rule for lse (module doc): 2·torch's error + eps + float32 score slack + 4 ulps of |lse|."""
    ref, ours = ref.double().cpu(), lse.double().cpu()
    tag = f"[{what} lse seed={seed}; {reproduce_hint()}]"
    assert ours.shape == ref.shape, f"{tag} shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert torch.equal(torch.isnan(ours), torch.isnan(ref)), f"{tag} NaN pattern differs from the reference"
    inf = torch.isinf(ref)
    assert torch.equal(ours[inf], ref[inf]), f"{tag} ±inf entries differ from the reference"
    finite = torch.isfinite(ref)
    big = ref[finite].abs().max().item() if finite.any() else 0.0
    e_ours, e_torch = max_err(ours, ref), max_err(t_lse, ref)
    ulps = 4 * EPS32 * big
    tol = 2 * e_torch + torch.finfo(dtype).eps + slack + ulps
    assert e_ours <= tol, (f"{tag} error {e_ours:.3e} exceeds 2×torch's {e_torch:.3e} + eps + score slack "
                           f"{slack:.3e} + 4 ulps {ulps:.3e} ({tol:.3e})")


def worst(cands, ref):
    """The candidate farthest from ref (finite errors only), or ref itself when none is finite."""
    errs = [(max_err(c, ref), i) for i, c in enumerate(cands)]
    errs = [e for e in errs if math.isfinite(e[0])]
    return cands[max(errs)[1]] if errs else ref


def expected_forward(q, k, v, m: Mods):
    """(ref_out, ref_lse, torch_out, torch_lse, lse slack) of one (B, Hq, Nq, D) problem; torch's
    rows that see no key (NaN or arbitrary) are replaced by the reference's."""
    ref_out, ref_lse = reference(q, k, v, m)
    if m.nk == 0 or m.nq == 0 or not m.seen.any():
        return ref_out, ref_lse, ref_out, ref_lse, 0.0
    outs, t_lse = torch_outputs(q, k, v, m)
    seen = m.seen[:, None]
    outs = [torch.where(seen, o.double(), ref_out) for o in outs]
    return ref_out, ref_lse, worst(outs, ref_out), t_lse, score_slack(q, k, m)


def assert_blind_rows(out, lse, seen_rows, seed, what):
    """Rows (along dim -2 of out, -1 of lse) that see no key: out exactly 0, lse −inf."""
    blind = ~seen_rows.cpu()
    if not blind.any():
        return
    o = out.detach().float().cpu()[..., blind, :]
    assert torch.equal(o, torch.zeros_like(o)), f"[{what} seed={seed}] rows that see no key must be exactly 0"
    if lse is not None:
        lb = lse.detach().cpu()[..., blind]
        assert bool((lb == NEG_INF).all()), f"[{what} seed={seed}] rows that see no key must have lse -inf"


def check_forward(out, lse, q, k, v, seed, what, **mods):
    """The rule on out (and lse when given) of ta.attention(q, k, v, **mods); blind rows exact."""
    m = Mods(q, k, **mods)
    assert out.shape == q.shape[:3] + v.shape[3:] and out.dtype == q.dtype, f"[{what}] out {out.shape} {out.dtype}"
    ref_out, ref_lse, t_out, t_lse, slack = expected_forward(q, k, v, m)
    assert_rule(out, ref_out, t_out, dtype=q.dtype, seed=seed, what=f"{what} out")
    if lse is not None:
        assert lse.shape == q.shape[:3] and lse.dtype == torch.float32, f"[{what}] lse {lse.shape} {lse.dtype}"
        assert_lse(lse, ref_lse, t_lse, q.dtype, seed, what, slack)
    assert_blind_rows(out, lse, m.seen, seed, what)


# -- gradients ------------------------------------------------------------------------------------
def _grads_of(outs, inputs, grads):
    pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
    if not pairs:
        return tuple(torch.zeros_like(t) for t in inputs)
    got = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g for g, t in zip(got, inputs))


def reference_grads(q, k, v, go, gl, m: Mods):
    """float64 autograd through the dense formula."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = dense(q64, k64, v64, m)
    outs, grads = [out], [go.double()]
    if gl is not None:
        outs, grads = [out, lse], [go.double(), gl.double()]
    return _grads_of(outs, (q64, k64, v64), grads)


def _row_mods(m: Mods, rows: torch.Tensor) -> Mods:
    """m restricted to the query rows `rows` (a bool (Nq,) mask)."""
    r = Mods.__new__(Mods)
    r.__dict__.update(m.__dict__)
    r.vis, r.seen = m.vis[rows], m.seen[rows]
    r.bias = None if m.bias is None else m.bias[:, :, rows]
    r.nq = int(rows.sum())
    return r


def _autograd_grads(q, k, v, go, gl, m: Mods):
    """torch's autograd in the input dtype (SDPA with the float mask, or the eager softcap path;
    logsumexp of float32 scores for lse), on the rows that see a key; dq 0 on the others."""
    dt = q.dtype
    rows = m.seen
    mr = _row_mods(m, rows)
    qs = q[:, :, rows].detach().requires_grad_()
    ks, vs = (t.detach().requires_grad_() for t in (k, v))
    kr, vr = _rep(ks, m.g), _rep(vs, m.g)
    if m.softcap:
        w = torch.matmul(qs, kr.transpose(-1, -2)) * m.scale
        w = torch.tanh(w / m.softcap) * m.softcap
        if mr.bias is not None:
            w = w + mr.bias.to(dt)
        w = w.masked_fill(~mr.vis, NEG_INF)
        out = torch.matmul(torch.softmax(w, dim=-1, dtype=torch.float32).to(dt), vr)
    else:
        bias = (torch.zeros(mr.nq, m.nk, dtype=torch.float64, device=q.device) if mr.bias is None else mr.bias)
        mask = bias.to(dt).masked_fill(~mr.vis, NEG_INF)
        out = F.scaled_dot_product_attention(qs, kr, vr, attn_mask=mask, scale=m.scale)
    outs, grads = [out], [go[:, :, rows]]
    if gl is not None:
        s, _ = mr.apply(torch.matmul(qs.float(), kr.float().transpose(-1, -2)), torch.float32)
        outs.append(torch.logsumexp(s, dim=-1))
        grads.append(gl[:, :, rows])
    dqs, dk, dv = torch.autograd.grad(outs, (qs, ks, vs), grads)
    dq = torch.zeros_like(q)
    dq[:, :, rows] = dqs
    return dq, dk, dv


def _flash_grads(q, k, v, go, gl, m: Mods):
    """FlashAttention-2's rounding points with the modifications (module doc)."""
    dt = q.dtype
    qf, gof = q.float(), go.float()
    kf, vf = _rep(k.float(), m.g), _rep(v.float(), m.g)
    s, _ = m.apply(torch.matmul(qf, kf.transpose(-1, -2)), torch.float32)
    seen = m.seen[:, None]
    s_safe = s.masked_fill(~seen, 0.0)
    lse = torch.logsumexp(s_safe, dim=-1)
    out = torch.matmul((torch.exp(s_safe - lse[..., None]) * seen).to(dt).float(), vf).to(dt)
    lse = torch.where(m.seen, lse, torch.full_like(lse, NEG_INF))
    h = (q.shape[-1] + 1) // 2  # the backward's q·kᵀ in another summation order
    raw = (torch.matmul(qf[..., :h], kf[..., :h].transpose(-1, -2))
           + torch.matmul(qf[..., h:], kf[..., h:].transpose(-1, -2)))
    s, t = m.apply(raw, torch.float32)
    shift = torch.where(lse == NEG_INF, torch.full_like(lse, math.inf), lse * LOG2E)
    p = torch.exp2(s * LOG2E - shift[..., None])
    delta = (gof * out.float()).sum(-1)
    if gl is not None:
        delta = delta - gl.float()
    ds = p * (torch.matmul(gof, vf.transpose(-1, -2)) - delta[..., None])
    if t is not None:
        ds = ds * (1 - t * t)
    ds = ds.to(dt).float()
    dq = torch.matmul(ds, kf) * m.scale
    dk = _sum_group(torch.matmul(ds.transpose(-1, -2), qf), m.hkv) * m.scale
    dv = _sum_group(torch.matmul(p.to(dt).float().transpose(-1, -2), gof), m.hkv)
    return dq.to(dt), dk.to(dt), dv.to(dt)


def torch_grads(q, k, v, go, gl, m: Mods, ref):
    """Per gradient, the one of torch's two computations farther from the reference."""
    if m.nq == 0 or m.nk == 0 or not m.seen.any():
        return ref
    cands = [_autograd_grads(q, k, v, go, gl, m), _flash_grads(q, k, v, go, gl, m)]
    return tuple(worst(list(ts), r) for ts, r in zip(zip(*cands), ref))


def recompute_slack(q, k, v, go, gl, m: Mods) -> tuple[float, float, float]:
    """float32 inputs: tests/test_attention_backward.py's first-order slack of the tiled backward's
    recompute, on the modified scores: P from an lse that may carry 4 more ulps (of |lse|, and of
    the score's and the bias' magnitude, the float32 modifications' rounding) than torch's, dP − delta
    from dot products in another order (√D·u·Σ|·|), and softcap's 1 − tanh² to a few ulps."""
    if q.dtype != torch.float32 or m.nq == 0 or m.nk == 0 or not m.seen.any():
        return 0.0, 0.0, 0.0
    qd, god = q.double(), go.double()
    kd, vd = _rep(k.double(), m.g), _rep(v.double(), m.g)
    s, t = m.apply(torch.matmul(qd, kd.transpose(-1, -2)), torch.float64)
    seen = m.seen[:, None]
    s_safe = s.masked_fill(~seen, 0.0)
    lse = torch.logsumexp(s_safe, dim=-1)
    p = torch.exp(s_safe - lse[..., None]) * seen
    o = torch.matmul(p, vd)
    mag = lse.abs()[..., None] + torch.where(m.vis, s.abs(), torch.zeros_like(s))
    if m.bias is not None:
        mag = mag + m.bias.abs()
    e = 4 * EPS32 * mag
    f = math.sqrt(m.d) * U32 * (torch.matmul(god.abs(), vd.abs().transpose(-1, -2))
                                + (god.abs() * o.abs()).sum(-1, keepdim=True))
    delta = (god * o).sum(-1)
    if gl is not None:
        delta = delta - gl.double()
    dpd = torch.matmul(god, vd.transpose(-1, -2)) - delta[..., None]
    eds = p * (e * dpd.abs() + f)
    if t is not None:
        eds = eds + 16 * U32 * (p * dpd).abs()
    s_dq = abs(m.scale) * torch.matmul(eds, kd.abs())
    s_dk = abs(m.scale) * _sum_group(torch.matmul(eds.transpose(-1, -2), qd.abs()), m.hkv)
    s_dv = _sum_group(torch.matmul((e * p).transpose(-1, -2), god.abs()), m.hkv)
    return tuple(torch.nan_to_num(x, nan=0.0, posinf=0.0).max().item() for x in (s_dq, s_dk, s_dv))


def assert_grad(ours, ref, t, slack, dtype, seed, what):
    """assert_rule with the float32 recompute slack added to the tolerance."""
    ours_c, ref_c = ours.detach().double().cpu(), ref.detach().double().cpu()
    tag = f"[{what} seed={seed}; {reproduce_hint()}]"
    assert ours_c.shape == ref_c.shape, f"{tag} shape {tuple(ours_c.shape)} != {tuple(ref_c.shape)}"
    assert torch.equal(torch.isnan(ours_c), torch.isnan(ref_c)), f"{tag} NaN pattern differs from the reference"
    e_ours, e_torch = max_err(ours_c, ref_c), max_err(t, ref_c)
    tol = 2 * e_torch + torch.finfo(dtype).eps + slack
    assert e_ours <= tol, (f"{tag} error {e_ours:.3e} exceeds 2×torch's {e_torch:.3e} + eps + float32 "
                           f"recompute slack {slack:.3e} ({tol:.3e}) for {dtype}")


def expected_backward(q, k, v, go, gl, m: Mods):
    """(reference grads, torch's grads, slacks) of one (B, Hq, Nq, D) problem."""
    ref = reference_grads(q, k, v, go, gl, m)
    return ref, torch_grads(q, k, v, go, gl, m, ref), recompute_slack(q, k, v, go, gl, m)


def check_backward(grads, q, k, v, go, gl, seed, what, **mods):
    """The rule on (dq, dk, dv) of ta.attention(q, k, v, **mods) for the output gradient go (and
    lse's, gl); dq exactly 0 on rows that see no key."""
    m = Mods(q, k, **mods)
    ref, tg, slack = expected_backward(q, k, v, go, gl, m)
    for name, ours, r, t, x, sl in zip(("dq", "dk", "dv"), grads, ref, tg, (q, k, v), slack):
        assert ours.shape == x.shape and ours.dtype == x.dtype, \
            f"[{what} seed={seed}] {name} {tuple(ours.shape)} {ours.dtype}, expected {tuple(x.shape)} {x.dtype}"
        assert_grad(ours, r, t, sl, q.dtype, seed, f"{what} {name}")
    blind = ~m.seen.cpu()
    if blind.any():
        dq = grads[0].detach().float().cpu()[:, :, blind]
        assert torch.equal(dq, torch.zeros_like(dq)), f"[{what} seed={seed}] dq of rows that see no key must be 0"


# ==================================================================================================
# test plumbing
# ==================================================================================================
def require(backend: str) -> str:
    if not backend_available(backend):
        pytest.skip(skip_reason(backend))
    return device_for(backend)


def on_this_device(backend: str) -> None:
    """On a CUDA device the torch backend's grids are left to the CPU run (device-independent math)."""
    if backend == "torch" and GPU_GRID:
        pytest.skip("the torch backend's grid runs on the CPU (its math is device-independent)")


def make_slopes(kind, b, hq, gen, device):
    """ALiBi slopes, float32: "head" (Hq,), "batch" (B, Hq); None for None."""
    if kind is None:
        return None
    shape = (hq,) if kind == "head" else (b, hq)
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 0.5 + 0.01).float().to(device)


def mods_id(mods: dict) -> str:
    parts = []
    for key, val in mods.items():
        if key == "causal":
            parts.append("causal" if val else "")
        elif key == "window":
            parts.append(f"win{val[0]}_{val[1]}")
        elif key == "softcap":
            parts.append(f"cap{val:g}")
        elif key == "alibi":
            parts.append(f"alibi-{val}")
        else:
            parts.append(f"{key}{val}")
    return "-".join(p for p in parts if p) or "plain"


def split_mods(mods: dict, b, hq, gen, device):
    """(ta.attention kwargs, check kwargs) from a grid entry (alibi: "head"/"batch")."""
    kw = {k: v for k, v in mods.items() if k != "alibi"}
    slopes = make_slopes(mods.get("alibi"), b, hq, gen, device)
    call = dict(kw, alibi_slopes=slopes)
    ref = dict(kw, slopes=slopes)
    return call, ref


def qkv(b, hq, hkv, nq, nk, d, dtype, device, gen, q_scale=1.0):
    return (randn((b, hq, nq, d), dtype, device, gen, q_scale), randn((b, hkv, nk, d), dtype, device, gen),
            randn((b, hkv, nk, d), dtype, device, gen))


def ours_grads(fn, q, k, v, go, gl):
    """(dq, dk, dv) by autograd of fn(q, k, v) → (out, lse), for go (and gl on lse)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    outs, grads = ([out], [go]) if gl is None else ([out, lse], [go, gl])
    return torch.autograd.grad(outs, (q, k, v), grads)


def run_forward(backend, b, hq, hkv, nq, nk, d, dtype, mods, seed, *, q_scale=1.0):
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = qkv(b, hq, hkv, nq, nk, d, dtype, device, gen, q_scale)
    call, ref = split_mods(mods, b, hq, gen, device)
    out, lse = ta.attention(q, k, v, return_lse=True, backend=backend, **call)
    what = f"{backend} B={b} H={hq}/{hkv} Nq={nq} Nk={nk} D={d} {DT[dtype]} {mods_id(mods)}"
    check_forward(out, lse, q, k, v, seed, what, **ref)
    return out, lse


def run_backward(backend, b, hq, hkv, nq, nk, d, dtype, mods, seed, *, lse_grad=False, q_scale=1.0):
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = qkv(b, hq, hkv, nq, nk, d, dtype, device, gen, q_scale)
    call, ref = split_mods(mods, b, hq, gen, device)
    go = randn((b, hq, nq, d), dtype, device, gen)
    gl = randn((b, hq, nq), torch.float32, device, gen) if lse_grad else None
    grads = ours_grads(lambda q_, k_, v_: ta.attention(q_, k_, v_, return_lse=True, backend=backend, **call),
                       q, k, v, go, gl)
    what = (f"{backend} B={b} H={hq}/{hkv} Nq={nq} Nk={nk} D={d} {DT[dtype]} {mods_id(mods)}"
            f"{' +lse' if lse_grad else ''}")
    check_backward(grads, q, k, v, go, gl, seed, what, **ref)
    return grads


# ==================================================================================================
# the reduced grid: runs everywhere (CI in Triton's interpreter, and on the GPU)
# ==================================================================================================
# (Nq, Nk, D, Hq, Hkv): GQA, Nq > Nk (negative offset: rows a window leaves without a key), decode
# with MQA, an odd head dim, a short query block against more keys.
CPU_SHAPES = [(37, 53, 40, 4, 2), (64, 29, 16, 2, 2), (1, 70, 32, 4, 1), (45, 45, 59, 3, 1), (16, 67, 24, 2, 1)]
MODS = [
    dict(window=(0, 0)),
    dict(window=(3, 5)),
    dict(window=(7, -1)),                     # one-sided: left only
    dict(window=(-1, 2)),                     # one-sided: right only
    dict(window=(1000, 1000)),                # wider than N on both sides
    dict(window=(0, 1000)),
    dict(window=(-1, -1)),                    # == no window
    dict(causal=True, window=(5, -1)),
    dict(causal=True, window=(4, 9)),         # causal forces right = 0: == (4, 0)
    dict(causal=True, window=(0, 0)),
    dict(softcap=0.5),                        # bites: every |s| > 0.5 is squashed
    dict(softcap=30.0, causal=True),
    dict(softcap=1e4),                        # never bites
    dict(softcap=2.0, window=(6, 6)),
    dict(alibi="head"),
    dict(alibi="batch", causal=True),
    dict(alibi="head", window=(9, 4)),
    dict(alibi="batch", softcap=5.0),
    dict(softcap=2.0, alibi="batch", window=(16, -1), causal=True),
]


def _cpu_forward_cases():
    cases = []
    for i, mods in enumerate(MODS):
        for j in range(2):
            shape = CPU_SHAPES[(2 * i + j) % len(CPU_SHAPES)]
            dtype = ALL_DTYPES[(i + j) % 3]
            cases.append(pytest.param(shape, dtype, mods,
                                      id=f"{mods_id(mods)}-{'x'.join(map(str, shape))}-{DT[dtype]}"))
    return cases


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,dtype,mods", _cpu_forward_cases())
def test_forward(backend, shape, dtype, mods, seed):
    on_this_device(backend)
    nq, nk, d, hq, hkv = shape
    run_forward(backend, 2, hq, hkv, nq, nk, d, dtype, mods, seed)


def _random_window(gen, nq, nk):
    """(left, right) each -1, 0, small or wider than the keys."""
    def side():
        r = torch.randint(0, 4, (1,), generator=gen).item()
        return [-1, 0, int(torch.randint(1, 12, (1,), generator=gen)), nk + nq + 3][r]
    return side(), side()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DT.get)
def test_random_windows(backend, dtype, seed):
    """Windows drawn from the seed, with and without causal, several shapes."""
    on_this_device(backend)
    gen = torch.Generator().manual_seed(seed)
    for t in range(5):
        nq, nk, d, hq, hkv = CPU_SHAPES[t]
        window = _random_window(gen, nq, nk)
        causal = bool(torch.randint(0, 2, (1,), generator=gen))
        run_forward(backend, 1, hq, hkv, nq, nk, d, dtype, dict(window=window, causal=causal), fresh_seed())


def test_window_none_is_unbounded(seed):
    """window=(-1, -1) and window=None are the same call; causal + (left, x) == (left, 0)."""
    device = require("triton")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = qkv(1, 2, 1, 19, 33, 32, torch.float16, device, gen)
    a = ta.attention(q, k, v, backend="triton")
    b = ta.attention(q, k, v, window=(-1, -1), backend="triton")
    assert torch.equal(a, b)
    c = ta.attention(q, k, v, causal=True, window=(3, 11), backend="triton")
    check_forward(c, None, q, k, v, seed, "causal window (3, 11)", window=(3, 0))


BWD_MODS = [
    dict(window=(0, 0)),
    dict(window=(3, 5)),
    dict(window=(7, -1)),
    dict(window=(-1, 2), causal=True),
    dict(window=(1000, 1000)),
    dict(softcap=0.5),
    dict(softcap=20.0, causal=True),
    dict(alibi="head", causal=True),
    dict(alibi="batch", window=(9, 4)),
    dict(softcap=2.0, alibi="batch", window=(16, -1), causal=True),
]
BWD_SHAPES = [(33, 40, 32, 4, 2), (17, 3, 16, 2, 1), (40, 40, 59, 2, 2), (1, 50, 40, 4, 1), (24, 61, 24, 3, 3)]


def _cpu_backward_cases():
    return [pytest.param(BWD_SHAPES[i % len(BWD_SHAPES)], ALL_DTYPES[i % 3], mods, i % 2 == 1,
                         id=f"{mods_id(mods)}-{'x'.join(map(str, BWD_SHAPES[i % len(BWD_SHAPES)]))}-"
                            f"{DT[ALL_DTYPES[i % 3]]}{'-lse' if i % 2 else ''}")
            for i, mods in enumerate(BWD_MODS)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,dtype,mods,lse_grad", _cpu_backward_cases())
def test_backward(backend, shape, dtype, mods, lse_grad, seed):
    on_this_device(backend)
    nq, nk, d, hq, hkv = shape
    run_backward(backend, 2, hq, hkv, nq, nk, d, dtype, mods, seed, lse_grad=lse_grad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DT.get)
def test_rows_that_see_no_key(backend, dtype, seed):
    """Nq = 24 against Nk = 8 with window (1, 1): offset −16, so rows 0..14 see no key (bottom-right
    alignment: the last row always sees key Nk − 1). Out 0, lse −inf, dq 0, and changing those
    rows' q, grad_out and lse gradient leaves dk and dv bitwise unchanged."""
    on_this_device(backend)
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, nq, nk, d = 2, 4, 2, 24, 8, 32
    mods = dict(window=(1, 1))
    q, k, v = qkv(b, hq, hkv, nq, nk, d, dtype, device, gen)
    m = Mods(q, k, **mods)
    blind = ~m.seen
    assert blind[:15].all() and m.seen[15:].all()
    out, lse = ta.attention(q, k, v, return_lse=True, backend=backend, **mods)
    check_forward(out, lse, q, k, v, seed, f"{backend} blind rows", **mods)
    go = randn((b, hq, nq, d), dtype, device, gen)
    gl = randn((b, hq, nq), torch.float32, device, gen)

    def fn(q_, k_, v_):
        return ta.attention(q_, k_, v_, return_lse=True, backend=backend, **mods)

    grads = ours_grads(fn, q, k, v, go, gl)
    check_backward(grads, q, k, v, go, gl, seed, f"{backend} blind rows", **mods)
    q2, go2, gl2 = q.clone(), go.clone(), gl.clone()
    q2[:, :, blind] *= 100
    go2[:, :, blind] = randn((b, hq, int(blind.sum()), d), dtype, device, gen, 1e3)
    gl2[:, :, blind] = 1e6
    grads2 = ours_grads(fn, q2, k, v, go2, gl2)
    for name, a, c in zip(("dk", "dv"), grads[1:], grads2[1:]):
        assert torch.equal(a, c), f"[{backend} seed={seed}] rows that see no key changed {name}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_keys_and_no_queries(backend, seed):
    """Nk = 0 with a window/softcap/ALiBi: out 0, lse −inf, dq 0; Nq = 0: empty out, dk = dv = 0."""
    on_this_device(backend)
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    slopes = make_slopes("batch", 2, 4, gen, device)
    mods = dict(window=(2, 3), softcap=3.0, alibi_slopes=slopes)
    q, k, v = qkv(2, 4, 2, 9, 0, 32, torch.float16, device, gen)
    out, lse = ta.attention(q, k, v, return_lse=True, backend=backend, **mods)
    assert torch.equal(out.cpu(), torch.zeros(out.shape, dtype=out.dtype))
    assert bool((lse == NEG_INF).all())
    go = randn(q.shape, torch.float16, device, gen)
    dq, dk, dv = ours_grads(lambda a, b_, c: ta.attention(a, b_, c, return_lse=True, backend=backend, **mods),
                            q, k, v, go, None)
    assert torch.equal(dq.cpu(), torch.zeros(q.shape, dtype=q.dtype)) and dk.shape == k.shape
    q, k, v = qkv(2, 4, 2, 0, 11, 32, torch.bfloat16, device, gen)
    out, lse = ta.attention(q, k, v, return_lse=True, backend=backend, **mods)
    assert out.shape == q.shape and lse.shape == (2, 4, 0)
    dq, dk, dv = ours_grads(lambda a, b_, c: ta.attention(a, b_, c, return_lse=True, backend=backend, **mods),
                            q, k, v, torch.empty(q.shape, dtype=q.dtype, device=device), None)
    assert torch.equal(dk.cpu(), torch.zeros(k.shape, dtype=k.dtype))
    assert torch.equal(dv.cpu(), torch.zeros(v.shape, dtype=v.dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DT.get)
def test_huge_scores_with_softcap(backend, dtype, seed):
    """Scores of ±1e4: softcap makes them finite (c·tanh saturates at ±c); with a window and ALiBi
    too. Forward and gradients under the rule, nothing NaN or inf."""
    on_this_device(backend)
    d = 32
    # q·k/√D ~ q_scale·N(0, 1): ±1e4 at q_scale 3000 (fp16 holds 3000·randn)
    mods = dict(softcap=20.0, window=(9, 2), alibi="head")
    out, lse = run_forward(backend, 2, 2, 1, 30, 41, d, dtype, mods, seed, q_scale=3000.0)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    grads = run_backward(backend, 2, 2, 1, 30, 41, d, dtype, dict(softcap=20.0, causal=True), seed,
                         lse_grad=True, q_scale=3000.0)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=DT.get)
def test_huge_scores_in_a_window(backend, dtype, seed):
    """±1e3 scores without softcap, inside a window: near-one-hot rows of finite output."""
    on_this_device(backend)
    run_forward(backend, 1, 2, 2, 33, 47, 32, dtype, dict(window=(5, 5)), seed, q_scale=300.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_views(backend, seed):
    """q a (B, N, H, D) transpose, k and v halves of one packed (B, N, 2, Hkv, 2·D) tensor sliced
    along D, slopes a column slice of a wider (B, 2·Hq) tensor; forward and gradients (taken with
    respect to the views)."""
    on_this_device(backend)
    device = require(backend)
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, nq, nk, d = 2, 4, 2, 29, 37, 40
    dtype = torch.bfloat16
    q = randn((b, nq, hq, d), dtype, device, gen).transpose(1, 2)
    kv = randn((b, nk, 2, hkv, 2 * d), dtype, device, gen)
    k, v = kv[:, :, 0, :, :d].transpose(1, 2), kv[:, :, 1, :, d:].transpose(1, 2)
    slopes = (torch.rand(b, 2 * hq, generator=gen) * 0.4).to(device)[:, :hq]
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous() or slopes.is_contiguous())
    mods = dict(window=(6, 3), softcap=4.0)
    out, lse = ta.attention(q, k, v, return_lse=True, alibi_slopes=slopes, backend=backend, **mods)
    check_forward(out, lse, q, k, v, seed, f"{backend} strided", slopes=slopes, **mods)
    go = randn((b, nq, hq, d), dtype, device, gen).transpose(1, 2)  # a strided gradient too
    gl = randn((b, hq, nq), torch.float32, device, gen)
    grads = ours_grads(lambda a, b_, c: ta.attention(a, b_, c, return_lse=True, alibi_slopes=slopes,
                                                     backend=backend, **mods), q, k, v, go, gl)
    check_backward(grads, q, k, v, go, gl, seed, f"{backend} strided", slopes=slopes, **mods)


def test_default_backend(seed, kernel_calls):
    """backend=None with a window: triton on CUDA; on the CPU the torch backend (SDPA has no window)."""
    device = device_for("torch")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = qkv(1, 2, 2, 21, 30, 32, torch.float32, device, gen)
    out, lse = ta.attention(q, k, v, window=(4, 4), softcap=10.0, return_lse=True)
    check_forward(out, lse, q, k, v, seed, "backend None", window=(4, 4), softcap=10.0)
    assert kernel_calls == (["triton"] if HAS_CUDA else ["torch"])


# ==================================================================================================
# bad input: before any launch, a ValueError/TypeError naming the argument
# ==================================================================================================
def _z(*shape, dtype=torch.float32, device="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=device)


# name: (kwargs, exception(s), match)
BAD_MODS = {
    "window_int": (dict(window=3), TypeError, "window"),
    "window_str": (dict(window="3,3"), TypeError, "window"),
    "window_one": (dict(window=(3,)), (TypeError, ValueError), "window"),
    "window_three": (dict(window=(1, 2, 3)), (TypeError, ValueError), "window"),
    "window_float": (dict(window=(1.0, 2)), TypeError, "window"),
    "window_bool": (dict(window=(True, 2)), TypeError, "window"),
    "window_tensor": (dict(window=(torch.tensor(1), 2)), TypeError, "window"),
    "window_left_neg": (dict(window=(-2, 0)), ValueError, "window"),
    "window_right_neg": (dict(window=(0, -5)), ValueError, "window"),
    "softcap_zero": (dict(softcap=0.0), ValueError, "softcap"),
    "softcap_neg": (dict(softcap=-1.0), ValueError, "softcap"),
    "softcap_inf": (dict(softcap=float("inf")), ValueError, "softcap"),
    "softcap_nan": (dict(softcap=float("nan")), ValueError, "softcap"),
    "softcap_str": (dict(softcap="1"), TypeError, "softcap"),
    "softcap_bool": (dict(softcap=True), TypeError, "softcap"),
    "softcap_tensor": (dict(softcap=torch.tensor([1.0, 2.0])), TypeError, "softcap"),
    "alibi_list": (dict(alibi_slopes=[0.1, 0.2]), TypeError, "alibi_slopes"),
    "alibi_float64": (dict(alibi_slopes=_z(4, dtype=torch.float64)), TypeError, "alibi_slopes"),
    "alibi_float16": (dict(alibi_slopes=_z(4, dtype=torch.float16)), TypeError, "alibi_slopes"),
    "alibi_int": (dict(alibi_slopes=_z(4, dtype=torch.int32)), TypeError, "alibi_slopes"),
    "alibi_short": (dict(alibi_slopes=_z(3)), ValueError, "alibi_slopes"),
    "alibi_kv_heads": (dict(alibi_slopes=_z(2)), ValueError, "alibi_slopes"),
    "alibi_batch": (dict(alibi_slopes=_z(3, 4)), ValueError, "alibi_slopes"),
    "alibi_3d": (dict(alibi_slopes=_z(2, 4, 1)), ValueError, "alibi_slopes"),
    "alibi_scalar": (dict(alibi_slopes=torch.tensor(0.5)), ValueError, "alibi_slopes"),
    "alibi_device": (dict(alibi_slopes=_z(4, device="meta")), ValueError, "alibi_slopes"),
}


@pytest.mark.parametrize("backend", [None, "torch", "triton"])
@pytest.mark.parametrize("name", list(BAD_MODS))
def test_bad_input(name, backend, kernel_calls):
    """Each bad window/softcap/alibi_slopes raises naming the argument, before any launch. q (2, 4,
    5, 16) against k/v (2, 2, 7, 16): Hq = 4, Hkv = 2, B = 2."""
    if backend == "triton" and not backend_available("triton"):
        pytest.skip(skip_reason("triton"))
    kwargs, exc, match = BAD_MODS[name]
    dev = device_for("triton")
    kwargs = {k: (v.to(dev) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v)
              for k, v in kwargs.items()}
    q, k = _z(2, 4, 5, 16, device=dev), _z(2, 2, 7, 16, device=dev)
    with pytest.raises(exc, match=match):
        ta.attention(q, k, k, backend=backend, **kwargs)
    assert kernel_calls == []


@pytest.mark.parametrize("mod", [dict(window=(2, 2)), dict(softcap=5.0), dict(alibi_slopes="head")],
                         ids=["window", "softcap", "alibi"])
def test_cuda_backend_has_no_mods(mod, kernel_calls):
    """backend='cuda' supports none of window/softcap/alibi: ValueError naming the argument (or, on
    CPU tensors, the CUDA backend's need for CUDA tensors), pointing to backend None/'triton'."""
    dev = "cuda" if HAS_CUDA else "cpu"
    q = _z(1, 2, 4, 32, dtype=torch.float16, device=dev)
    if mod.get("alibi_slopes") == "head":
        mod = dict(alibi_slopes=_z(2, device=dev))
    with pytest.raises(ValueError, match="backend") as info:
        ta.attention(q, q, q, backend="cuda", **mod)
    if HAS_CUDA:
        msg = str(info.value)
        name = next(iter(mod))
        assert name in msg and "triton" in msg, msg
    assert kernel_calls == []


# ==================================================================================================
# GPU: flash-attn-sized grids on the triton backend
# ==================================================================================================
GPU_SHAPES = [(1, 239), (3, 799), (113, 203), (128, 217), (256, 512), (512, 256), (1023, 1024), (2048, 2048)]
GPU_HEAD_DIMS = [40, 64, 96, 128, 256]
GPU_HEADS = [(4, 4), (8, 2), (4, 1)]
GPU_MODS = [
    dict(window=(0, 0)), dict(window=(128, 0)), dict(window=(256, -1), causal=True), dict(window=(-1, 64)),
    dict(window=(100000, 100000)), dict(window=(31, 17)), dict(softcap=50.0, causal=True), dict(softcap=0.5),
    dict(alibi="head", causal=True), dict(alibi="batch"), dict(alibi="batch", window=(64, 64)),
    dict(softcap=30.0, alibi="head", window=(512, -1), causal=True),
]


def _gpu_cases(backward: bool):
    if not GPU_GRID:
        return [pytest.param(None, None, None, None, None, id="gpu-grid",
                             marks=pytest.mark.skip(reason="the GPU grid runs on a CUDA device"))]
    cases = []
    mods_list = GPU_MODS if not backward else GPU_MODS[::2]
    for si, (nq, nk) in enumerate(GPU_SHAPES):
        for mi, mods in enumerate(mods_list):
            d = GPU_HEAD_DIMS[(si + mi) % len(GPU_HEAD_DIMS)]
            dtype = ALL_DTYPES[(si + 2 * mi) % 3]
            heads = GPU_HEADS[(si + mi) % 3]
            cases.append(pytest.param((nq, nk), d, dtype, heads, mods,
                                      id=f"{nq}x{nk}-{d}-{DT[dtype]}-{heads[0]}_{heads[1]}-{mods_id(mods)}",
                                      marks=pytest.mark.gpu))
    return cases


@pytest.mark.skipif(not GPU_GRID, reason="the GPU grid runs on a CUDA device")
@pytest.mark.parametrize("shape,d,dtype,heads,mods", _gpu_cases(False))
def test_gpu_forward(shape, d, dtype, heads, mods, seed):
    run_forward("triton", 2, *heads, *shape, d, dtype, mods, seed)


@pytest.mark.skipif(not GPU_GRID, reason="the GPU grid runs on a CUDA device")
@pytest.mark.parametrize("shape,d,dtype,heads,mods", _gpu_cases(True))
def test_gpu_backward(shape, d, dtype, heads, mods, seed):
    run_backward("triton", 2, *heads, *shape, d, dtype, mods, seed, lse_grad=shape[0] % 2 == 1)


@pytest.mark.skipif(not GPU_GRID, reason="the GPU grid runs on a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DT.get)
def test_gpu_long_window(dtype, seed):
    """A window of 16 over 4096 keys (Mistral-like sliding window at a long context), GQA."""
    run_forward("triton", 1, 8, 2, 4096, 4096, 128, dtype, dict(window=(16, 0)), seed)
