"""ta.attention's backward: dq, dk, dv (and the gradient through lse) against float64 autograd
under the numerics rule (tests/helpers.py, DESIGN §4).

Reference: torch.autograd through reference.attention in float64 on the same (already rounded)
inputs, with a random grad_out (helpers.randn) and, with return_lse=True, a random gradient of lse.
torch's own error (e_torch), per gradient the larger of two (_torch_grads):
* torch's autograd in the input dtype: F.scaled_dot_product_attention's backward (bottom-right
  causal as an explicit boolean mask; GQA by repeat_interleave of k/v, whose backward sums the
  group in the input dtype) on the rows that see a key (torch's rows that see none are NaN; the
  reference and ours are 0 there); when the loss uses lse, plus autograd through torch.logsumexp
  of the float32 scores (torch has no lse-returning public SDPA), the two added in the input dtype
  as autograd does for a user's loss;
* the same gradients written in torch with FlashAttention-2's rounding points (_flash_grads:
  float32 scores and accumulation, P recomputed from the float32 lse in log2 units, P and dS
  rounded to the input dtype for the tensor-core products), which is what SDPA's flash backend
  computes on the GPU. On the CPU SDPA keeps the forward's P in float32, so its error would stand
  for a more exact algorithm than the one the rule is about (tests/test_attention.py's _torch_own
  takes the same larger-of-two for the forward).
float32 inputs get a first-order slack on top (_recompute_slack: P recomputed from an lse the
forward's test lets carry 4 more ulps than torch's, and dots summed in another order; ~1e-6
relative, where a row that sees one key leaves torch's own error at its final rounding); 16-bit
inputs are held to the rule as it is. Rows that see no key (causal with Nq > Nk) must get dq
exactly 0 and add nothing to dk, dv.

What runs where.
* CPU (CI; Triton in TRITON_INTERPRET=1's interpreter, so tiny problems: Nq, Nk <= 70, D in
  16/32/40/59, B <= 2, <= 6 heads; ~1-1.5 min on 2 cores): backends "torch" and "triton" on a
  pairwise-covering grid of shape × D × dtype × causal × MHA/GQA/MQA (test_gradients), the
  gradient through lse, rows that see no key, Nk = 0 and Nq = 0, strided inputs that are views of
  one leaf and strided grad_outs (stride 0 from out.sum().backward(), a float32 loss), scores of
  ±1e4 and rows whose every score is very negative, tile shapes, causal offsets and strided
  preallocated outputs through the kernel entry point (attention_backward), the atomic dQ mode,
  bitwise determinism (and that deterministic=True never takes the atomic mode), float64
  gradcheck of the torch backend (reference.blockwise_attention_backward), double backward never
  silently wrong, the backward_calls fixture, deterministic's type check, no N×N saved tensor.
  On a CUDA device the same tests run for the kernel backends (triton; cuda at its head dims and
  16-bit dtypes), the torch backend's being device-independent math left to the CPU.
* CUDA only: the flash-attn grid of issue #13 (12 shapes × 12 head dims × causal, dtype and head
  layout cycling so that every pair of the five dimensions appears: test_grids_cover_every_pair;
  lse's gradient too at the odd head dims when causal), determinism at B=2, Hq=8, Hkv=2, N=1000,
  D=64 bf16 causal (with the shipped rows and with the atomic dQ row forced), and the backward's
  peak memory at N = 32k.

GPU run (H100, ~2 min): python -m pytest tests/test_attention_backward.py -n 12 --dist loadgroup
(cases that compile the same kernels share an xdist group).
"""
from __future__ import annotations

import itertools
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import tiled_attn as ta
from tiled_attn import reference
from tiled_attn.attention import _attention_op
from helpers import (DTYPES, HAS_CUDA, INTERPRET, assert_rule, backend_available, device_for, max_err,
                     randn, reproduce_hint, skip_reason)

BACKENDS = ["torch", "triton", "cuda"]
KERNEL_BACKENDS = ["triton", "cuda"]
HEADS = {"mha": (2, 2), "gqa": (6, 2), "mqa": (4, 1)}  # (Hq, Hkv); G = 1, 3, 4
CUDA_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
GPU_GRID = HAS_CUDA and not INTERPRET
DT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
NEG_INF = float("-inf")
LOG2E = 1.4426950408889634


def _require(backend: str, dtype: torch.dtype = torch.float16, d: int = 64) -> str:
    """Skip what a backend cannot run here; returns the device its tensors live on."""
    if not backend_available(backend):
        pytest.skip(skip_reason(backend))
    if backend == "cuda" and dtype not in (torch.float16, torch.bfloat16):
        pytest.skip("the CUDA attention kernel supports float16/bfloat16 only")
    if backend == "cuda" and d not in CUDA_HEAD_DIMS:
        pytest.skip(f"the CUDA attention kernel instantiates head dims {CUDA_HEAD_DIMS}, not {d}")
    return device_for(backend)


def _on_this_device(backend: str) -> None:
    """On a CUDA device the torch backend's cases are left to the CPU run (device-independent math)."""
    if backend == "torch" and GPU_GRID:
        pytest.skip("the torch backend's backward runs on the CPU (its math is device-independent)")


def _group(dtype, d) -> list:
    """On the GPU (pytest-xdist, --dist loadgroup): cases that compile the same kernels (one dtype
    and head dim) run on one worker."""
    return [pytest.mark.xdist_group(f"bwd-{DT[dtype]}-{d}")] if GPU_GRID else []


def _id(*parts):
    return "-".join(DT.get(p, str(p)) if isinstance(p, torch.dtype) else str(p) for p in parts)


def _heads(heads):
    return HEADS[heads] if isinstance(heads, str) else heads


def _qkv(b, hq, hkv, nq, nk, d, dtype, device, gen, q_scale=1.0):
    return (randn((b, hq, nq, d), dtype, device, gen, q_scale), randn((b, hkv, nk, d), dtype, device, gen),
            randn((b, hkv, nk, d), dtype, device, gen))


def _first_seen(nq: int, nk: int, causal: bool, offset: int) -> int:
    """Rows [0, first) see no key: with the mask j <= i + offset, row i sees one iff i + offset >= 0."""
    if nk == 0:
        return nq
    return min(nq, max(0, -offset)) if causal else 0


def _mask(nq, nk, causal, offset, device):
    return reference._causal_mask(nq, nk, device, offset) if causal else None


# -- the three gradients: ours, the float64 reference, torch's own ---------------------------------
def _ours(q, k, v, go, gl=None, *, causal=False, backend=None, scale=None, deterministic=False):
    """(dq, dk, dv) of ta.attention by autograd, for the output gradient go (and lse's, gl)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    if gl is None:
        outs = [ta.attention(q, k, v, causal=causal, scale=scale, backend=backend, deterministic=deterministic)]
        grads = [go]
    else:
        outs = list(ta.attention(q, k, v, causal=causal, scale=scale, return_lse=True, backend=backend,
                                 deterministic=deterministic))
        grads = [go, gl]
    return torch.autograd.grad(outs, (q, k, v), grads)


def _grads_of(outs, inputs, grads, like):
    """torch.autograd.grad over the outputs that have a graph (an empty problem has none); an input
    nothing reached gets zeros."""
    pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
    if not pairs:
        return tuple(torch.zeros_like(t) for t in like)
    got = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g for g, t in zip(got, like))


def _reference(q, k, v, go, gl, causal, scale, offset):
    """float64 autograd through reference.attention on the same rounded inputs."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = reference.attention(q64, k64, v64, causal, scale, True, offset)
    outs, grads = [out], [go.double()]
    if gl is not None:
        outs, grads = [out, lse], [go.double(), gl.double()]
    return _grads_of(outs, (q64, k64, v64), grads, (q64, k64, v64))


def _sdpa_grads(q, k, v, go, gl, causal, scale, offset):
    """torch's autograd in the input dtype: SDPA (+ float32 logsumexp for lse's gradient) on the
    rows that see a key; dq is 0 on the others (as in the reference)."""
    nq, nk = q.shape[2], k.shape[2]
    g = q.shape[1] // k.shape[1]
    first = _first_seen(nq, nk, causal, offset)
    qs = q[:, :, first:].detach().requires_grad_()
    ks, vs = (t.detach().requires_grad_() for t in (k, v))
    kr, vr = (t.repeat_interleave(g, dim=1) for t in (ks, vs))
    mask = _mask(nq, nk, causal, offset, q.device)
    mask = None if mask is None else mask[first:]
    outs, grads = [F.scaled_dot_product_attention(qs, kr, vr, attn_mask=mask, scale=scale)], [go[:, :, first:]]
    if gl is not None:
        s = torch.matmul(qs.float(), kr.float().transpose(-1, -2)) * scale
        if mask is not None:
            s = s.masked_fill(~mask, NEG_INF)
        outs.append(torch.logsumexp(s, dim=-1))
        grads.append(gl[:, :, first:])
    dqs, dk, dv = torch.autograd.grad(outs, (qs, ks, vs), grads)
    dq = torch.zeros_like(q)
    dq[:, :, first:] = dqs
    return dq, dk, dv


def _flash_grads(q, k, v, go, gl, causal, scale, offset):
    """The backward with FlashAttention-2's rounding points, in torch: float32 scores, softmax and
    accumulation; the forward's O from P rounded to the input dtype and its lse in float32; the
    backward's P recomputed from that lse in log2 units as FA2 does (exp2(s·scale·log2e −
    lse·log2e)), from scores it sums in another order than the forward did; P rounded to the input
    dtype for dV, dS for dQ and dK; dK/dV summed over the GQA group in float32; the gradients
    rounded to the input dtype once."""
    dt = q.dtype
    nq, nk = q.shape[2], k.shape[2]
    hkv, g = k.shape[1], q.shape[1] // k.shape[1]
    qf, gof = q.float(), go.float()
    kf, vf = (t.float().repeat_interleave(g, dim=1) for t in (k, v))
    raw = torch.matmul(qf, kf.transpose(-1, -2))
    mask = _mask(nq, nk, causal, offset, q.device)
    if mask is not None:
        raw = raw.masked_fill(~mask, NEG_INF)
    lse = torch.logsumexp(raw * scale, dim=-1)
    out = torch.matmul(reference.attention_probs(raw * scale, lse).to(dt).float(), vf).to(dt)
    # The backward's q·kᵀ in another summation order than the forward's (its tiles are kᵀ-major).
    h = (q.shape[-1] + 1) // 2
    raw = (torch.matmul(qf[..., :h], kf[..., :h].transpose(-1, -2))
           + torch.matmul(qf[..., h:], kf[..., h:].transpose(-1, -2)))
    if mask is not None:
        raw = raw.masked_fill(~mask, NEG_INF)
    shift = torch.where(lse == NEG_INF, torch.full_like(lse, math.inf), lse * LOG2E)
    p = torch.exp2(raw * (scale * LOG2E) - shift[..., None])  # 0 on rows that see no key
    pd = p.to(dt).float()
    delta = (gof * out.float()).sum(-1)
    if gl is not None:
        delta = delta - gl.float()
    ds = (p * (torch.matmul(gof, vf.transpose(-1, -2)) - delta[..., None])).to(dt).float()
    dq = torch.matmul(ds, kf) * scale
    dk = reference._sum_group(torch.matmul(ds.transpose(-1, -2), qf), hkv) * scale
    dv = reference._sum_group(torch.matmul(pd.transpose(-1, -2), gof), hkv)
    return dq.to(dt), dk.to(dt), dv.to(dt)


def _torch_grads(q, k, v, go, gl, causal, scale, offset, ref):
    """Per gradient, the one of torch's two versions (module docstring) farther from the reference.
    A version that is not finite where the reference is (its error would be inf, the rule vacuous)
    does not count; where neither is finite the rule cannot apply and the test skips, saying so."""
    if q.shape[2] == 0 or k.shape[2] == 0:  # nothing to compute: torch's SDPA is undefined here
        return ref
    cands = [_sdpa_grads(q, k, v, go, gl, causal, scale, offset), _flash_grads(q, k, v, go, gl, causal, scale, offset)]
    out = []
    for name, ts, r in zip(("dq", "dk", "dv"), zip(*cands), ref):
        errs = [e for e in ((max_err(t, r), i) for i, t in enumerate(ts)) if math.isfinite(e[0])]
        if not errs:
            pytest.skip(f"torch's own {name} is not finite where the reference is: the rule has no bound")
        out.append(ts[max(errs)[1]])
    return tuple(out)


U32 = torch.finfo(torch.float32).eps / 2  # float32 unit roundoff


def _recompute_slack(q, k, v, go, gl, causal, scale, offset) -> tuple[float, float, float]:
    """For float32 inputs, what the tiled backward's recompute may add to dq, dk, dv beyond torch's
    figure, to first order (float64 on the reference's P, dP, delta; 16-bit inputs: 0, the rule as
    it is). About 1e-6 relative, where float32's eps is 1.2e-7 and the smallest problems (a row
    that sees one key: torch's P is exactly 1, dP − delta exactly 0) can leave torch's own error
    at its final rounding:
    * P_ij = exp(s_ij − lse_i) is recomputed from the forward's float32 lse, whose error the
      forward's test allows 4 float32 ulps of |lse| beyond torch's (tests/test_attention.py
      _assert_lse: the kernels form lse in log2 units, three roundings where torch's logsumexp
      makes one): a relative error E_i = 4·eps·|lse_i| of P_ij that the FA2 emulation, built on
      torch's own lse, does not carry.
    * dP_ij − delta_i cancels, and each is a float32 dot whose rounding depends on its summation
      order (the probabilistic bound, as _score_rounding in tests/test_attention.py):
      F_ij = √D·u·(Σ_d |dO_d V_jd| + Σ_d |dO_d O_d|).
    Then |ΔdV_j| <= Σ_i E_i P_ij |dO_i|, |ΔdS_ij| <= P_ij (E_i |dP_ij − delta_i| + F_ij),
    dQ = scale·dS·K, dK = scale·dSᵀ·Q (dK, dV summed over the GQA group)."""
    nq, nk = q.shape[2], k.shape[2]
    if q.dtype != torch.float32 or nq == 0 or nk == 0:
        return 0.0, 0.0, 0.0
    hkv, g, d = k.shape[1], q.shape[1] // k.shape[1], q.shape[-1]
    qd, god = q.double(), go.double()
    kd, vd = (t.double().repeat_interleave(g, dim=1) for t in (k, v))
    s = torch.matmul(qd, kd.transpose(-1, -2)) * scale
    mask = _mask(nq, nk, causal, offset, q.device)
    if mask is not None:
        s = s.masked_fill(~mask, NEG_INF)
    lse = torch.logsumexp(s, dim=-1)
    p = reference.attention_probs(s, lse)
    o = torch.matmul(p, vd)
    e = 4 * torch.finfo(torch.float32).eps * torch.nan_to_num(lse.abs(), posinf=0.0)[..., None]
    f = math.sqrt(d) * U32 * (torch.matmul(god.abs(), vd.abs().transpose(-1, -2))
                              + (god.abs() * o.abs()).sum(-1, keepdim=True))
    delta = (god * o).sum(-1)
    if gl is not None:
        delta = delta - gl.double()
    eds = p * (e * (torch.matmul(god, vd.transpose(-1, -2)) - delta[..., None]).abs() + f)
    s_dq = abs(scale) * torch.matmul(eds, kd.abs())
    s_dk = abs(scale) * reference._sum_group(torch.matmul(eds.transpose(-1, -2), qd.abs()), hkv)
    s_dv = reference._sum_group(torch.matmul((e * p).transpose(-1, -2), god.abs()), hkv)
    return tuple(torch.nan_to_num(x, nan=0.0, posinf=0.0).max().item() for x in (s_dq, s_dk, s_dv))


def _assert_grad(ours, ref, t, slack, dtype, seed, what):
    """assert_rule (DESIGN §4) with the float32 recompute slack (_recompute_slack) added to the tolerance."""
    if slack == 0.0:
        return assert_rule(ours, ref, t, dtype=dtype, seed=seed, what=what)
    ours_c, ref_c = ours.detach().double().cpu(), ref.detach().double().cpu()
    tag = f"[{what} seed={seed}; {reproduce_hint()}]"
    assert torch.equal(torch.isnan(ours_c), torch.isnan(ref_c)), f"{tag} NaN pattern differs from the reference"
    inf = torch.isinf(ref_c)
    assert torch.equal(ours_c[inf], ref_c[inf]), f"{tag} ±inf entries differ from the reference"
    e_ours, e_torch = max_err(ours_c, ref_c), max_err(t, ref_c)
    tol = 2 * e_torch + torch.finfo(dtype).eps + slack
    assert e_ours <= tol, (f"{tag} error {e_ours:.3e} exceeds 2×torch's {e_torch:.3e} + eps + float32 "
                           f"recompute slack {slack:.3e} ({tol:.3e}) for {dtype}")


def _check(grads, q, k, v, go, gl, causal, scale, offset, seed, what):
    """The rule on dq, dk, dv; their shapes and dtypes; dq exactly 0 on rows that see no key."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    ref = _reference(q, k, v, go, gl, causal, scale, offset)
    tgrads = _torch_grads(q, k, v, go, gl, causal, scale, offset, ref)
    slack = _recompute_slack(q, k, v, go, gl, causal, scale, offset)
    for name, ours, r, t, x, sl in zip(("dq", "dk", "dv"), grads, ref, tgrads, (q, k, v), slack):
        assert ours.shape == x.shape and ours.dtype == x.dtype, \
            f"[{what} seed={seed}] {name} {tuple(ours.shape)} {ours.dtype}, expected {tuple(x.shape)} {x.dtype}"
        _assert_grad(ours, r, t, sl, q.dtype, seed, f"{what} {name}")
    first = _first_seen(q.shape[2], k.shape[2], causal, offset)
    if first:
        blind = grads[0][:, :, :first].float().cpu()
        assert torch.equal(blind, torch.zeros_like(blind)), \
            f"[{what} seed={seed}] dq of rows that see no key must be exactly 0"


def _case(backend, b, heads, nq, nk, d, dtype, causal, seed, *, q_scale=1.0, lse_grad=False,
          deterministic=False):
    device = _require(backend, dtype, d)
    hq, hkv = _heads(heads)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(b, hq, hkv, nq, nk, d, dtype, device, gen, q_scale)
    go = randn((b, hq, nq, d), dtype, device, gen)
    gl = randn((b, hq, nq), torch.float32, device, gen) if lse_grad else None
    grads = _ours(q, k, v, go, gl, causal=causal, backend=backend, deterministic=deterministic)
    what = (f"{backend} B={b} H={hq}/{hkv} Nq={nq} Nk={nk} D={d} {DT[dtype]} causal={causal}"
            f"{' +lse' if lse_grad else ''}")
    _check(grads, q, k, v, go, gl, causal, None, nk - nq, seed, what)
    return grads


def _missing_pairs(grid, domains) -> list:
    """(i, j, a, b): value pairs of dimensions i and j that no case of the grid has."""
    missing = []
    for i, j in itertools.combinations(range(len(domains)), 2):
        seen = {(c[i], c[j]) for c in grid}
        missing += [(i, j, a, b) for a in domains[i] for b in domains[j] if (a, b) not in seen]
    return missing


# -- the reduced grid: runs everywhere (CI under TRITON_INTERPRET=1, and on the GPU) ---------------
# Tiny shapes (one row and key; decode-like; Nq > Nk, which with causal leaves rows that see no
# key; ragged tiles both ways), odd head dims (59: masked loads), all dtypes and head layouts.
CPU_SHAPES = [(1, 1), (3, 17), (17, 3), (33, 40)]
CPU_HEAD_DIMS = [16, 32, 40, 59]


def cpu_grid() -> list[tuple]:
    """(shape, D, dtype, causal, layout): every (shape, dtype, causal), D and layout cycling so that
    every pair of the five dimensions appears (test_grids_cover_every_pair)."""
    layouts = list(HEADS)
    return [(shape, CPU_HEAD_DIMS[(si + ti + 2 * c) % 4], dt, c, layouts[(si + 2 * ti + c) % 3])
            for si, shape in enumerate(CPU_SHAPES) for ti, dt in enumerate(DTYPES) for c in (False, True)]


CPU_CASES = [pytest.param(s, d, dt, c, h, id=_id(f"{s[0]}x{s[1]}", d, dt, c, h), marks=_group(dt, d))
             for s, d, dt, c, h in cpu_grid()]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,d,dtype,causal,heads", CPU_CASES)
def test_gradients(backend, shape, d, dtype, causal, heads, seed):
    _on_this_device(backend)
    _case(backend, 2, heads, *shape, d, dtype, causal, seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
@pytest.mark.parametrize("shape,causal", [((33, 40), False), ((17, 3), True)], ids=["33x40", "17x3-causal"])
def test_lse_gradient(backend, dtype, shape, causal, seed):
    """return_lse=True and a loss that uses out and lse (random weights on both): d lse_i/d s_ij =
    P_ij enters through delta. 17x3 causal: rows that see no key have lse -inf and a gradient for
    it, which must change nothing."""
    _on_this_device(backend)
    _case(backend, 2, "gqa", *shape, 32, dtype, causal, seed, lse_grad=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
def test_rows_that_see_no_key(backend, dtype, seed):
    """Causal with Nq > Nk: the first Nq − Nk rows see nothing. Their dq is exactly 0 (_check) and
    they add nothing to dk, dv: changing their q, grad_out and lse gradient leaves dk, dv bitwise
    unchanged."""
    _on_this_device(backend)
    d = 32
    device = _require(backend, dtype, d)
    nq, nk = 40, 7
    blind = nq - nk
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 4, 1, nq, nk, d, dtype, device, gen)
    go = randn((2, 4, nq, d), dtype, device, gen)
    gl = randn((2, 4, nq), torch.float32, device, gen)
    grads = _ours(q, k, v, go, gl, causal=True, backend=backend)
    _check(grads, q, k, v, go, gl, True, None, nk - nq, seed, f"{backend} {DT[dtype]} Nq > Nk")
    q2, go2, gl2 = q.clone(), go.clone(), gl.clone()
    q2[:, :, :blind] *= 100
    go2[:, :, :blind] = randn((2, 4, blind, d), dtype, device, gen, 1e3)
    gl2[:, :, :blind] = 1e6
    grads2 = _ours(q2, k, v, go2, gl2, causal=True, backend=backend)
    for name, a, b in zip(("dk", "dv"), grads[1:], grads2[1:]):
        assert torch.equal(a, b), f"[{backend} seed={seed}] rows that see no key changed {name}"
    assert torch.equal(grads[0][:, :, blind:], grads2[0][:, :, blind:])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lse_grad", [False, True], ids=["out", "out+lse"])
def test_no_keys(backend, causal, lse_grad, seed):
    """Nk = 0: every row is empty; dq is zeros (no NaN), dk and dv are empty."""
    _on_this_device(backend)
    device = _require(backend)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 4, 2, 9, 0, 32, torch.float16, device, gen)
    go = randn(q.shape, torch.float16, device, gen)
    gl = randn(q.shape[:3], torch.float32, device, gen) if lse_grad else None
    dq, dk, dv = _ours(q, k, v, go, gl, causal=causal, backend=backend)
    assert torch.equal(dq.cpu(), torch.zeros(q.shape, dtype=q.dtype))
    assert dk.shape == k.shape and dv.shape == v.shape and dq.dtype == dk.dtype == dv.dtype == q.dtype


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("used", ["out", "lse"])
def test_loss_through_one_output(backend, used, seed):
    """return_lse=True and a loss that reaches only out, or only lse: the unused output's gradient
    comes to the backward as None (no zeros materialized), which must give exactly the gradients of
    the same loss with an explicit zero gradient for that output (deterministic: the same kernels,
    no atomics)."""
    _on_this_device(backend)
    device = _require(backend)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 6, 2, 17, 23, 32, torch.bfloat16, device, gen)
    go = randn(q.shape, torch.bfloat16, device, gen)
    gl = randn(q.shape[:3], torch.float32, device, gen)
    zero_go, zero_gl = torch.zeros_like(go), torch.zeros_like(gl)
    qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = ta.attention(qs, ks, vs, causal=True, return_lse=True, backend=backend, deterministic=True)
    one = torch.autograd.grad(out if used == "out" else lse, (qs, ks, vs), go if used == "out" else gl)
    explicit = _ours(q, k, v, go if used == "out" else zero_go, zero_gl if used == "out" else gl,
                     causal=True, backend=backend, deterministic=True)
    for a, b, name in zip(one, explicit, "qkv"):
        assert not torch.isnan(a).any(), f"d{name}"
        assert torch.equal(a, b), f"d{name}: the loss through {used} alone differs from an explicit zero gradient"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_no_queries(backend, causal, seed):
    """Nq = 0: dq is empty, dk and dv are zeros (no NaN)."""
    _on_this_device(backend)
    device = _require(backend)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 4, 2, 0, 11, 32, torch.bfloat16, device, gen)
    go = torch.empty(q.shape, dtype=q.dtype, device=device)
    dq, dk, dv = _ours(q, k, v, go, torch.empty(q.shape[:3], device=device), causal=causal, backend=backend)
    assert dq.shape == q.shape
    for g, t in ((dk, k), (dv, v)):
        assert torch.equal(g.cpu(), torch.zeros(t.shape, dtype=t.dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DT.get)
def test_gradients_rounded_to_nearest(backend, dtype, seed):
    """One query and one key (P = 1 up to the recompute's ~1e-6), MQA with 4 query heads: dV is the
    sum of 4 grad_out rows, exact in the float32 accumulator, so the stored dV must be that sum
    rounded to the nearest 16-bit value: within half an ulp (and 1e-5 relative for P), where a
    truncating conversion (the interpreter's float32 → bfloat16 store) is off by up to one ulp."""
    _on_this_device(backend)
    d = 64
    device = _require(backend, dtype, d)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 4, 1, 1, 1, d, dtype, device, gen)
    go = randn(q.shape, dtype, device, gen)
    dv = _ours(q, k, v, go, causal=True, backend=backend)[2].double().cpu()
    exact = go.double().cpu().sum(1, keepdim=True)
    mant = 7 if dtype == torch.bfloat16 else 10
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2.0**-14))) - mant)
    err = (dv - exact).abs()
    bound = 0.5 * ulp + 1e-5 * exact.abs()
    assert bool((err <= bound).all()), (f"[{backend} {DT[dtype]} seed={seed}] dV not rounded to nearest: "
                                        f"{int((err > bound).sum())} of {err.numel()} elements off by up to "
                                        f"{(err / ulp).max().item():.2f} ulp")


# -- strides ---------------------------------------------------------------------------------------
def _views(layout, base, d):
    """q, k, v as views of `base` (one tensor, the leaf that autograd fills): transposed (B, N, H, D)
    tensors, the slices of a packed GQA qkv projection (B, N, Hq + 2·Hkv, D), or D not innermost."""
    if layout == "bnhd":  # base (3, B, N, H, D)
        return base[0].transpose(1, 2), base[1, :, :19].transpose(1, 2), base[2, :, :19].transpose(1, 2)
    if layout == "packed":  # base (B, N, 4 + 1 + 1, D)
        q, k, v = base.split([4, 1, 1], dim=2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    # base (3, B, D, H, N) viewed as (B, H, N, D)
    return base[0].permute(0, 2, 3, 1), base[1, ..., :23].permute(0, 2, 3, 1), base[2, ..., :23].permute(0, 2, 3, 1)


BASES = {"bnhd": lambda d: (3, 2, 21, 2, d), "packed": lambda d: (2, 25, 6, d), "d_strided": lambda d: (3, 2, d, 2, 29)}
# grad_out: "expanded" is what out.sum().backward() hands (stride 0); "float32" a float32 loss's
# gradient (autograd hands the backward another dtype); "bnhd" a transposed (B, N, H, D) tensor.
STRIDE_CASES = [("bnhd", "contiguous"), ("packed", "expanded"), ("packed", "bnhd"), ("d_strided", "float32"),
                ("bnhd", "expanded")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout,grad_kind", STRIDE_CASES, ids=[f"{a}-{b}" for a, b in STRIDE_CASES])
@pytest.mark.parametrize("causal", [False, True])
def test_non_contiguous(backend, layout, grad_kind, causal, seed):
    """Strided q, k, v that are views of one leaf (transposed (B, N, H, D) tensors, the slices of
    a packed qkv projection, D not innermost), with strided grad_outs; the gradients reach the
    leaf through the views."""
    _on_this_device(backend)
    dtype, d = torch.bfloat16, 32
    device = _require(backend, dtype, d)
    gen = torch.Generator().manual_seed(seed)
    base = randn(BASES[layout](d), dtype, device, gen).requires_grad_()
    q, k, v = _views(layout, base, d)
    assert not (q.is_contiguous() or k.is_contiguous())
    out = ta.attention(q, k, v, causal=causal, backend=backend)
    if grad_kind == "expanded":
        out.sum().backward()
        go = torch.ones_like(out)
    elif grad_kind == "float32":
        w = randn(out.shape, torch.float32, device, gen)
        (out.float() * w).sum().backward()
        go = w.to(dtype)  # what the backward sees: the float32 gradient cast to the input dtype
    else:
        go = randn(out.shape, dtype, device, gen)
        if grad_kind == "bnhd":
            go = go.transpose(1, 2).contiguous().transpose(1, 2)
        out.backward(go)
    grads = _views(layout, base.grad, d)
    q, k, v = (t.detach() for t in (q, k, v))
    _check(grads, q, k, v, go, None, causal, None, k.shape[2] - q.shape[2], seed, f"{backend} {layout} "
           f"grad_out {grad_kind} causal={causal}")
    if layout != "packed":  # the parts of the leaf no view covers get no gradient
        covered = torch.zeros(base.shape, dtype=torch.bool, device=device)
        for t in _views(layout, covered, d):
            t.fill_(True)
        assert bool((base.grad[~covered] == 0).all())


# -- large magnitudes ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
@pytest.mark.parametrize("causal", [False, True])
def test_large_scores(backend, dtype, causal, seed):
    """Scores up to ±1e4 (q ~ 2500·N(0, 1)): P is nearly one-hot, exp2 of big differences
    underflows, dS is tiny next to the scores."""
    _on_this_device(backend)
    _large_scores(backend, dtype, causal, seed)


def _large_scores(backend, dtype, causal, seed):
    _case(backend, 2, "gqa", 33, 40, 32, dtype, causal, seed, q_scale=2500.0, lse_grad=causal)


# Seeds that failed test_large_scores (DESIGN §4: a seed that ever fails becomes a named case).
# H200, 2026-11-26, fresh seeds: triton fp16 not causal, dk 4.72 against torch's 1.15 (the rule's
# bound 2.29) at q ~ 2500·N(0, 1); bf16, causal and the CPU interpreter passed. The kernels ran were
# the dense path unchanged since session 7. benchmarks/probe_bwd_large_scores.py (H200) feeds the
# backward kernels other (out, lse): the float64 reference's lse changes nothing (dk 4.72), its out
# rounded once to fp16 passes (dk 0.99). So it is the forward's fp16 O (max error 9.8e-4, a half
# ulp there, against 8.1e-4 on the CPU) through delta = rowsum(dO·O): at |scores| ~ 1e4 P is near
# one-hot, dP − delta cancels, and dK = scale·dSᵀ·Q multiplies what is left by |Q| ~ 1e4. Open in
# issue #13; strict xfail on the GPU, so the fix must remove the mark.
_LARGE_SCORE_SEEDS = [pytest.param(
    "triton", torch.float16, False, 552450262, id="triton-fp16-False-552450262",
    marks=pytest.mark.xfail(GPU_GRID, strict=True, reason="issue #13: delta from the forward's fp16 O at "
                                                            "|scores| ~ 1e4 (2026-11-26, H200)"))]


@pytest.mark.parametrize("backend,dtype,causal,case_seed", _LARGE_SCORE_SEEDS)
def test_large_scores_named_seeds(backend, dtype, causal, case_seed):
    _on_this_device(backend)
    _large_scores(backend, dtype, causal, case_seed)


def _very_negative(backend, dtype, seed, d=32):
    """Every score of a row near −3000 (keys along one direction, queries against it): lse ≈ −500,
    so exp(s − lse) of anything that is not a score (a padded key of a ragged tile) overflows."""
    device = _require(backend, dtype, d)
    gen = torch.Generator().manual_seed(seed)
    u = torch.full((d,), 1 / math.sqrt(d), dtype=torch.float64)
    q = (-3000 * u + 0.5 * torch.randn(2, 4, 9, d, generator=gen, dtype=torch.float64)).to(dtype).to(device)
    k = (u + 0.05 * torch.randn(2, 2, 37, d, generator=gen, dtype=torch.float64)).to(dtype).to(device)
    v = randn((2, 2, 37, d), dtype, device, gen)
    go = randn(q.shape, dtype, device, gen)
    grads = _ours(q, k, v, go, causal=False, backend=backend)
    _check(grads, q, k, v, go, None, False, None, 28, seed, f"{backend} {DT[dtype]} D={d} very negative scores")


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_scores_very_negative(backend, seed):
    """Rows whose every score is near −3000 (lse ≈ −500), Nk = 37 (a ragged last key tile): the
    gradients stay finite and meet the rule."""
    _on_this_device(backend)
    _very_negative(backend, torch.float16, seed)


# -- the kernels' own paths: tile shapes, causal offsets, the atomic dQ mode, strided outputs ------
def _force_rows(monkeypatch, dkdv: dict | None = None, dq: dict | None = None, mode: str | None = None):
    """Make the Triton backward plan with these tiles (and dQ mode) whatever the device's rows."""
    from tiled_attn.triton import attention_backward as tb
    real = tb.config

    def config(kernel, device, dtype, d, arch=None):
        row = dict(real(kernel, device, dtype, d, arch))
        row.update({"dkdv": dkdv, "dq": dq}[kernel] or {})
        if mode is not None:
            row["dq"] = mode
        return row

    monkeypatch.setattr(tb, "config", config)


# Preallocated gradient layouts for the kernel entry point: (buffer shape, the (B, H, N, D) view of
# it) for a (B, H, N, D) shape s. dq: (B, N, H, D) rows with a gap of 3; dk: D outermost (stride
# N + 2, N innermost); dv: every other element of its rows (D stride 2). Every stride differs.
OUT_LAYOUTS = [
    (lambda s: (s[0], s[2], s[1], s[3] + 3), lambda buf, s: buf[..., :s[3]].transpose(1, 2)),
    (lambda s: (s[0], s[1], s[3], s[2] + 2), lambda buf, s: buf[..., :s[2]].transpose(-1, -2)),
    (lambda s: (s[0], s[1], s[2], 2 * s[3]), lambda buf, s: buf[..., ::2]),
]


def _strided_output(t: torch.Tensor, i: int):
    """(buffer, view, covered): a NaN-filled buffer, the strided view of t's shape in it that
    OUT_LAYOUTS[i] gives, and the buffer's elements the view covers."""
    shape_of, view_of = OUT_LAYOUTS[i]
    buf = torch.full(shape_of(t.shape), float("nan"), dtype=t.dtype, device=t.device)
    covered = torch.zeros(buf.shape, dtype=torch.bool, device=t.device)
    view_of(covered, t.shape).fill_(True)
    return buf, view_of(buf, t.shape), covered


_SMALL = {"num_warps": 4, "num_stages": 1}
# The second set walks dK/dV's causal keys in one loop that masks every step ("band": False).
TILES = {"16x32/32x16": ({"BLOCK_M": 16, "BLOCK_N": 32, **_SMALL}, {"BLOCK_M": 32, "BLOCK_N": 16, **_SMALL}),
         "32x16/16x32-noband": ({"BLOCK_M": 32, "BLOCK_N": 16, "band": False, **_SMALL},
                                {"BLOCK_M": 16, "BLOCK_N": 32, **_SMALL})}
KERNEL_CASES = [pytest.param(t, o, m, DTYPES[i % 3], id=_id(t, o, m, DTYPES[i % 3]))
                for i, (t, o, m) in enumerate(itertools.product(TILES, [-20, 0, 1, 37], ["pass", "atomic"]))]


@pytest.mark.parametrize("tiles,offset,mode,dtype", KERNEL_CASES)
def test_kernel_tiles_and_offsets(tiles, offset, mode, dtype, monkeypatch, seed):
    """attention_backward (the kernel entry point) with small tiles (several query and key tiles,
    BLOCK_M < BLOCK_N and >, a diagonal band, ragged last tiles), an arbitrary causal offset (-20:
    20 rows see nothing; 0: torch's top-left; 1: a key tile's first row-block boundary falls one
    row before the band; 37: the band crosses Nk), both dQ modes, every dtype, into preallocated
    outputs of three different stride patterns (OUT_LAYOUTS): every element of each view is
    written, nothing outside it."""
    device = _require("triton", dtype)
    from tiled_attn.triton.attention_backward import attention_backward
    _force_rows(monkeypatch, *TILES[tiles], mode=mode)
    d, scale = 40, 0.2
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(1, 4, 2, 45, 70, d, dtype, device, gen)
    go = randn(q.shape, dtype, device, gen)
    gl = randn(q.shape[:3], torch.float32, device, gen) if offset in (0, 1) else None
    out, lse = _attention_op(q, k, v, scale, True, offset, "torch")
    bufs, views, covered = zip(*(_strided_output(t, i) for i, t in enumerate((q, k, v))))
    attention_backward(q, k, v, out, lse, go, *views, scale, True, offset, grad_lse=gl)
    what = f"kernel {tiles} offset={offset} dq={mode} {DT[dtype]}"
    _check(views, q, k, v, go, gl, True, scale, offset, seed, what)
    for name, buf, cov in zip(("dq", "dk", "dv"), bufs, covered):
        assert bool(buf[~cov].isnan().all()), f"[{what}] {name} written outside its view"


@pytest.mark.parametrize("kernel", ["dkdv", "dq"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DT.get)
def test_interpreter_runs_the_cpu_rows(kernel, dtype):
    """Under the interpreter the 16-bit backward plans from configs.TRITON_ATTENTION_BACKWARD's
    "cpu" rows (small tiles: several key and query tiles at the CPU tests' shapes), not the GPU's
    (dK/dV tiles of 128 keys: one tile, so the CPU tests would not see the multi-tile paths).
    float32 has its own small "any" rows, which the lookup may prefer."""
    if not INTERPRET or HAS_CUDA:
        pytest.skip("the interpreter's rows (CPU tensors under TRITON_INTERPRET=1)")
    from tiled_attn import configs
    from tiled_attn.triton import attention_backward as tb
    rows = [{**configs.TRITON_ATTENTION_BACKWARD_DEFAULTS, **row}
            for key, row in configs.TRITON_ATTENTION_BACKWARD.items() if key[0] == kernel and key[1] == "cpu"]
    if not rows:
        pytest.skip("configs has no 'cpu' rows for the backward")
    for d in CPU_HEAD_DIMS + [64, 128, 256]:
        row = tb.config(kernel, torch.device("cpu"), dtype, d)
        assert row in rows, f"D={d} {DT[dtype]}: the interpreter plans {row}, not a 'cpu' row {rows}"


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
def test_atomic_dq_mode(backend, dtype, monkeypatch, seed):
    """The atomic dQ mode (a config row's "dq": "atomic": dS·K added into a float32 accumulator
    by the dK/dV kernel) through ta.attention meets the rule, with lse's gradient, and with rows
    whose lse is very negative against a ragged last key tile."""
    device = _require(backend, dtype, 64)
    from tiled_attn.triton import attention_backward as tb
    _force_rows(monkeypatch, mode="atomic")
    assert tb.dq_mode(torch.empty(1, 1, 1, 64, dtype=dtype, device=device), False) == "atomic"
    _case(backend, 2, "gqa", 33, 40, 64, dtype, True, seed, lse_grad=True)
    _very_negative(backend, dtype, seed, d=64)


# -- determinism -----------------------------------------------------------------------------------
def _dq_mode(q, deterministic: bool) -> str:
    from tiled_attn.triton import attention_backward as tb
    return tb.dq_mode(q, deterministic)


def _wgmma_backward(q, backend, deterministic: bool) -> bool:
    """Whether backend "cuda" runs its wgmma backward for q's signature (dQ by float32 atomics)."""
    if backend != "cuda" or deterministic or q.device.type != "cuda":
        return False
    from tiled_attn.cuda import attention_backward as cb
    return cb.covers(q, q, q, q, q, q, q, q, deterministic, None)


def _dq_atomic(q, backend, deterministic: bool) -> bool:
    return backend != "torch" and (_dq_mode(q, deterministic) == "atomic" or _wgmma_backward(q, backend, deterministic))


def _assert_repeatable(runs, q, backend, deterministic, what):
    """Every run's dq, dk, dv bitwise equal to the first's. dK/dV are always written by one program
    each; dq only without the atomic mode (the default may take it where the config row says, and
    backend "cuda"'s wgmma backward always does)."""
    atomic = _dq_atomic(q, backend, deterministic)
    for run in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], run):
            if name == "dq" and atomic:
                continue
            assert torch.equal(a, b), f"[{what}] {name} differs between two runs " \
                                      f"({int((a != b).sum())} elements)"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "default"])
def test_deterministic(backend, deterministic, seed):
    """Two backward runs give bitwise-identical gradients (GQA, causal, lse's gradient too)."""
    _on_this_device(backend)
    dtype, d = torch.bfloat16, 40
    device = _require(backend, dtype, d)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(1, 4, 2, 33, 40, d, dtype, device, gen)
    go, gl = randn(q.shape, dtype, device, gen), randn(q.shape[:3], torch.float32, device, gen)
    runs = [_ours(q, k, v, go, gl, causal=True, backend=backend, deterministic=deterministic) for _ in range(2)]
    _assert_repeatable(runs, q, backend, deterministic, f"{backend} deterministic={deterministic}")


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_deterministic_takes_the_dq_pass(backend, monkeypatch):
    """deterministic=True plans dQ as its own pass even where the config row says "atomic", and
    launches no atomic kernel; the default follows the row."""
    device = _require(backend, torch.float16, 64)
    from tiled_attn.triton import attention_backward as tb
    _force_rows(monkeypatch, mode="atomic")
    made = []
    real = tb.Launch

    def launch(kernel, grid, meta, dev):
        made.append((getattr(kernel, "fn", kernel).__name__, meta.get("ATOMIC_DQ")))
        return real(kernel, grid, meta, dev)

    monkeypatch.setattr(tb, "Launch", launch)
    q, k, v = (torch.randn(1, 2, 20, 64, dtype=torch.float16, device=device, requires_grad=True) for _ in range(3))
    for deterministic in (True, False):
        made.clear()
        ta.attention(q, k, v, causal=True, backend=backend, deterministic=deterministic).sum().backward()
        names = {n for n, _ in made}
        if deterministic:
            assert "attention_bwd_dq_kernel" in names and "attention_bwd_dq_store_kernel" not in names, made
            assert all(a in (None, False) for _, a in made), made
        else:
            assert "attention_bwd_dq_store_kernel" in names and "attention_bwd_dq_kernel" not in names, made
            assert any(a is True for _, a in made), made


# -- float64 gradcheck (the torch backend: reference.blockwise_attention_backward) -----------------
GRADCHECK_CASES = [(1, 1, False, (1, 1)), (4, 6, False, (3, 1)), (5, 5, True, (2, 2)), (3, 7, True, (4, 2)),
                   (7, 3, True, (2, 1))]


@pytest.mark.parametrize("nq,nk,causal,heads", GRADCHECK_CASES,
                         ids=[f"{a}x{b}-causal={c}-{h[0]}/{h[1]}" for a, b, c, h in GRADCHECK_CASES])
@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "out+lse"])
def test_gradcheck(nq, nk, causal, heads, with_lse, seed):
    """torch.autograd.gradcheck in float64 of ta.attention(backend="torch"), whose backward is
    reference.blockwise_attention_backward (block_n smaller than Nk through the op is not
    reachable: the blocks are covered by test_reference_backward_blocks). 7x3 causal: rows that
    see no key (lse −inf, compared as 0)."""
    gen = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    q, k, v = (randn(s, torch.float64, "cpu", gen).requires_grad_()
               for s in ((2, hq, nq, 5), (2, hkv, nk, 5), (2, hkv, nk, 5)))

    def f(q, k, v):
        if not with_lse:
            return ta.attention(q, k, v, causal=causal, scale=0.7, backend="torch")
        out, lse = ta.attention(q, k, v, causal=causal, scale=0.7, return_lse=True, backend="torch")
        return out, torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)

    assert torch.autograd.gradcheck(f, (q, k, v), atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_backward_blocks(causal, seed):
    """reference.blockwise_attention_backward over several key blocks (block_n = 4 < Nk) equals
    float64 autograd through reference.attention, GQA with a gradient of lse, rows that see no
    key included (Nq > Nk)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 6, 2, 13, 10, 8, torch.float64, "cpu", gen)
    go, gl = randn(q.shape, torch.float64, "cpu", gen), randn(q.shape[:3], torch.float64, "cpu", gen)
    out, lse = reference.attention(q, k, v, causal, 0.4, True)
    got = reference.blockwise_attention_backward(q, k, v, out, lse, go, gl, causal, 0.4, block_n=4)
    ref = _reference(q, k, v, go, gl, causal, 0.4, None)
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_backward_is_never_silently_wrong(backend, seed):
    """A second-order gradient through the backward (create_graph=True, e.g. a gradient penalty)
    either raises (once_differentiable) or equals float64 autograd through reference.attention:
    never a silently wrong answer (DESIGN §5). The backward treats the saved out and lse as
    constants, so anything it records for a double backward misses their dependence on q, k, v."""
    _on_this_device(backend)
    device = _require(backend, torch.float32, 16)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 1, 6, 9, 16, torch.float32, device, gen))
    go, w = randn(q.shape, torch.float32, device, gen), randn(q.shape, torch.float32, device, gen)
    out = ta.attention(q, k, v, causal=True, backend=backend)
    try:
        (dq,) = torch.autograd.grad(out, q, go, create_graph=True)
        got = torch.autograd.grad((dq * w).sum() + 0 * (q.sum() + k.sum() + v.sum()), (q, k, v))
    except RuntimeError:
        return  # refused: fine
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    (dq64,) = torch.autograd.grad(reference.attention(q64, k64, v64, True), q64, go.double(), create_graph=True)
    ref = torch.autograd.grad((dq64 * w.double()).sum(), (q64, k64, v64))
    for name, a, b in zip(("d2q", "d2k", "d2v"), got, ref):
        torch.testing.assert_close(a.double().cpu(), b.cpu(), rtol=1e-3, atol=1e-4,
                                   msg=lambda m: f"{backend}: second-order {name} is wrong and nothing raised: {m}")


# -- which backward ran ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_calls(backend, backward_calls, kernel_calls, seed):
    """Our backward ran, once, for the backend the forward ran (cuda: the Triton kernels, named
    "cuda"); a forward that needs no gradient plans no backward."""
    device = _require(backend, torch.float16, 32)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (t.requires_grad_() for t in _qkv(1, 4, 2, 20, 30, 32, torch.float16, device, gen))
    with torch.no_grad():
        ta.attention(q, k, v, backend=backend)
    out = ta.attention(q, k, v, causal=True, backend=backend)
    assert backward_calls == []
    out.backward(randn(out.shape, torch.float16, device, gen))
    assert kernel_calls == [backend, backend] and backward_calls == [backend]
    assert all(t.grad is not None and bool(t.grad.isfinite().all()) for t in (q, k, v))


def test_backward_calls_default_backend(backward_calls, kernel_calls, seed):
    """backend=None: on a CUDA device the Triton backward; on the CPU torch's SDPA autograd where
    it computes the same (no backward of ours), the torch backend's where it does not (return_lse,
    rows that see no key)."""
    device = "cuda" if HAS_CUDA else "cpu"
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 2, 12, 9, 32, torch.float32, device, gen))
    ta.attention(q, k, v).sum().backward()
    expected = ["triton"] if device == "cuda" else []
    assert backward_calls == expected
    backward_calls.clear()
    ta.attention(q, k, v, return_lse=True)[1].sum().backward()  # only lse in the loss
    ta.attention(q, k, v, causal=True).sum().backward()          # Nq > Nk: 3 rows see no key
    assert backward_calls == (["triton"] * 2 if device == "cuda" else ["torch"] * 2)


# -- bad input (everything else is the forward's validation, tests/test_attention.py) -------------
@pytest.mark.parametrize("value", [1, 0, "True", None, 1.0, torch.tensor(True)],
                         ids=["1", "0", "str", "None", "float", "tensor"])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_deterministic_must_be_bool(value, requires_grad):
    q = torch.zeros(1, 1, 2, 8, requires_grad=requires_grad)
    with pytest.raises(TypeError, match=f"deterministic must be a bool, got {type(value).__name__}"):
        ta.attention(q, q, q, deterministic=value, backend="torch")


# -- what autograd saves ---------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_saves_no_n_by_n_tensor(backend):
    """The forward saves q, k, v, out and lse for the backward: nothing of Nq × Nk."""
    _on_this_device(backend)
    device = _require(backend, torch.float16, 16)
    q = torch.randn(1, 2, 128, 16, dtype=torch.float16, device=device, requires_grad=True)
    k, v = (torch.randn(1, 1, 128, 16, dtype=torch.float16, device=device, requires_grad=True) for _ in range(2))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, lse = ta.attention(q, k, v, causal=True, return_lse=True, backend=backend)
    assert saved and max(saved) <= q.numel() < 128 * 128, saved
    (out.float().sum() + lse.sum()).backward()


# -- GPU grid: every pair of dimensions, kernel backends only --------------------------------------
GPU_SHAPES = [(1, 239), (3, 799), (113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256),
              (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048)]
GPU_HEAD_DIMS = [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256]


def gpu_grid() -> list[tuple]:
    """(shape, D, causal, dtype, layout) for every (shape, D, causal) of issue #13's flash-attn grid;
    dtype and layout cycle with the shape and D indices ((s + d + causal) mod 3, (s + 2d) mod 3),
    so that every pair of the five dimensions appears (test_grids_cover_every_pair)."""
    layouts = list(HEADS)
    return [(shape, d, causal, DTYPES[(si + di + causal) % 3], layouts[(si + 2 * di) % 3])
            for si, shape in enumerate(GPU_SHAPES) for di, d in enumerate(GPU_HEAD_DIMS) for causal in (False, True)]


def test_grids_cover_every_pair():
    """Every value pair of any two of the five dimensions is in the GPU grid (each (shape, D,
    causal) exactly once) and in the CPU grid (each (shape, dtype, causal) exactly once)."""
    grid = gpu_grid()
    assert len(grid) == len(GPU_SHAPES) * len(GPU_HEAD_DIMS) * 2 == len({c[:3] for c in grid})
    missing = _missing_pairs(grid, [GPU_SHAPES, GPU_HEAD_DIMS, [False, True], list(DTYPES), list(HEADS)])
    assert not missing, f"GPU grid: pairs {missing[:5]} never appear"
    grid = cpu_grid()
    assert len(grid) == len(CPU_SHAPES) * len(DTYPES) * 2 == len({(c[0], c[2], c[3]) for c in grid})
    missing = _missing_pairs(grid, [CPU_SHAPES, CPU_HEAD_DIMS, list(DTYPES), [False, True], list(HEADS)])
    assert not missing, f"CPU grid: pairs {missing[:5]} never appear"


def _gpu_grid_params():
    if not GPU_GRID:
        return [pytest.param(None, None, None, None, None, id="gpu-grid",
                             marks=pytest.mark.skip(reason="the GPU grid runs on a CUDA device"))]
    return [pytest.param(s, d, c, h, dt, id=_id(f"{s[0]}x{s[1]}", d, c, h, dt),
                         marks=[pytest.mark.gpu, *_group(dt, d)])
            for s, d, c, dt, h in gpu_grid()]


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("shape,d,causal,heads,dtype", _gpu_grid_params())
def test_gpu_grid(backend, shape, d, causal, heads, dtype, seed):
    _case(backend, 2, heads, *shape, d, dtype, causal, seed, lse_grad=causal and d % 2 == 1)


def _wgmma_inputs(b, hq, hkv, nq, nk, d, dtype, seed):
    """(q, k, v, dO, generator) on the GPU for a wgmma backward test; skips where that kernel does not
    run (not an sm90 device, or the extension lacks it)."""
    device = _require("cuda", dtype, d)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(b, hq, hkv, nq, nk, d, dtype, device, gen)
    if not _wgmma_backward(q, "cuda", False):
        pytest.skip("no wgmma backward here (not an sm90 device, or the extension lacks it)")
    return q, k, v, randn(q.shape, dtype, device, gen), gen


def _cuda_kernels(fn):
    """(fn(), the names of the CUDA kernels it ran), by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    return result, [e.name for e in prof.events()]


# backend "cuda"'s wgmma backward (csrc/attention/sm90/flash_bwd_sm90_kernel.cuh): the profiler shows it
# ran (and not the Triton dK/dV kernel) and the gradients meet the rule; ragged tiles both ways, one
# row, Nq > Nk (rows that see no key), several query tiles per key tile, GQA and MQA groups.
WGMMA_BWD_CASES = [((1, 1), False, "mha"), ((113, 203), True, "gqa"), ((128, 217), False, "mqa"),
                   ((150, 70), True, "gqa"), ((1023, 1024), True, "mha"), ((2048, 2048), False, "gqa"),
                   ((64, 2000), True, "mqa"), ((300, 130), False, "mha")]


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="the wgmma backward runs on an H100")
@pytest.mark.parametrize("d,block_m", [(64, 64), (64, 128), (128, 64)], ids=["d64-bm64", "d64-bm128", "d128-bm64"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DT.get)
@pytest.mark.parametrize("shape,causal,heads", WGMMA_BWD_CASES,
                         ids=[_id(f"{s[0]}x{s[1]}", c, h) for s, c, h in WGMMA_BWD_CASES])
def test_wgmma_backward(shape, causal, heads, dtype, d, block_m, monkeypatch, seed):
    """Each tile the kernel instantiates (configs.CUDA_ATTENTION_BACKWARD's block_m, forced here)."""
    from tiled_attn import configs
    monkeypatch.setitem(configs.CUDA_ATTENTION_BACKWARD, ("sm90", d), {"kernel": "wgmma", "block_m": block_m})
    hq, hkv = _heads(heads)
    q, k, v, go, gen = _wgmma_inputs(2, hq, hkv, *shape, d, dtype, seed)
    gl = randn((2, hq, shape[0]), torch.float32, q.device, gen) if causal else None
    grads, names = _cuda_kernels(lambda: _ours(q, k, v, go, gl, causal=causal, backend="cuda"))
    assert any("flash_bwd_sm90_kernel" in n for n in names), f"the wgmma backward did not run: {sorted(set(names))}"
    assert not any("attention_bwd_dkdv" in n for n in names), "the Triton dK/dV kernel ran too"
    what = f"cuda-wgmma bm={block_m} B=2 H={hq}/{hkv} Nq={shape[0]} Nk={shape[1]} D={d} {DT[dtype]} causal={causal}"
    _check(grads, q, k, v, go, gl, causal, None, shape[1] - shape[0], seed, what)


# (kv_split, longest_first) forced on the wgmma backward (tiled_attn/cuda/attention_backward.py
# `schedule`): the GQA group split among CTAs (float32 partial dK / dV summed by the finish kernel) and
# the key-tile-major launch order, alone and together.
WGMMA_SCHEDULES = [(1, True), (2, False), (2, True), (4, True)]


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="the wgmma backward runs on an H100")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("split,longest_first", WGMMA_SCHEDULES, ids=[f"split{s}-{'lf' if f else 'x'}"
                                                                      for s, f in WGMMA_SCHEDULES])
def test_wgmma_backward_schedules(split, longest_first, d, monkeypatch, seed):
    """B = 2, Hq = 8 over Hkv = 2, Nq = 300 against Nk = 517 (bottom-right causal, ragged tiles both
    ways) and a non-causal call, each schedule forced: the gradients meet the rule, the finish kernel
    ran exactly when the group is split, and dK / dV are bitwise the same in a second run (the
    partials summed in a fixed order)."""
    from tiled_attn.cuda import attention_backward as cb
    q, k, v, go, _ = _wgmma_inputs(2, 8, 2, 300, 517, d, torch.bfloat16, seed)
    monkeypatch.setattr(cb, "schedule", lambda *args: (split, longest_first))
    for causal in (True, False):
        grads, names = _cuda_kernels(lambda: _ours(q, k, v, go, causal=causal, backend="cuda"))
        assert any("flash_bwd_sm90_kernel" in n for n in names), sorted(set(names))
        assert any("attention_bwd_finish_kernel" in n for n in names) == (split > 1), sorted(set(names))
        what = f"cuda-wgmma split={split} longest_first={longest_first} D={d} causal={causal}"
        _check(grads, q, k, v, go, None, causal, None, 517 - 300, seed, what)
        again = _ours(q, k, v, go, causal=causal, backend="cuda")
        for name, a, b in zip(("dk", "dv"), grads[1:], again[1:]):
            assert torch.equal(a, b), f"[{what}] {name} differs between two runs"


def _fast_path_case(q, k, v, go, gen, backend, deterministic, kernel, monkeypatch, seed, what):
    """The C++ path of a planned attention backward (csrc/bindings.cpp attention_bwd_fast): after a
    signature's first call (Python, which registers it) the next calls run through it (counted), their
    gradients meet the rule and dK / dV (all three when deterministic) are bitwise the first call's;
    with poisoned outputs too; a dO off the 16-byte grid (same signature) is declined and the Python
    path runs it instead; with the C++ path off (TILED_ATTN_FAST_LAUNCH=0) none is registered."""
    from tiled_attn import _checks, _plan
    attn = sys.modules["tiled_attn.attention"]
    n_q, n_k = q.shape[2], k.shape[2]

    def call(grad_out):
        return _ours(q, k, v, grad_out, causal=True, backend=backend, deterministic=deterministic)
    same = slice(0 if deterministic else 1, 3)
    first = call(go)
    _check(first, q, k, v, go, None, True, None, n_k - n_q, seed, what + " (first call, Python)")
    assert attn._bwd_fast is not None, f"[{what}] no C++ plan was registered ({attn.fast_backward_refused})"
    fast, ran = attn._bwd_fast, []

    def counted(*args):
        grads = fast(*args)
        ran.append(grads is not None)
        return grads
    monkeypatch.setattr(attn, "_bwd_fast", counted)
    for poison in (False, True):
        monkeypatch.setattr(_checks, "POISON_OUTPUTS", poison)
        grads, names = _cuda_kernels(lambda: call(go))
        assert ran and ran[-1], f"[{what}] the C++ path did not run ({ran}; {attn.fast_backward_refused})"
        assert any(kernel in n for n in names), sorted(set(names))
        _check(grads, q, k, v, go, None, True, None, n_k - n_q, seed, f"{what} poison={poison}")
        for name, a, b in list(zip(("dq", "dk", "dv"), first, grads))[same]:
            assert torch.equal(a, b), f"[{what}] {name} of the C++ path differs from the Python path's"
    monkeypatch.setattr(_checks, "POISON_OUTPUTS", False)
    off = randn((go.numel() + 1,), go.dtype, go.device, gen)[1:].view(go.shape)  # 2 bytes off the grid
    off.copy_(go)
    ran.clear()
    grads = call(off)
    assert ran == [False], f"[{what}] a dO off the 16-byte grid was not declined ({ran})"
    for name, a, b in list(zip(("dq", "dk", "dv"), first, grads))[same]:
        assert torch.equal(a, b), f"[{what}] {name} of the declined call differs"
    _plan.clear_all()
    monkeypatch.setattr(_plan, "FAST_LAUNCH", False)
    ran.clear()
    for _ in range(2):
        call(go)
    assert not ran, f"[{what}] TILED_ATTN_FAST_LAUNCH=0 still took the C++ path"


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="the wgmma backward runs on an H100")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("split", [1, 2])
def test_wgmma_backward_fast_path(split, d, monkeypatch, seed):
    """_fast_path_case for the wgmma backward, its group split or not (the finish kernel or the store)."""
    from tiled_attn.cuda import attention_backward as cb
    monkeypatch.setattr(cb, "schedule", lambda *args: (split, True))
    q, k, v, go, gen = _wgmma_inputs(2, 8, 2, 300, 517, d, torch.bfloat16, seed)
    _fast_path_case(q, k, v, go, gen, "cuda", False, "flash_bwd_sm90_kernel", monkeypatch, seed,
                    f"cuda-wgmma C++ path split={split} D={d}")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="the Triton backward's C++ path runs on a CUDA device")
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=DT.get)
def test_triton_backward_fast_path(deterministic, dtype, monkeypatch, seed):
    """_fast_path_case for the Triton backward: its dQ by atomics where the config says so, or
    (deterministic) by its own pass, every gradient then bitwise the Python path's."""
    device = _require("triton", dtype, 64)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 8, 2, 300, 517, 64, dtype, device, gen)
    go = randn(q.shape, dtype, device, gen)
    _fast_path_case(q, k, v, go, gen, "triton", deterministic, "attention_bwd_dkdv_kernel", monkeypatch, seed,
                    f"triton C++ path {DT[dtype]} deterministic={deterministic}")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="the wgmma backward runs on an H100")
def test_wgmma_backward_splits_a_small_gqa_grid(seed):
    """Unforced, the Llama-3.2-1B training shape (B = 1, 32 / 8 heads, D = 64, N = 2048, causal: 128
    CTAs on an H100's 132 SMs) plans a split group, and its gradients meet the rule."""
    q, k, v, go, _ = _wgmma_inputs(1, 32, 8, 2048, 2048, 64, torch.bfloat16, seed)
    grads, names = _cuda_kernels(lambda: _ours(q, k, v, go, causal=True, backend="cuda"))
    assert any("flash_bwd_sm90_kernel" in n for n in names), sorted(set(names))
    assert any("attention_bwd_finish_kernel" in n for n in names), sorted(set(names))
    _check(grads, q, k, v, go, None, True, None, 0, seed, "cuda-wgmma Llama-1B shape, planned split")


class _FastKernel:
    """A planned launch as register_fast sees it: fast_kernel(entries) gives the kernel tuple with the
    table entries of its leading tensor parameters (two integer parameters after them)."""

    def fast_kernel(self, entries):
        return (1, [1, 1, 1], 128, 0, [8] * len(entries) + [4, 8], [0] * len(entries) + [7, 0],
                list(entries) + [-1, -1])


class _RegisterExt:
    """attention_bwd_fast_register, recording what it was given."""

    def __init__(self):
        self.got = None

    def attention_bwd_fast_register(self, *args):
        self.got = args
        return ("capsule", "")


def _fast_operands(b=1, hq=4, hkv=2, n_q=5, n_k=7, d=64, dtype=torch.bfloat16):
    q, out, go, dq = (torch.randn(b, hq, n_q, d, dtype=dtype) for _ in range(4))
    k, v, dk, dv = (torch.randn(b, hkv, n_k, d, dtype=dtype) for _ in range(4))
    return q, k, v, out, torch.randn(b, hq, n_q), go, dq, dk, dv


@pytest.mark.parametrize("split", [1, 2])
def test_wgmma_fast_registration_table(split):
    """What the wgmma backward's register_fast hands the C++ registration (CPU, the extension mocked):
    the inputs and the per-call allocations in table order, each Triton launch's tensor parameters
    mapped to the table entries its Python call passes (delta: out, grad_out, lse, ws, acc; store:
    acc, dq; finish: acc, dq, partials, dk, dv), and the wgmma step between them writing 4-D views
    of table entries (dk and dv, or the two halves of the float32 partials)."""
    from tiled_attn.cuda import attention_backward as cb
    tensors = _fast_operands()
    q, k, v, out, lse, go, dq, dk, dv = tensors
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    part_shape = None if split == 1 else (2, b, hkv * split, n_k, d)
    run = cb._WgmmaBackward(None, _FastKernel(), _FastKernel(), (b, hq, n_q), b * hq * n_q * d, part_shape,
                            0.125, True, 2, 64, split, False, 0)
    ext = _RegisterExt()
    assert run.register_fast(ext, *tensors) == "capsule"
    inputs, allocs, grads, kernels, wgmma = ext.got
    table = inputs + allocs
    assert [t is x for t, x in zip(inputs, (q, k, v, out, lse, go))] == [True] * 6
    assert [table[i] is x for i, x in zip(grads, (dq, dk, dv))] == [True] * 3
    place, ws, acc, dk_e, dv_e, dv_offset, dk_like, dv_like, *rest = wgmma
    assert place == 1 and rest == [0.125, True, 2, 64, split, False]
    assert table[ws].shape == (b, hq, n_q) and table[acc].numel() == b * hq * n_q * d
    assert kernels[0][-1] == [3, 5, 4, ws, acc, -1, -1]
    want = [acc, 6] if split == 1 else [acc, 6, len(table) - 1, 7, 8]
    assert kernels[1][-1] == want + [-1, -1]
    assert dk_like.dim() == dv_like.dim() == 4 and dk_like.shape == dv_like.shape == (b, hkv * split, n_k, d)
    assert dk_like.data_ptr() == table[dk_e].data_ptr()
    assert dv_like.data_ptr() == table[dv_e].data_ptr() + dv_offset
    if split > 1:
        assert table[-1].shape == part_shape and dk_like.dtype == torch.float32 and dv_offset > 0


@pytest.mark.parametrize("atomic", [False, True], ids=["dq-pass", "atomic"])
def test_triton_fast_registration_table(atomic):
    """The same for the Triton backward's register_fast: delta (out, grad_out, lse, ws, and the
    accumulator or ws again), dK/dV (q, k, v, grad_out, lse, ws, dk, dv, accumulator or ws), then
    the dQ pass (q, k, v, grad_out, lse, ws, dq) or the dQ store (acc, dq); no wgmma step."""
    from tiled_attn.triton import attention_backward as tb
    tensors = _fast_operands()
    q, k, v, out, lse, go, dq, dk, dv = tensors
    rows = q.shape[0] * q.shape[1] * q.shape[2]
    run = tb._TritonBackward(_FastKernel(), _FastKernel(), _FastKernel(), rows, rows * q.shape[3] if atomic else 0)
    ext = _RegisterExt()
    assert run.register_fast(ext, *tensors) == "capsule"
    inputs, allocs, grads, kernels, wgmma = ext.got
    table = inputs + allocs
    assert wgmma is None and grads == [6, 7, 8] and [table[i] is x for i, x in zip(grads, (dq, dk, dv))] == [True] * 3
    assert table[9].shape == (rows,) and table[9].dtype == torch.float32
    a = 10 if atomic else 9
    assert len(table) == (11 if atomic else 10)
    assert [kn[-1][:-2] for kn in kernels] == [[3, 5, 4, 9, a], [0, 1, 2, 5, 4, 9, 7, 8, a],
                                              [10, 6] if atomic else [0, 1, 2, 5, 4, 9, 6]]


class _Run:
    """A planned backward's register_fast: hands out what `results` says, one per call (an exception
    is raised), and counts the calls."""

    def __init__(self, *results):
        self.results, self.calls = list(results), 0

    def register_fast(self, ext, *tensors):
        self.calls += 1
        got = self.results.pop(0)
        if isinstance(got, Exception):
            raise got
        return got


def test_register_fast_tries(monkeypatch):
    """AttentionBackwardPlan._register_fast (CPU, the run and the extension mocked): a call with a
    tensor off the 16-byte grid uses a try without registering; a registration that returns None (a
    kernel's aligned build not there yet) is tried again on the next call, up to three tries; a capsule
    becomes the plan's C++ path; a refusal ends the tries and is kept in fast_backward_refused."""
    softmax, attn = sys.modules["tiled_attn.softmax"], sys.modules["tiled_attn.attention"]
    ext = types.SimpleNamespace(attention_bwd_fast="the binding")
    monkeypatch.setattr(softmax, "_fast_extension", lambda device: ext)
    monkeypatch.setattr(attn, "_bwd_fast", None)
    monkeypatch.setattr(attn, "fast_backward_refused", None)
    tensors = _fast_operands()
    off = torch.empty(tensors[0].numel() + 1, dtype=tensors[0].dtype)[1:].view(tensors[0].shape)  # 2 bytes off

    def plan(*results):
        p = attn.AttentionBackwardPlan(*tensors[:4], tensors[5], 0.125, True, 2, False, "torch", False)
        p.run, p.fast_tries = _Run(*results), 3
        return p
    p = plan(None, "capsule")
    p._register_fast(off, *tensors[1:])
    assert p.run.calls == 0 and p.fast_tries == 2 and p.fast is None
    p._register_fast(*tensors)
    assert p.run.calls == 1 and p.fast_tries == 1 and p.fast is None
    p._register_fast(*tensors)
    assert p.run.calls == 2 and p.fast_tries == 0 and p.fast == "capsule" and attn._bwd_fast == "the binding"
    p = plan(None, None, None, "capsule")
    for _ in range(3):
        p._register_fast(*tensors)
    assert p.run.calls == 3 and p.fast_tries == 0 and p.fast is None  # three tries, then Python stays
    p = plan(RuntimeError("too many parameters"))
    p._register_fast(*tensors)
    assert p.fast_tries == 0 and p.fast is None and attn.fast_backward_refused == "RuntimeError: too many parameters"


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DT.get)
def test_finish_kernel_sums_partials(splits, dtype, seed):
    """attention_bwd_finish_kernel (under the interpreter on a CPU): dq = scale · accumulator and dk,
    dv = the sums of their float32 partials, into non-contiguous outputs (ragged key and query
    tiles), nothing written past them; and the delta kernel's ZERO_ACC zeroes a NaN-filled
    accumulator."""
    from tiled_attn.triton.attention_backward import plan_delta, plan_finish
    device = _require("triton", dtype, 64)
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, n_q, n_k, d = 2, 6, 2, 70, 83, 40
    scale = 0.3
    acc = randn((b * hq * n_q * d,), torch.float32, device, gen)
    part = randn((2, b, hkv * splits, n_k, d), torch.float32, device, gen)
    dq = torch.full((b, n_q, hq, d), float("nan"), dtype=dtype, device=device).transpose(1, 2)
    dk, dv = (torch.full((b, n_k, hkv, d + 8), float("nan"), dtype=dtype, device=device)[..., :d].transpose(1, 2)
              for _ in range(2))
    plan_finish(dq, dk, dv, scale, splits, False, upcast=dtype == torch.bfloat16)(acc, dq, part, dk, dv)
    sums = part.view(2, b, hkv, splits, n_k, d).sum(3)
    torch.testing.assert_close(dq.float(), (scale * acc).view(b, hq, n_q, d).to(dtype).float(), rtol=0, atol=0)
    for name, got, want in (("dk", dk, sums[0]), ("dv", dv, sums[1])):
        torch.testing.assert_close(got.float(), want.to(dtype).float(), rtol=1e-6, atol=1e-6, msg=name)
    out, go = (randn((b, hq, n_q, d), dtype, device, gen) for _ in range(2))
    ws = torch.empty(b * hq * n_q, dtype=torch.float32, device=device)
    acc.fill_(float("nan"))
    plan_delta(out, go, False, False, zero_acc=True)(out, go, ws, ws, acc)
    assert torch.equal(acc, torch.zeros_like(acc))
    torch.testing.assert_close(ws.view(b, hq, n_q), (out.float() * go.float()).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="backend=None's backward on an H100")
@pytest.mark.parametrize("d", [64, 128])
def test_default_backward_is_wgmma(d, seed):
    """backend=None trains with the wgmma backward where it covers the call, whichever forward
    configs.ATTENTION_SELECT picked (here the Triton one: causal, N = 300), and not with
    deterministic=True (the Triton kernels, bitwise-repeatable)."""
    q, k, v, go, _ = _wgmma_inputs(2, 4, 2, 300, 300, d, torch.bfloat16, seed)
    for deterministic in (False, True):
        grads, names = _cuda_kernels(lambda: _ours(q, k, v, go, causal=True, deterministic=deterministic))
        wgmma = any("flash_bwd_sm90_kernel" in n for n in names)
        assert wgmma != deterministic, f"deterministic={deterministic}: kernels {sorted(set(names))}"
        _check(grads, q, k, v, go, None, True, None, 0, seed, f"default D={d} deterministic={deterministic}")


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_float32_partial_gradients(backend, seed):
    """grad_dtype=float32 (the context-parallel ring's unrounded partials): the same kernels with
    float32 stores, so rounding those gradients to bf16 gives the bf16 ones (the wgmma dQ, summed by
    atomics in an order that varies, within one bf16 ulp of them); under the interpreter too."""
    from tiled_attn.attention import _backward_impl
    dtype, d = torch.bfloat16, 64
    device = _require(backend, dtype, d)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(1, 4, 2, 70, 90, d, dtype, device, gen)
    go = randn(q.shape, dtype, device, gen)
    out, lse = ta.attention(q, k, v, causal=True, backend=backend, return_lse=True)
    scale = 1.0 / math.sqrt(d)
    args = (go, q, k, v, out, lse, None, scale, True, 20, backend, False)
    g16, g32 = _backward_impl(*args), _backward_impl(*args, grad_dtype=torch.float32)
    for name, a, b in zip(("dq", "dk", "dv"), g16, g32):
        assert b.dtype == torch.float32 and a.dtype == dtype and b.shape == a.shape, name
        assert torch.isfinite(b).all(), name
        if name == "dq" and _dq_atomic(q, backend, False):
            ulp = torch.finfo(dtype).eps * b.abs().clamp(min=torch.finfo(dtype).tiny)
            assert ((b.to(dtype).float() - a.float()).abs() <= 2 * ulp + 1e-6).all(), name
        else:
            assert torch.equal(b.to(dtype), a), name
    _check(tuple(g.to(dtype) for g in g32), q, k, v, go, None, True, None, 20, seed, f"{backend} float32 partials")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="the wgmma backward runs on an H100")
def test_wgmma_backward_copies_operands_off_16_bytes(seed):
    """TMA needs 16-byte base addresses, which a signature does not fix: the same signature called
    first with aligned operands (the plan is made), then with q, k, v and dO views one element into
    their storage, runs the wgmma kernel both times (on copies the second time) and meets the rule."""
    q, k, v, go, _ = _wgmma_inputs(1, 4, 2, 200, 260, 64, torch.bfloat16, seed)

    def one_in(t):  # same values, shape and strides; the base 2 bytes past a 16-byte boundary
        flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        view = flat[1:].view(t.shape)
        view.copy_(t)
        assert view.data_ptr() % 16 != 0 and view.stride() == t.stride()
        return view
    for what, args in (("aligned", (q, k, v, go)), ("one element in", tuple(one_in(t) for t in (q, k, v, go)))):
        grads, names = _cuda_kernels(lambda: _ours(*args, causal=True, backend="cuda"))
        assert any("flash_bwd_sm90_kernel" in n for n in names), f"{what}: {sorted(set(names))}"
        _check(grads, q, k, v, go, None, True, None, 60, seed, f"cuda-wgmma {what}")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="determinism at this size runs on a CUDA device")
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("rows", ["shipped", "atomic"])
def test_deterministic_gpu(backend, rows, monkeypatch, seed):
    """B=2, Hq=8, Hkv=2, N=1000, D=64, bf16, causal: three backward runs with deterministic=True
    are bitwise identical, also when the config row says "atomic" (rows="atomic": forced), and
    meet the rule; the default is repeatable in dK/dV, and in dQ unless its row is atomic."""
    if rows == "atomic":
        _force_rows(monkeypatch, mode="atomic")
    dtype, d = torch.bfloat16, 64
    device = _require(backend, dtype, d)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 8, 2, 1000, 1000, d, dtype, device, gen)
    go, gl = randn(q.shape, dtype, device, gen), randn(q.shape[:3], torch.float32, device, gen)
    for deterministic in (True, False):
        runs = [_ours(q, k, v, go, gl, causal=True, backend=backend, deterministic=deterministic)
                for _ in range(3)]
        what = f"{backend} rows={rows} deterministic={deterministic}"
        _assert_repeatable(runs, q, backend, deterministic, what)
        _check(runs[-1], q, k, v, go, gl, True, None, 0, seed, what)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="the backward's peak memory is measured on a CUDA device")
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_backward_peak_memory(backend, deterministic, seed):
    """N = 32k (B=1, H=4, D=64, bf16, causal): the backward's peak extra memory is dq + dk + dv,
    the float32 dQ accumulator where the atomic mode runs, O(B·H·N) float32 workspaces (delta,
    lse's zero gradient: 16 bytes a row allowed) and 8 MiB; one N × N float32 tensor would be
    16 GiB."""
    dtype, d = torch.bfloat16, 64
    device = _require(backend, dtype, d)
    b, h, n = 1, 4, 32768
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=gen, device=device, dtype=dtype).requires_grad_() for _ in range(3))
    out = ta.attention(q, k, v, causal=True, backend=backend, deterministic=deterministic)
    go = torch.randn(out.shape, generator=gen, device=device, dtype=dtype)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), go)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    grads = sum(t.numel() * t.element_size() for t in (dq, dk, dv))
    acc = b * h * n * d * 4 if _dq_atomic(q, backend, deterministic) else 0
    bound = grads + acc + 16 * b * h * n + 8 * 2**20
    assert peak <= bound, (f"backward peak {peak / 2**20:.1f} MiB > bound {bound / 2**20:.1f} MiB (gradients "
                           f"{grads / 2**20:.1f} MiB, dQ accumulator {acc / 2**20:.1f} MiB)")
    assert all(bool(t.isfinite().all()) for t in (dq, dk, dv))
    assert bool(dq.abs().amax() > 0) and bool(dk.abs().amax() > 0) and bool(dv.abs().amax() > 0)
