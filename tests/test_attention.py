"""ta.attention: every backend against float64 under the numerics rule (tests/helpers.py).

Reference: reference.attention in float64 on the (already rounded) inputs. torch's own error for
the output is torch SDPA in the input dtype (bottom-right causal as an explicit boolean mask; GQA by
repeating K/V), or torch with flash's rounding points where that is larger (_torch_own); for lse it is logsumexp of the float32 scores of the same inputs (torch has no
lse-returning public SDPA), plus the rounding a float32 score may carry (_assert_lse says why).

Grids. Under TRITON_INTERPRET=1 (CI, CPU) a reduced grid runs: every head dim × dtype × causal at
one small shape, the ragged shapes at D = 32/40, MHA/GQA/MQA, all dtypes. On a CUDA device the
GPU grid runs too, for the kernel backends only (triton, cuda; the torch backend's math is
device-independent and covered on the CPU): every (shape, head dim, causal) once, with dtype and
head layout cycling so that every PAIR of the five dimensions (shape, D, causal, dtype, layout)
appears (test_gpu_grid_covers_every_pair checks it) instead of the full 4-way product (2,600 cases,
more than a 10-minute GPU job holds). Rows that see no key (causal with Nq > Nk, or negative
offsets) must be exactly 0 with lse -inf.

GPU run (H100, ~60-90 s): python -m pytest tests/test_attention.py -n 12 --dist loadgroup
(cases that compile the same kernels share an xdist group, so each kernel compiles on one worker).
"""
from __future__ import annotations

import importlib
import itertools
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import tiled_attn as ta
from tiled_attn import _plan
from tiled_attn import _checks, configs, reference
from helpers import (DTYPES, HAS_CUDA, INTERPRET, assert_none_without_interpreter, assert_rule,
                     backend_available, device_for, max_err, randn, skip_reason, sm90a_build_problem,
                     with_constexpr_defaults)

# The module (tiled_attn.attention the attribute is the function ta.attention).
attention_mod = importlib.import_module("tiled_attn.attention")

BACKENDS = ["torch", "triton", "cuda"]
SHAPES = [(1, 1), (1, 239), (3, 799), (113, 203), (128, 217), (113, 211), (108, 256), (256, 512),
          (512, 256), (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048)]
HEAD_DIMS = [32, 40, 64, 80, 96, 111, 128, 160, 192, 224, 256]
HEADS = {"mha": (2, 2), "gqa": (6, 2), "mqa": (4, 1)}  # (Hq, Hkv); G = 1, 3, 4
CUDA_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
GPU_GRID = HAS_CUDA and not INTERPRET
DT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _require(backend: str, dtype: torch.dtype = torch.float16, d: int = 64) -> str:
    """Skip what a backend cannot run here; returns the device its tensors live on."""
    if not backend_available(backend):
        pytest.skip(skip_reason(backend))
    if backend == "cuda" and dtype not in (torch.float16, torch.bfloat16):
        pytest.skip("the CUDA attention kernel supports float16/bfloat16 only")
    if backend == "cuda" and d not in CUDA_HEAD_DIMS:
        pytest.skip(f"the CUDA attention kernel instantiates head dims {CUDA_HEAD_DIMS}, not {d}")
    return device_for(backend)


def _qkv(b, hq, hkv, nq, nk, d, dtype, device, gen, scale=1.0):
    return (randn((b, hq, nq, d), dtype, device, gen, scale), randn((b, hkv, nk, d), dtype, device, gen),
            randn((b, hkv, nk, d), dtype, device, gen))


def _visible(nq, nk, causal, offset, device):
    """(Nq, Nk) bool: query i sees key j."""
    if not causal:
        return torch.ones(nq, nk, dtype=torch.bool, device=device)
    return reference._causal_mask(nq, nk, device, offset)


def _torch_own(q, k, v, causal, offset, scale):
    """torch's outputs in the input dtype and its lse from float32 scores.

    Two outputs: SDPA itself, and the same computation written in torch with FlashAttention's
    rounding points (float32 scores and softmax, P rounded to the input dtype, float32 P·V), which
    is what SDPA's flash backend does on the GPU. On the CPU, SDPA keeps P in float32, so for
    near-one-hot rows (test_peaked_scores) its 16-bit error would stand for a more exact algorithm
    than the one the rule is about; the test takes the larger of the two errors.
    """
    g = q.shape[1] // k.shape[1]
    kr, vr = (t.repeat_interleave(g, dim=1) for t in (k, v))
    mask = _visible(q.shape[2], k.shape[2], causal, offset, q.device) if causal else None
    sdpa = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, scale=scale)
    s = torch.matmul(q.float(), kr.float().transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    rounded_p = torch.matmul(torch.softmax(s, dim=-1).to(q.dtype).float(), vr.float()).to(q.dtype)
    return (sdpa, rounded_p), torch.logsumexp(s, dim=-1)


U32 = torch.finfo(torch.float32).eps / 2  # float32 unit roundoff


def _score_rounding(q, k, scale, visible):
    """max over visible (query, key) pairs of scale·√D·u·Σ_d |q_d k_d|: the probabilistic bound
    (Higham & Mary 2019, λ = 1) on the rounding error of a length-D float32 dot product, whatever
    its summation order (a chain of FMAs on the GPU's ieee dot, chunks, BLAS blocks)."""
    d = q.shape[-1]
    g = q.shape[1] // k.shape[1]
    qa = q.double().abs()
    ka = k.double().abs().repeat_interleave(g, dim=1)
    bound = torch.matmul(qa, ka.transpose(-1, -2)) * (abs(scale) * math.sqrt(d) * U32)
    # NaN inputs (test_nan_propagates) poison only rows the rule does not compare.
    bound = torch.where(visible, torch.nan_to_num(bound, nan=0.0, posinf=0.0), torch.zeros_like(bound))
    return bound.max().item() if bound.numel() else 0.0


def _assert_lse(lse, ref, t_lse, dtype, seed, what, score_err=0.0):
    """The rule for lse, with torch's error taken from logsumexp of its float32 scores, plus two
    terms torch's figure does not stand for:
    * score_err (_score_rounding): lse is logsumexp of float32 scores and ∂lse/∂s_j is a
      probability (Σ_j = 1), so |Δlse| <= max_j |Δ(scale·s_j)|. torch's error reflects its own
      summation order (cuBLAS/MKL blocks, a pairwise GEMV when Nq = Nk = 1), not what float32 allows:
      a kernel whose dot sums in another order may differ by the dot's rounding bound. Observed on
      the H100: Nq = Nk = 1, D = 256, float32: ours 1.8e-6 (one FMA chain), torch 1.9e-7.
    * 4 float32 ulps of the largest |lse|: the kernels form lse from m (a score, in log2 units on
      the 16-bit paths) and log l, up to three roundings of magnitude up to |lse|/ln2 that torch's
      natural-log logsumexp does not make (measured: 1.3 ulps at |lse| ~ 7 for float32 inputs).
    For 16-bit inputs eps(dtype) dominates either way."""
    ref, ours = ref.double().cpu(), lse.double().cpu()
    tag = f"[{what} lse seed={seed}]"
    assert torch.equal(torch.isnan(ours), torch.isnan(ref)), f"{tag} NaN pattern differs from the reference"
    inf = torch.isinf(ref)
    assert torch.equal(ours[inf], ref[inf]), f"{tag} ±inf entries differ from the reference"
    finite = torch.isfinite(ref)
    scale = ref[finite].abs().max().item() if finite.any() else 0.0
    e_ours, e_torch = max_err(ours, ref), max_err(t_lse, ref)
    ulps = 4 * torch.finfo(torch.float32).eps * scale
    tol = 2 * e_torch + torch.finfo(dtype).eps + score_err + ulps
    assert e_ours <= tol, (f"{tag} error {e_ours:.3e} exceeds 2×torch's {e_torch:.3e} + eps + float32 "
                           f"score rounding {score_err:.3e} + 4 ulps {ulps:.3e} ({tol:.3e})")


def _check(out, lse, q, k, v, causal, offset, scale, seed, what):
    """The numerics rule on out and lse; rows with no visible key: exactly 0 and -inf."""
    dtype = q.dtype
    nq, nk = q.shape[2], k.shape[2]
    assert out.shape == q.shape and out.dtype == dtype, f"[{what}] out {out.shape} {out.dtype}"
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32, f"[{what}] lse {lse.shape} {lse.dtype}"
    ref_out, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal, scale, True, offset)
    seen = _visible(nq, nk, causal, offset, q.device).any(dim=1)  # rows with >= 1 visible key
    if nk > 0:
        t_outs, t_lse = _torch_own(q, k, v, causal, offset, scale)
        # torch's masked-out rows are NaN or arbitrary: it is compared only where a key is visible.
        t_outs = [torch.where(seen[:, None], t.double(), ref_out) for t in t_outs]
        t_out = max(t_outs, key=lambda t: max_err(t, ref_out))
    else:
        t_out, t_lse = ref_out, ref_lse
    assert_rule(out, ref_out, t_out, dtype=dtype, seed=seed, what=f"{what} out")
    visible = _visible(nq, nk, causal, offset, q.device)
    _assert_lse(lse, ref_lse, t_lse, dtype, seed, what, _score_rounding(q, k, scale, visible))
    if not seen.all():
        blind = ~seen
        assert torch.equal(out[:, :, blind].float().cpu(), torch.zeros_like(out[:, :, blind].float().cpu())), \
            f"[{what} seed={seed}] rows with no visible key must be exactly 0"
        assert bool((lse[:, :, blind] == float("-inf")).all()), \
            f"[{what} seed={seed}] rows with no visible key must have lse -inf"


def _case(backend, b, heads, nq, nk, d, dtype, causal, seed, *, q_scale=1.0):
    device = _require(backend, dtype, d)
    hq, hkv = HEADS[heads] if isinstance(heads, str) else heads
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(b, hq, hkv, nq, nk, d, dtype, device, gen, q_scale)
    out, lse = ta.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    what = f"{backend} B={b} H={hq}/{hkv} Nq={nq} Nk={nk} D={d} {DT[dtype]} causal={causal}"
    _check(out, lse, q, k, v, causal, nk - nq, 1.0 / math.sqrt(d), seed, what)


def _cycle(i):
    return list(HEADS)[i % len(HEADS)]


def _id(*parts):
    return "-".join(DT.get(p, str(p)) if isinstance(p, torch.dtype) else str(p) for p in parts)


def _on_this_device(backend: str) -> None:
    """On a CUDA device the torch backend's grids are left to the CPU run (device-independent math)."""
    if backend == "torch" and GPU_GRID:
        pytest.skip("the torch backend's grid runs on the CPU (its math is device-independent)")


def _group(dtype, d) -> list:
    """On the GPU (pytest-xdist, --dist loadgroup): cases that compile the same kernels (one dtype
    and head dim) run on one worker, so each kernel is compiled once, not by several workers at once."""
    return [pytest.mark.xdist_group(f"{DT[dtype]}-{d}")] if GPU_GRID else []


# -- reduced grid: runs everywhere (CI under TRITON_INTERPRET=1, and on the GPU) --------------------
# Every head dim × dtype × causal at one small ragged shape (several tiles, a diagonal band, a
# ragged last tile in both Nq and Nk), heads cycling MHA/GQA/MQA.
HEAD_DIM_CASES = [pytest.param(d, dt, c, _cycle(i), id=_id(d, dt, c, _cycle(i)),
                               marks=_group(dt, d))
                  for i, (d, dt, c) in enumerate(itertools.product(HEAD_DIMS, DTYPES, (False, True)))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d,dtype,causal,heads", HEAD_DIM_CASES)
def test_head_dims(backend, d, dtype, causal, heads, seed):
    _on_this_device(backend)
    _case(backend, 1, heads, 61, 97, d, dtype, causal, seed)


# The ragged shapes (decode-like, Nq < Nk, Nq > Nk) at D = 32/40, every head layout, both causal
# modes, dtypes cycling.
CI_SHAPES = SHAPES[:9]
SHAPE_CASES = [pytest.param(s, d, c, h, DTYPES[i % 3], id=_id(f"{s[0]}x{s[1]}", d, c, h, DTYPES[i % 3]),
                            marks=_group(DTYPES[i % 3], d))
               for i, (s, d, c, h) in enumerate(itertools.product(CI_SHAPES, (32, 40), (False, True), HEADS))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,d,causal,heads,dtype", SHAPE_CASES)
def test_shapes(backend, shape, d, causal, heads, dtype, seed):
    _on_this_device(backend)
    # One batch for the two largest CI shapes: the interpreter's time grows with B·H·tiles.
    _case(backend, 2 if shape[0] * shape[1] <= 65536 else 1, heads, *shape, d, dtype, causal, seed)


# -- GPU grid: every pair of dimensions, kernel backends only --------------------------------------
KERNEL_BACKENDS = ["triton", "cuda"]


def gpu_grid() -> list[tuple]:
    """(shape, D, causal, dtype, layout) for every (shape, D, causal); dtype and layout cycle with
    the shape and D indices ((s + d + causal) mod 3, (s + 2d) mod 3), so that every pair of the
    five dimensions appears (test_gpu_grid_covers_every_pair)."""
    layouts = list(HEADS)
    return [(shape, d, causal, DTYPES[(si + di + causal) % 3], layouts[(si + 2 * di) % 3])
            for si, shape in enumerate(SHAPES) for di, d in enumerate(HEAD_DIMS) for causal in (False, True)]


def test_gpu_grid_covers_every_pair():
    """Every value pair of any two of (shape, D, causal, dtype, layout) is in the GPU grid, every
    (shape, D, causal) exactly once, and the decode-like shapes (Nq <= 3) are in it."""
    grid = gpu_grid()
    domains = [SHAPES, HEAD_DIMS, [False, True], list(DTYPES), list(HEADS)]
    assert len(grid) == len(SHAPES) * len(HEAD_DIMS) * 2
    assert len({c[:3] for c in grid}) == len(grid)
    for i, j in itertools.combinations(range(5), 2):
        seen = {(c[i], c[j]) for c in grid}
        missing = [(a, b) for a in domains[i] for b in domains[j] if (a, b) not in seen]
        assert not missing, f"dimensions {i} and {j}: pairs {missing[:5]} never appear"
    assert {s for s, *_ in grid} >= {(1, 1), (1, 239), (3, 799)}
    full = full_product_grid()
    assert len(set(full)) == len(full) == len(grid) * len(DTYPES) * len(HEADS) and set(grid) <= set(full)


def full_product_grid() -> list[tuple]:
    """Every (shape, D, causal, dtype, layout): 13 × 11 × 2 × 3 × 3 = 2574 cases a backend, the
    issue's grid in full. TILED_ATTN_FULL_GRID=1 runs it in test_full_grid instead of the pairwise
    grid (on the H100 in shards: TILED_ATTN_SHARD, tests/conftest.py)."""
    return [(shape, d, causal, dt, h) for shape in SHAPES for d in HEAD_DIMS for causal in (False, True)
            for dt in DTYPES for h in HEADS]


def _gpu_grid_params():
    if not GPU_GRID:
        return [pytest.param(None, None, None, None, None, id="gpu-grid",
                             marks=pytest.mark.skip(reason="the GPU grid runs on a CUDA device"))]
    grid = full_product_grid() if os.environ.get("TILED_ATTN_FULL_GRID") == "1" else gpu_grid()
    return [pytest.param(s, d, c, h, dt, id=_id(f"{s[0]}x{s[1]}", d, c, h, dt),
                         marks=[pytest.mark.gpu, *_group(dt, d)])
            for s, d, c, dt, h in grid]


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("shape,d,causal,heads,dtype", _gpu_grid_params())
def test_full_grid(backend, shape, d, causal, heads, dtype, seed):
    _case(backend, 2, heads, *shape, d, dtype, causal, seed)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_GRID, reason="decode at benchmark size runs on a CUDA device")
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("b,nk", [(1, 32768), (4, 4096), (16, 4096)])
def test_decode_benchmark_shape(backend, b, nk, seed):
    _case(backend, b, (32, 8), 1, nk, 128, torch.bfloat16, False, seed)


# -- masking, offsets, empty rows ------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nq,nk", [(70, 23), (33, 1), (17, 16)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
def test_more_queries_than_keys_causal(backend, nq, nk, dtype, seed):
    """Bottom-right causal with Nq > Nk: the first Nq − Nk rows see nothing (0 and lse -inf)."""
    _case(backend, 2, "gqa", nq, nk, 40, dtype, True, seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("offset", [-100, -45, -7, 0, 5, 76, 77, 200])
def test_causal_offsets(backend, offset, seed):
    """The mask j <= i + offset for any offset (0: torch's top-left; > Nk: nothing masked;
    <= -Nq: every row empty), through the custom op that both public functions call."""
    device = _require(backend)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 6, 2, 45, 78, 64, torch.float16, device, gen)
    scale = 0.3
    out, lse = attention_mod._attention_op(q, k, v, scale, True, offset, backend)
    _check(out, lse, q, k, v, True, offset, scale, seed, f"{backend} offset={offset}")


def test_sdpa_is_causal_top_left(seed):
    """ta.scaled_dot_product_attention(is_causal=True) is torch's top-left mask (offset 0), on the
    device's default backend."""
    device = "cuda" if HAS_CUDA else "cpu"
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 2, 2, 50, 90, 64, torch.float16, device, gen)
    out = ta.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = reference.attention(q.double(), k.double(), v.double(), True, 1 / 8, False, 0)
    assert_rule(out, ref, F.scaled_dot_product_attention(q, k, v, is_causal=True), dtype=q.dtype,
                seed=seed, what="sdpa top-left")


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_keys(backend, seed):
    """Nk = 0: every row is empty."""
    device = _require(backend)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 4, 2, 9, 0, 32, torch.float16, device, gen)
    for causal in (False, True):
        out, lse = ta.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
        assert torch.equal(out.cpu(), torch.zeros(out.shape, dtype=out.dtype))
        assert bool((lse == float("-inf")).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_queries(backend):
    device = _require(backend)
    q = torch.empty(2, 4, 0, 32, dtype=torch.float16, device=device)
    k = v = torch.zeros(2, 2, 5, 32, dtype=torch.float16, device=device)
    out, lse = ta.attention(q, k, v, return_lse=True, backend=backend)
    assert out.shape == (2, 4, 0, 32) and lse.shape == (2, 4, 0)


# -- special values --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_propagates(backend, where, seed):
    """A NaN in q poisons its row, in k every row that sees that key, in v that column of every row
    that sees that key: exactly the reference's NaN pattern (assert_rule checks it)."""
    device = _require(backend)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(1, 4, 2, 37, 70, 32, torch.float16, device, gen)
    t = {"q": q, "k": k, "v": v}[where]
    t[0, 1, 5, 3] = float("nan")
    out, lse = ta.attention(q, k, v, return_lse=True, backend=backend)
    _check(out, lse, q, k, v, False, 0, 1 / math.sqrt(32), seed, f"{backend} NaN in {where}")
    assert torch.isnan(out).any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT.get)
def test_peaked_scores(backend, dtype, seed):
    """Large scores (|s| ~ 1e3): softmax is nearly one-hot, exp2 of big differences underflows."""
    _case(backend, 1, "gqa", 40, 150, 64, dtype, True, seed, q_scale=40.0)


# -- strides ---------------------------------------------------------------------------------------
def _packed_qkv(b, n, hq, hkv, d, dtype, device, gen):
    """q, k, v split from a packed (B, N, Hq + 2·Hkv, D) projection and transposed to (B, H, N, D)."""
    x = randn((b, n, hq + 2 * hkv, d), dtype, device, gen)
    q, k, v = x.split([hq, hkv, hkv], dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["packed_qkv", "packed_gqa", "step_sliced", "d_strided"])
@pytest.mark.parametrize("causal", [False, True])
def test_non_contiguous(backend, layout, causal, seed):
    device = _require(backend)
    gen = torch.Generator().manual_seed(seed)
    dtype, d = torch.bfloat16, 64
    if layout == "packed_qkv":  # (B, N, 3, H, D) unbound: strides (N·3HD, D, 3HD, 1)
        x = randn((2, 77, 3, 4, d), dtype, device, gen)
        q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
    elif layout == "packed_gqa":
        q, k, v = _packed_qkv(2, 77, 6, 2, d, dtype, device, gen)
    elif layout == "step_sliced":  # every other query, key and head
        q = randn((2, 8, 90, d), dtype, device, gen)[:, ::2, ::2]
        k = randn((2, 4, 150, d), dtype, device, gen)[:, ::2, 1::2]
        v = randn((2, 2, 75, d), dtype, device, gen)
    else:  # head dim not innermost: (B, D, H, N) storage viewed as (B, H, N, D)
        q = randn((2, d, 4, 60), dtype, device, gen).permute(0, 2, 3, 1)
        k = randn((2, d, 2, 83), dtype, device, gen).permute(0, 2, 3, 1)
        v = randn((2, 2, 83, d), dtype, device, gen)
    assert not (q.is_contiguous() and k.is_contiguous())
    out, lse = ta.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    _check(out, lse, q, k, v, causal, k.shape[2] - q.shape[2], 1 / 8, seed, f"{backend} {layout}")


def test_output_layout_is_bnhd():
    """out is a (B, H, N, D) view of (B, N, H, D) memory, so out.transpose(1, 2) is free."""
    q = torch.randn(2, 4, 5, 32, dtype=torch.float64)
    out = ta.attention(q, q, q, backend="torch")
    assert out.transpose(1, 2).is_contiguous()


# -- the Triton kernels' own paths: split-KV decode, tile shapes, 64-bit tile offsets -------------
def _triton_direct(q, k, v, scale, causal, offset, **kw):
    from tiled_attn.triton import attention as triton_attention
    out, lse = (_checks.new_output(t) for t in attention_mod._alloc(q, v))
    triton_attention.attention_forward(q, k, v, out, lse, scale, causal, offset, **kw)
    return out, lse


DECODE_CASES = [pytest.param(*c, id=_id(f"{c[0]}x{c[1]}", *c[2:]))
                for c in [(1, 239, 32, "mqa", torch.float16, False, 4),
                          (1, 239, 111, "gqa", torch.bfloat16, True, 3),
                          (3, 799, 40, "gqa", torch.float32, True, 5),
                          (3, 799, 128, "mha", torch.bfloat16, False, 2),
                          (7, 300, 64, "mqa", torch.float16, True, 6),   # 28 rows: 2 packed tiles
                          (1, 1, 32, "mha", torch.float32, False, 2),
                          (2, 50, 256, "gqa", torch.float16, True, 3),
                          (3, 150, 32, (32, 1), torch.float16, True, 3)]]  # 96 rows: several tiles


@pytest.mark.parametrize("nq,nk,d,heads,dtype,causal,splits", DECODE_CASES)
def test_decode_split_kv(nq, nk, d, heads, dtype, causal, splits, seed):
    """The split-KV kernel forced with several splits (partial states in the workspace, merged)."""
    device = _require("triton", dtype, d)
    from tiled_attn.triton import attention as triton_attention
    gen = torch.Generator().manual_seed(seed)
    hq, hkv = HEADS[heads] if isinstance(heads, str) else heads
    q, k, v = _qkv(2, hq, hkv, nq, nk, d, dtype, device, gen)
    plan = triton_attention.plan(q, k, causal, nk - nq, kernel="decode", num_splits=splits)
    assert plan["kernel"] == "decode"
    assert plan["num_splits"] > 1 or nk <= plan["BLOCK_N"], plan  # the workspace + merge path
    out, lse = _triton_direct(q, k, v, 1 / math.sqrt(d), causal, nk - nq, kernel="decode",
                              num_splits=splits)
    _check(out, lse, q, k, v, causal, nk - nq, 1 / math.sqrt(d), seed, f"decode splits={splits}")


@pytest.mark.parametrize("offset", [-9, -3, 0, 250])
def test_decode_split_kv_offsets(offset, seed):
    """Split-KV with rows that see nothing and splits that no row reaches (identity partials)."""
    device = _require("triton")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(1, 4, 1, 5, 200, 64, torch.float16, device, gen)
    out, lse = _triton_direct(q, k, v, 0.2, True, offset, kernel="decode", num_splits=7)
    _check(out, lse, q, k, v, True, offset, 0.2, seed, f"decode offset={offset}")


def test_decode_is_chosen_for_short_queries():
    if not backend_available("triton"):
        pytest.skip(skip_reason("triton"))
    from tiled_attn.triton import attention as triton_attention
    dev = device_for("triton")
    q = torch.empty(1, 32, 1, 128, dtype=torch.bfloat16, device=dev)
    k = torch.empty(1, 8, 1, 128, dtype=torch.bfloat16, device=dev).expand(1, 8, 131072, 128)
    plan = triton_attention.plan(q, k, False, 0)
    assert plan["kernel"] == "decode" and plan["BLOCK_M"] == 16 and plan["m_tiles"] == 1
    if dev == "cuda":  # 8 programs would leave most SMs idle: the keys must be split
        assert plan["num_splits"] > 1
    q = torch.empty(1, 32, 4096, 128, dtype=torch.bfloat16, device=dev)
    assert triton_attention.plan(q, k, True, 0)["kernel"] == "fwd"
    # MQA with 64 query heads: 128 packed rows, still one K/V read per 16-64 heads.
    q = torch.empty(1, 64, 2, 128, dtype=torch.bfloat16, device=dev)
    plan = triton_attention.plan(q, k[:, :1], False, 0)
    assert plan["kernel"] == "decode" and plan["m_tiles"] * plan["BLOCK_M"] >= 128


def _use_cpu_rows(monkeypatch):
    """On a GPU: run the interpreter's ("cpu") config rows, with no plan made from the others."""
    monkeypatch.setattr(configs, "arch", lambda dev: "cpu")
    _plan.clear_all()


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16), (64, 16), (16, 64)])
@pytest.mark.parametrize("offset", [-20, 0, 37])
def test_tile_shapes(block_m, block_n, offset, monkeypatch, seed):
    """The unmasked-loop / diagonal-band split for BLOCK_M < BLOCK_N and BLOCK_M > BLOCK_N (the
    GPU configs use both), against an arbitrary offset."""
    device = _require("triton")
    cpu_row = dict(configs.TRITON_ATTENTION[("fwd", "cpu", "*", "*", "*", "*")], BLOCK_M=block_m,
                   BLOCK_N=block_n)
    monkeypatch.setitem(configs.TRITON_ATTENTION, ("fwd", "cpu", "*", "*", "*", "*"), cpu_row)
    if device == "cuda":
        _use_cpu_rows(monkeypatch)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(1, 2, 1, 83, 101, 32, torch.float16, device, gen)
    out, lse = _triton_direct(q, k, v, 0.25, True, offset, kernel="fwd")
    _check(out, lse, q, k, v, True, offset, 0.25, seed, f"BLOCK {block_m}x{block_n} offset={offset}")


@pytest.mark.parametrize("kernel,d", [("fwd", 40), ("fwd", 96), ("decode", 40)])
def test_wide_offsets_path(kernel, d, monkeypatch, seed):
    """The int64 in-tile offsets (used when a stride × a tile could pass 2^31), forced on a small
    input: allocating a real > 2^31-element view is out of reach of CI. The forward at D = 96 too:
    its second head-dim part (TWO_PARTS in the interpreter's row) starts 64 head-dim strides in."""
    device = _require("triton")
    from tiled_attn.triton import attention as triton_attention
    monkeypatch.setattr(triton_attention, "WIDE_STRIDE", 0)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _packed_qkv(2, 45, 6, 2, d, torch.float16, device, gen)
    out, lse = _triton_direct(q, k, v, 0.15, True, 0, kernel=kernel, num_splits=3)
    _check(out, lse, q, k, v, True, 0, 0.15, seed, f"wide {kernel}")


# Kernel-structure switches of the config rows (attention_fwd.py): each must compute the same thing.
VARIANTS = {"fma": dict(FMA=True), "late_l": dict(LATE_L=True), "offs": dict(ADDR="offs"),
            "tma": dict(ADDR="tma"), "all": dict(FMA=True, LATE_L=True, ADDR="offs")}


@pytest.mark.parametrize("kernel,d", [("fwd", 40), ("fwd", 48), ("decode", 40)])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype,causal", [(torch.bfloat16, True), (torch.float16, False),
                                          (torch.float32, True)], ids=["bf16-causal", "fp16", "fp32-causal"])
def test_kernel_variants(kernel, d, variant, dtype, causal, monkeypatch, seed):
    """FMA (raw scores, exp2 argument as one FMA), LATE_L (row sum after P·V), ADDR "offs" (pointers
    rebuilt per tile) and "tma" (tensor descriptors; float32 and the interpreter's bfloat16 fall back
    to "offs") on the interpreter's rows, against float64: at D = 40 a ragged head dim (masked
    loads), at D = 48 the forward's two head-dim parts (32 + 16; 16-bit) or, at float32, a ragged one."""
    device = _require("triton", dtype)
    for key in (("fwd", "cpu", "*", "*", "*", "*"), ("decode", "cpu", "*", "*", "*", "*")):
        monkeypatch.setitem(configs.TRITON_ATTENTION, key, {**configs.TRITON_ATTENTION[key], **VARIANTS[variant]})
    monkeypatch.setattr(configs, "TRITON_TMA_MIN_FLOPS", 0)  # TMA on these small shapes too
    if device == "cuda":
        _use_cpu_rows(monkeypatch)
    gen = torch.Generator().manual_seed(seed)
    nq = 40 if kernel == "fwd" else 3
    q, k, v = _qkv(1, 4, 2, nq, 75, d, dtype, device, gen)
    out, lse = _triton_direct(q, k, v, 0.2, causal, 75 - nq, kernel=kernel, num_splits=2)
    _check(out, lse, q, k, v, causal, 75 - nq, 0.2, seed, f"{kernel} {variant}")


def test_head_parts():
    """Which head dims the forward splits into two power-of-two parts: exactly the sums of two
    powers of two >= 16 that are no power of two (a padded single tile would do more work)."""
    from tiled_attn.triton.attention import head_parts
    split = {d: head_parts(d) for d in range(1, 257) if head_parts(d)}
    assert split == {48: (32, 16), 80: (64, 16), 96: (64, 32), 144: (128, 16), 160: (128, 32),
                     192: (128, 64)}


@pytest.mark.parametrize("d", [48, 96, 192])
@pytest.mark.parametrize("layout", ["contiguous", "d_strided", "packed_gqa"])
@pytest.mark.parametrize("addr", ["ptr", "offs", "tma"])
def test_two_part_head_dim(d, layout, addr, monkeypatch, seed):
    """attention_fwd_d2_kernel (TWO_PARTS): the plan picks it for these head dims, and it meets the
    rule with every K/V addressing, through strides (a head dim that is not innermost: no TMA there),
    causal with Nq < Nk and GQA, fp16 and bf16 by the seed."""
    from tiled_attn.triton import attention as triton_attention
    dtype = (torch.float16, torch.bfloat16)[seed % 2]
    device = _require("triton", dtype)
    key = ("fwd", "cpu", "*", "*", "*", "*")
    monkeypatch.setitem(configs.TRITON_ATTENTION, key, {**configs.TRITON_ATTENTION[key], "TWO_PARTS": True,
                                                        "ADDR": addr})
    monkeypatch.setattr(configs, "TRITON_TMA_MIN_FLOPS", 0)
    if device == "cuda":
        _use_cpu_rows(monkeypatch)
    gen = torch.Generator().manual_seed(seed)
    nq, nk = 37, 70
    if layout == "contiguous":
        q, k, v = _qkv(1, 4, 2, nq, nk, d, dtype, device, gen)
    elif layout == "d_strided":  # (B, D, H, N) storage seen as (B, H, N, D)
        q = randn((1, d, 4, nq), dtype, device, gen).permute(0, 2, 3, 1)
        k = randn((1, d, 2, nk), dtype, device, gen).permute(0, 2, 3, 1)
        v = randn((1, d, 2, nk), dtype, device, gen).permute(0, 2, 3, 1)
    else:
        q, k, v = _packed_qkv(1, nk, 4, 2, d, dtype, device, gen)
        q = q[:, :, nk - nq:]
    plan = triton_attention.plan(q, k, True, nk - nq, kernel="fwd")
    assert (plan["BLOCK_D"], plan["BLOCK_D2"]) == triton_attention.head_parts(d)
    out, lse = _triton_direct(q, k, v, d ** -0.5, True, nk - nq, kernel="fwd")
    _check(out, lse, q, k, v, True, nk - nq, d ** -0.5, seed, f"two parts D={d} {layout} {addr}")


@pytest.mark.parametrize("kernel", ["fwd", "decode"])
def test_negative_scale(kernel, monkeypatch, seed):
    """scale <= 0: softmax(scale·s) peaks at the smallest score, so the raw-score (FMA) form, whose
    max is taken before scaling, must not be used; the wrapper falls back to pre-scaled scores."""
    device = _require("triton")
    for key in (("fwd", "cpu", "*", "*", "*", "*"), ("decode", "cpu", "*", "*", "*", "*")):
        monkeypatch.setitem(configs.TRITON_ATTENTION, key, {**configs.TRITON_ATTENTION[key], "FMA": True})
    if device == "cuda":
        _use_cpu_rows(monkeypatch)
    gen = torch.Generator().manual_seed(seed)
    for dtype in (torch.float16, torch.float32):
        q, k, v = _qkv(1, 2, 1, 33 if kernel == "fwd" else 2, 70, 32, dtype, device, gen)
        for scale in (-0.3, 0.0):
            out, lse = _triton_direct(q, k, v, scale, True, 70 - q.shape[2], kernel=kernel, num_splits=3)
            _check(out, lse, q, k, v, True, 70 - q.shape[2], scale, seed, f"{kernel} scale={scale}")


def test_merge_in_several_tiles(monkeypatch, seed):
    """More splits than the merge kernel loads at once: its loop over [BLOCK_S, D] partial tiles."""
    device = _require("triton")
    from tiled_attn.triton import attention as triton_attention
    monkeypatch.setattr(triton_attention, "MAX_MERGE_TILE", 2)
    gen = torch.Generator().manual_seed(seed)
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v = _qkv(2, 4, 2, 1, 230, 64, dtype, device, gen)
        out, lse = _triton_direct(q, k, v, 0.125, False, 229, kernel="decode", num_splits=7)
        _check(out, lse, q, k, v, False, 229, 0.125, seed, f"merge in tiles {DT[dtype]}")


@pytest.mark.parametrize("b,n_k,splits", [(1, 256, 1), (1, 512, 1), (1, 1024, 16), (1, 4096, 16),
                                          (1, 16384, 32), (1, 32768, 33), (8, 4096, 4), (16, 32768, 2),
                                          (32, 4096, 1), (64, 131072, 1)])
def test_decode_splits_rule(b, n_k, splits):
    """The split count of the sm90 decode row (GQA 32/8, D = 128, Nq = 1: 8 kv heads, one row tile
    each, 132 SMs) per attention.decode_splits: one split up to min_split_keys keys, then up to one
    program per SM, up to waves per SM where a split still reads min_split_keys, never past that."""
    from tiled_attn.triton import attention as triton_attention
    cfg = triton_attention.config("decode", torch.device("cpu"), torch.bfloat16, 128, False, n_k, "sm90")
    got = triton_attention.decode_splits(b * 8, n_k, cfg, 132)
    assert got == splits
    assert got == 1 or b * 8 * got <= cfg["waves"] * 132


def test_plan_cache_follows_the_table(monkeypatch):
    """Plans are cached per signature; replacing a config row must change the next launch."""
    if not backend_available("triton"):
        pytest.skip(skip_reason("triton"))
    from tiled_attn.triton import attention as triton_attention
    dev = device_for("triton")
    if dev == "cuda":
        _use_cpu_rows(monkeypatch)
    made = []
    real = triton_attention._launch_plan
    monkeypatch.setattr(triton_attention, "_launch_plan", lambda *a: made.append(real(*a)) or made[-1])
    q = torch.randn(1, 2, 40, 32, dtype=torch.float16, device=dev)
    k = torch.randn(1, 2, 50, 32, dtype=torch.float16, device=dev)
    first = ta.attention(q, k, k, backend="triton")
    torch.testing.assert_close(ta.attention(q, k, k, backend="triton"), first, rtol=0, atol=0)
    assert len(made) == 1  # the second call reused the plan
    key = (made[0]["kernel"], "cpu", "*", "*", "*", "*")
    monkeypatch.setitem(configs.TRITON_ATTENTION, key, {**configs.TRITON_ATTENTION[key], "BLOCK_N": 16})
    # other tiles, other roundings
    torch.testing.assert_close(ta.attention(q, k, k, backend="triton"), first, rtol=0, atol=2e-3)
    assert len(made) == 2 and made[-1]["const"]["BLOCK_N"] == 16


# -- every shipped and candidate config compiles for the H100 without spills -----------------------
def _sm90_attention_builds(which: str = "shipped"):
    """(label, kernel, dtype, constexprs, options) for the forward, decode and merge kernels: with
    which="shipped" at the config every sm90 (bf16, fp32; fp16 shares the bf16 rows) × D ∈ {40, 64,
    96, 128, 192, 224, 256} × causal × size-class lookup returns (attention_fwd_d2_kernel where the
    row splits the head dim, as the plan does); with "candidates" at every candidate of
    the tuning sweep (bf16, both causal modes). Contiguous inputs: strides divisible by 16, unit
    stride on D. Decode is built at its two packed tiles: 16 rows (Nq·G = 4, the benchmark) and
    the row's largest."""
    from tiled_attn.triton import attention as ta_triton
    from tiled_attn.triton.attention_decode import attention_decode_kernel, attention_merge_kernel
    from tiled_attn.triton.attention_fwd import attention_fwd_d2_kernel, attention_fwd_kernel
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import tune_triton_attention as tune
    configs_to_build = []  # (kernel, dtype key, D, causal, row)
    if which == "shipped":
        for kernel in ("fwd", "decode"):
            for dt, torch_dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
                for d in (40, 64, 96, 128, 192, 224, 256):
                    for causal in (False, True):
                        for n_k in (512, 4096):
                            row = ta_triton.config(kernel, torch.device("cpu"), torch_dt, d, causal, n_k, "sm90")
                            configs_to_build.append((kernel, dt, d, causal, row))
    else:
        for kernel, d in (("fwd", 64), ("fwd", 128), ("fwd", 256), ("decode", 128)):
            for cand in tune.candidates((kernel, "sm90", "bf16", ta_triton.d_class(d))):
                for causal in (False, True):
                    configs_to_build.append((kernel, "bf16", d, causal,
                                             {**configs.TRITON_ATTENTION_DEFAULTS, **cand}))
    builds, seen = [], set()
    for kernel, dt, d, causal, row in configs_to_build:
        fp32 = dt == "fp32"
        block_d = max(16, 1 << (d - 1).bit_length())
        addr = row["ADDR"]
        if addr == "tma" and fp32:
            addr = "offs"
        const = dict(CAUSAL=causal, BLOCK_N=row["BLOCK_N"], HEAD_DIM=d, BLOCK_D=block_d,
                     EVEN_D=block_d == d, PRECISION="ieee" if fp32 else "tf32", UPCAST=False,
                     WIDE=False, RAW=bool(row["FMA"]) or fp32, FMA=bool(row["FMA"]) and not fp32,
                     LATE_L=bool(row["LATE_L"]), SPLIT_D=block_d // ta_triton.SPLIT_D_CHUNK if fp32 else 1,
                     ACCURATE=fp32, ADDR=addr)
        opts = dict(num_warps=row["num_warps"], num_stages=row["num_stages"])
        parts = ta_triton.head_parts(d) if kernel == "fwd" and row.get("TWO_PARTS") and not fp32 else None
        if parts is not None:
            const = {k: v for k, v in const.items() if k not in ("EVEN_D", "SPLIT_D", "ACCURATE")}
            const.update(BLOCK_D=parts[0], BLOCK_D2=parts[1])
            variants = [(attention_fwd_d2_kernel, dict(const, BLOCK_M=row["BLOCK_M"]))]
        elif kernel == "fwd":
            variants = [(attention_fwd_kernel, dict(const, BLOCK_M=row["BLOCK_M"]))]
        else:
            variants = [(attention_decode_kernel, dict(const, BLOCK_M=bm, SPLIT=True))
                        for bm in sorted({16, row["BLOCK_M"]})]
        for kern, c in variants:
            tag = (kern.fn.__name__, dt, tuple(sorted(c.items())), tuple(sorted(opts.items())))
            if tag not in seen:
                seen.add(tag)
                builds.append((f"{kernel} {dt} D={d} causal={causal} BLOCK_M={c['BLOCK_M']} {row}",
                               kern, dt, c, opts))
        if kernel == "decode":
            mconst = dict(BLOCK_S=ta_triton.merge_tile(64, block_d), HEAD_DIM=d, BLOCK_D=block_d,
                          UPCAST=False, RAW=const["RAW"], ACCURATE=fp32)
            mopts = dict(num_warps=row["merge_warps"])
            mtag = ("merge", dt, tuple(sorted(mconst.items())), tuple(sorted(mopts.items())))
            if mtag not in seen:
                seen.add(mtag)
                builds.append((f"merge {dt} D={d} {mopts}", attention_merge_kernel, dt, mconst, mopts))
    return builds


def _compile_attention_for_sm90a(which: str = "shipped", jobs: int = 2) -> list[str]:
    """Compile _sm90_attention_builds(which) for sm_90a (no GPU needed) and run ptxas -v on each;
    returns problems (compile errors, register spills, shared memory over 227 KB). Must run without
    TRITON_INTERPRET (the interpreter replaces @triton.jit)."""
    import concurrent.futures
    n = len(_sm90_attention_builds(which))
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        results = list(pool.map(_compile_one, [which] * n, range(n)))
    return [p for p in results if p]


def _compile_one(which: str, index: int) -> str:
    label, kern, dt, const, opts = _sm90_attention_builds(which)[index]
    signature, attrs, consts = {}, {}, with_constexpr_defaults(kern, const)
    for i, name in enumerate(kern.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name in ("Q", "K", "V", "K2", "V2", "Out"):
            if const.get("ADDR") == "tma" and name in ("K", "V"):
                signature[name] = f"tensordesc<{dt}[1, 1, {const['BLOCK_N']}, {const['BLOCK_D']}]>"
            elif const.get("ADDR") == "tma" and name in ("K2", "V2"):
                signature[name] = f"tensordesc<{dt}[1, 1, {const['BLOCK_N']}, {const['BLOCK_D2']}]>"
            else:
                signature[name] = "*" + dt
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("Lse", "Part"):
            signature[name] = "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "qk_scale":
            signature[name] = "fp32"
        elif name.startswith("stride") and name.endswith("d"):
            signature[name] = "constexpr"
            consts[name] = 1
        else:
            signature[name] = "i32"
            if name.startswith("stride"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sm90a_build_problem(label, kern, signature, consts, attrs, opts)


def _compile_in_subprocess(which: str) -> None:
    assert_none_without_interpreter("test_attention", f"_compile_attention_for_sm90a({which!r})", 3000)


@pytest.mark.skipif(HAS_CUDA, reason="the GPU run compiles and runs every kernel itself")
def test_triton_attention_compiles_for_sm90a():
    """Every config the sm90 table gives (bf16/fp16 and float32, five head dims, both causal modes
    and size classes) compiles for sm_90a without register spills. CPU CI: what only the compiler
    rejects, or a tile that no longer fits, fails here, not on the GPU. ~50 kernels, two compiles
    at a time in a subprocess without TRITON_INTERPRET (~1-2 min)."""
    _compile_in_subprocess("shipped")


@pytest.mark.slow
@pytest.mark.skipif(HAS_CUDA, reason="the GPU run compiles and runs every kernel itself")
def test_triton_attention_sweep_candidates_compile_for_sm90a():
    """Every candidate of benchmarks/tune_triton_attention.py compiles for sm_90a without spills
    (~170 kernels, ~6 min: run it after changing the candidates or the kernels, with -m slow)."""
    _compile_in_subprocess("candidates")


# -- bad input: one test per message of _checks.check_attention ------------------------------------
def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=device)


BAD_INPUTS = {
    "not_tensor": (lambda: ([[1.0]], _t(1, 1, 2, 8), _t(1, 1, 2, 8)), {}, TypeError, "q must be a torch.Tensor"),
    "ndim": (lambda: (_t(2, 8, 64), _t(2, 8, 64), _t(2, 8, 64)), {}, ValueError, r"q must have 4 dims \(B, H, N, D\)"),
    "int_dtype": (lambda: (_t(1, 1, 2, 8, dtype=torch.int32), _t(1, 1, 2, 8), _t(1, 1, 2, 8)), {}, TypeError,
                  "q must be a floating-point tensor"),
    "unsupported_dtype": (lambda: (_t(1, 1, 2, 8, dtype=torch.float8_e4m3fn),) * 3, {}, TypeError,
                          "q must be float16, bfloat16 or float32"),
    "dtype_mismatch": (lambda: (_t(1, 1, 2, 8), _t(1, 1, 2, 8, dtype=torch.float16), _t(1, 1, 2, 8)), {},
                       TypeError, "k must have q's dtype float32"),
    "device_mismatch": (lambda: (_t(1, 1, 2, 8), _t(1, 1, 2, 8), _t(1, 1, 2, 8, device="meta")), {},
                        ValueError, "v must be on q's device"),
    "kv_shape": (lambda: (_t(1, 2, 2, 8), _t(1, 2, 3, 8), _t(1, 2, 4, 8)), {}, ValueError,
                 "k and v must have the same shape"),
    "batch": (lambda: (_t(2, 2, 2, 8), _t(1, 2, 3, 8), _t(1, 2, 3, 8)), {}, ValueError, "k must have q's batch size 2"),
    "head_dim": (lambda: (_t(1, 2, 2, 8), _t(1, 2, 3, 16), _t(1, 2, 3, 16)), {}, ValueError,
                 "k and v must have q's head dim 8"),
    "gqa_ratio": (lambda: (_t(1, 6, 2, 8), _t(1, 4, 3, 8), _t(1, 4, 3, 8)), {}, ValueError,
                  r"q's heads \(6\) must be a multiple of k/v's heads \(4\)"),
    "zero_kv_heads": (lambda: (_t(1, 6, 2, 8), _t(1, 0, 3, 8), _t(1, 0, 3, 8)), {}, ValueError,
                      "must be a multiple of k/v's heads"),
    "d_too_big": (lambda: (_t(1, 1, 2, 257),) * 3, {}, ValueError, r"head dim D must be in \[1, 256\], got 257"),
    "scale_str": (lambda: (_t(1, 1, 2, 8),) * 3, {"scale": "0.1"}, TypeError, "scale must be None or a float"),
    "scale_bool": (lambda: (_t(1, 1, 2, 8),) * 3, {"scale": True}, TypeError, "scale must be None or a float"),
    "scale_nan": (lambda: (_t(1, 1, 2, 8),) * 3, {"scale": float("nan")}, ValueError, "scale must be finite"),
    "scale_inf": (lambda: (_t(1, 1, 2, 8),) * 3, {"scale": float("inf")}, ValueError, "scale must be finite"),
    "causal_int": (lambda: (_t(1, 1, 2, 8),) * 3, {"causal": 1}, TypeError, "causal must be a bool"),
    "fp64_triton": (lambda: (_t(1, 1, 2, 8, dtype=torch.float64, device=device_for("triton")),) * 3,
                    {"backend": "triton"}, TypeError,
                    "backend='triton' supports dtypes float32, float16, bfloat16, got float64"),
    "cuda_on_cpu": (lambda: (_t(1, 1, 2, 8),) * 3, {"backend": "cuda"}, ValueError,
                    "backend='cuda' needs CUDA tensors, got q on cpu"),
    "unknown_backend": (lambda: (_t(1, 1, 2, 8),) * 3, {"backend": "numpy"}, ValueError,
                        "backend must be None or one of"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input(name):
    make, kwargs, exc, match = BAD_INPUTS[name]
    if name == "fp64_triton" and not backend_available("triton"):
        pytest.skip(skip_reason("triton"))  # without a device the "needs CUDA tensors" check fires first
    with pytest.raises(exc, match=match):
        ta.attention(*make(), **kwargs)


def test_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
        ta.attention(*(_t(1, 1, 2, 8),) * 3, backend="triton")
