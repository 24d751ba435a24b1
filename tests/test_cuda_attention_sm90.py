"""The wgmma attention forwards (csrc/attention/sm90/, sm_90a: the cp.async kernel "wgmma" and the
warp-specialized TMA kernel "wgmma_ws"), beside the mma.sync kernel.

On a machine without a GPU:
1. configs.CUDA_ATTENTION's ("fwd_wgmma", "sm90", "*", D) rows mirror flash_fwd_sm90::Traits, the
   instantiated head dims (flash_fwd_sm90_hdim*.cu, Sm90HeadDims / Sm90WsHeadDims in flash_fwd_sm90.cu,
   cuda.attention.SM90_HEAD_DIMS / SM90_WS_HEAD_DIMS) agree, and every existing forward row still runs
   the mma kernel.
2. The build takes csrc/attention/sm90/*.cu for compute capability 9.0 only (bindings.cpp with the
   wgmma entry bound: tests/test_cuda_build.py::test_bindings_compile_against_torch_headers).
3. Both kernels, unchanged, run in tests/emulation/flash_fwd_sm90_emulator.cpp: every CUDA thread
   a CPU fiber; wgmma (descriptors, swizzled canonical layouts, register fragments, fence / commit /
   wait semantics), cp.async, fence.proxy.async, shfl, __syncthreads, mbarrier phases and tx counts,
   TMA boxes (128-byte swizzle, zero fill, completion deferred to a random later point) and
   setmaxnreg emulated from the PTX ISA; float64 reference on ragged sizes, causal, GQA/MQA, empty
   rows, no keys, negative scale; race, proxy and mbarrier-phase checks. ~30 s for the five head dims
   (96 and 192: the warp-specialized kernel only).
4. kernel selection errors (ValueError naming the argument) and backend=None's reading of
   configs.ATTENTION_SELECT, without a GPU.
On an sm_90 GPU (skipped elsewhere): ta.attention(..., backend="cuda") with each wgmma kernel forced, the
DESIGN §4 rule against float64 over the issue's shape grid (tests/test_attention.py's helpers); and
backend=None where the table selects wgmma_ws: that kernel runs, forward and gradients under the rule.
"""
from __future__ import annotations

import math
import os
import pathlib
import re
import subprocess

import pytest
import torch

import tiled_attn as ta
from tiled_attn import configs
from tiled_attn.cuda import _build
from tiled_attn.cuda import attention as cuda_attention

from helpers import (HAS_CUDA, INTERPRET, backend_available, build_attention_emulator, fresh_seed,
                     run_attention_emulator)
from test_attention import DT, HEADS, SHAPES, _check, _qkv

ROOT = pathlib.Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
SM90 = CSRC / "attention" / "sm90"


# ------------------------------------------------------------------------------------------------
# 1. tables
# ------------------------------------------------------------------------------------------------
def _traits() -> dict:
    """kWarpGroups, kStages and kBlockN(D) of flash_fwd_sm90::Traits."""
    text = (SM90 / "flash_fwd_sm90_kernel.cuh").read_text()
    wgs = int(re.search(r"kWarpGroups = (\d+);", text).group(1))
    stages = int(re.search(r"kStages = (\d+);", text).group(1))
    m = re.search(r"kBlockN = kHeadDim <= (\d+) \? (\d+) : (\d+);", text)
    assert m, "kBlockN's formula changed: update this test"
    limit, small_d, large_d = (int(x) for x in m.groups())
    return {"warpgroups": wgs, "stages": stages, "block_n": lambda d: small_d if d <= limit else large_d}


def test_wgmma_rows_mirror_the_traits():
    t = _traits()
    rows = {k[3]: r for k, r in configs.CUDA_ATTENTION.items() if k[0] == "fwd_wgmma"}
    assert tuple(sorted(rows)) == cuda_attention.SM90_HEAD_DIMS
    for d, row in rows.items():
        assert row == {"kernel": "wgmma", "block_m": 64 * t["warpgroups"], "block_n": t["block_n"](d),
                       "warpgroups": t["warpgroups"], "stages": t["stages"], "swizzle": 128}, d
    files = {int(p.stem.removeprefix("flash_fwd_sm90_hdim")): p.read_text() for p in SM90.glob("flash_fwd_sm90_hdim*.cu")}
    assert tuple(sorted(files)) == cuda_attention.SM90_WS_HEAD_DIMS
    for d, text in files.items():  # each file instantiates the kernels that take its head dim
        assert (f"run_flash_fwd_sm90<{d}," in text) == (d in cuda_attention.SM90_HEAD_DIMS), d
        assert f"run_flash_fwd_sm90_ws<{d}," in text, d
    src = (SM90 / "flash_fwd_sm90.cu").read_text()
    for name, dims in (("Sm90HeadDims", cuda_attention.SM90_HEAD_DIMS), ("Sm90WsHeadDims", cuda_attention.SM90_WS_HEAD_DIMS)):
        dispatched = re.search(rf"using {name} = flash_fwd::HeadDims<([\d, ]+)>;", src)
        assert dispatched, f"no {name} (the C++ dispatch's head dims) in flash_fwd_sm90.cu"
        assert tuple(int(c) for c in dispatched.group(1).split(",")) == dims
    assert set(cuda_attention.SM90_HEAD_DIMS) <= set(cuda_attention.SM90_WS_HEAD_DIMS) <= set(cuda_attention.HEAD_DIMS)
    assert cuda_attention.sm90_head_dims("wgmma") == cuda_attention.SM90_HEAD_DIMS
    assert cuda_attention.sm90_head_dims("wgmma_ws") == cuda_attention.SM90_WS_HEAD_DIMS


def test_tile_rows_still_name_mma():
    """The tile_config rows keep the mma kernel: the wgmma_ws kernel is chosen per size by
    configs.ATTENTION_SELECT, not by a row that holds for every N."""
    for key, row in configs.CUDA_ATTENTION.items():
        if key[0] == "fwd":
            assert row.get("kernel", "mma") == "mma", key


def test_attention_select_rows_are_well_formed():
    for (arch, d, causal), rows in configs.ATTENTION_SELECT.items():
        assert arch == "sm90" and isinstance(causal, bool), (arch, d, causal)
        assert rows and [r[0] for r in rows] == sorted((r[0] for r in rows), reverse=True), \
            f"{(arch, d, causal)}: rows are read in order, so n_min must fall"
        for n_min, backend, kernel in rows:
            assert isinstance(n_min, int) and n_min >= 1 and backend in ("triton", "cuda")
            if backend == "cuda":
                assert kernel in cuda_attention.KERNELS
                assert kernel not in cuda_attention.SM90_KERNELS or d in cuda_attention.sm90_head_dims(kernel)


class _FakeCuda:
    """Just what backend=None's selection reads of a CUDA tensor (no GPU needed)."""

    def __init__(self, shape, dtype=torch.bfloat16, strides=None):
        self.shape, self.dtype, self.device = torch.Size(shape), dtype, torch.device("cuda", 0)
        self._strides = strides or torch.empty(shape, device="meta").stride()

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]


def test_backend_none_reads_attention_select(monkeypatch):
    import importlib
    from tiled_attn import cuda
    attention_mod = importlib.import_module("tiled_attn.attention")  # (the package exports the function)
    monkeypatch.setattr(configs, "arch", lambda device: "sm90")
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(configs, "ATTENTION_SELECT",
                        configs._Table({("sm90", 128, False): ((4096, "triton", None), (1024, "cuda", "wgmma_ws"))}))
    assert configs.attention_select("sm90", 128, False, 8192) == ("triton", None)
    assert configs.attention_select("sm90", 128, False, 1024) == ("cuda", "wgmma_ws")
    assert configs.attention_select("sm90", 128, False, 1023) is None
    assert configs.attention_select("sm90", 128, True, 2048) is None

    def pick(nq=2048, nk=2048, d=128, causal=False, dtype=torch.bfloat16, v_strides=None):
        q, k = _FakeCuda((2, 4, nq, d), dtype), _FakeCuda((2, 4, nk, d), dtype)
        v = _FakeCuda((2, 4, nk, d), dtype, v_strides)
        return attention_mod._backend_for(q, k, causal, nk - nq, True, None, None, v)

    assert pick() == "cuda"
    assert pick(nq=1000) == "triton"            # min(Nq, Nk) below every row: the default
    assert pick(nk=1000) == "triton"
    assert pick(nq=8192, nk=8192) == "triton"   # a "triton" row
    assert pick(causal=True) == "triton"        # no row for the key
    assert pick(d=64) == "triton"
    assert pick(dtype=torch.float32) == "triton"
    assert pick(dtype=torch.float16) == "cuda"
    assert pick(v_strides=(4 * 2048 * 128, 2048 * 128, 128, 2)) == "triton"  # v not read in place
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    assert pick() == "triton"                    # no extension here: never a failing call
    # backend="cuda" (or a plan of backend=None's "cuda") gets the row's kernel at that size.
    monkeypatch.setattr(cuda_attention, "_capability", lambda device: (9, 0))
    q = _FakeCuda((1, 1, 2048, 128))
    assert cuda_attention.select_kernel(None, q, False, 2048) == "wgmma_ws"
    assert cuda_attention.select_kernel(None, q, False, 512) == "mma"
    assert cuda_attention.select_kernel(None, q, False) == "mma"
    assert cuda_attention.select_kernel("mma", q, False, 2048) == "mma"


# ------------------------------------------------------------------------------------------------
# 2. build
# ------------------------------------------------------------------------------------------------
def test_sources_take_sm90_only_on_hopper():
    sm90 = {p.name for p in SM90.glob("*.cu")}
    assert sm90 >= {"flash_fwd_sm90.cu", "flash_fwd_sm90_hdim128.cu"}
    for cap, want in (((9, 0), True), ((8, 0), False), ((10, 0), False), (None, False)):
        srcs, with_attention = _build.sources(CSRC, cap)
        assert with_attention
        assert (sm90 <= {p.name for p in srcs}) == want, cap
        assert _build.with_sm90(CSRC, cap) == want


# ------------------------------------------------------------------------------------------------
# 3. the kernel in the emulator
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> pathlib.Path:
    return build_attention_emulator("flash_fwd_sm90_emulator", tmp_path_factory.mktemp("emu"))


@pytest.mark.parametrize("head_dim", cuda_attention.SM90_WS_HEAD_DIMS)
def test_kernel_in_the_emulator(emulator, head_dim):
    out = run_attention_emulator(emulator, head_dim, timeout=1200)
    assert re.search(r"^0 of \d+ cases failed$", out, re.M), out[-3000:]
    # every kernel of the head dim ran its cases
    for kernel in ("cp.async", "ws", "ws_split", "ws_other", "ws_dynamic", "ws_alt"):
        ran = out.count(f"\nok   {kernel} ")
        if kernel == "cp.async" and head_dim not in cuda_attention.SM90_HEAD_DIMS:
            assert ran == 0, out[-3000:]
        else:
            assert ran >= 10, (kernel, out[-3000:])


@pytest.mark.parametrize("head_dim", cuda_attention.SM90_WS_HEAD_DIMS)
def test_emulator_catches_a_slot_released_by_too_few_consumers(emulator, head_dim):
    """The emulator's own check. A lagging consumer warpgroup (TILED_ATTN_EMU_LAG: the others run as
    far ahead as the kernel's barriers let them) with the slot-release barrier counting one consumer
    warpgroup too few (TILED_ATTN_EMU_MUTATE=short_count: the producer refills a slot the laggard
    has not read) fails the warp-specialized kernel; the same schedule passes the kernel as written.
    Before the lag schedule, the three-consumer case of this bug passed (warpgroups kept in step)."""
    seed = str(fresh_seed())
    base = {**os.environ, "TILED_ATTN_EMU_LAG": "2"}
    # ws_split: its K and V releases both counted short; ws_other: the tile on its other grid (the
    # persistent one's Q release counted short too, at D <= 128 in ws / ws_split, at 192 / 256 here);
    # ws_dynamic: the counter-fed persistent grid; ws_alt: the ping-pong, wide stores and local order flipped.
    for kernel in ("ws", "ws_split", "ws_other", "ws_dynamic", "ws_alt"):
        ran = {}
        for mutate in ("", "short_count"):
            env = {**base, "TILED_ATTN_EMU_MUTATE": mutate}
            r = subprocess.run([str(emulator), str(head_dim), seed, kernel], capture_output=True, text=True,
                               timeout=600, env=env)
            ran[mutate] = (r.returncode, r.stdout)
        (rc_ok, out_ok), (rc_bad, out_bad) = ran[""], ran["short_count"]
        assert rc_ok == 0 and re.search(r"^0 of \d+ cases failed$", out_ok, re.M), (kernel, seed, out_ok[-3000:])
        assert rc_bad == 1 and re.search(rf"^FAIL {kernel} .*(deadlock|before .* waited|overwrites|lands on)",
                                         out_bad, re.M), (kernel, seed, out_bad[-3000:])


@pytest.mark.parametrize("head_dim", (64, 192))
def test_emulator_catches_a_lost_ping_pong_hand_over(emulator, head_dim):
    """The consumers' ping-pong (WsTraits::kPingPong, off by default: ws_alt turns it on, with three
    consumers at D = 64, two at 192) with every bar.arrive lost (TILED_ATTN_EMU_MUTATE=drop_arrive):
    the next consumer never gets the token, and the emulator reports the deadlock; the kernel as
    written passes the same seed."""
    seed = str(fresh_seed())
    for mutate in ("", "drop_arrive"):
        r = subprocess.run([str(emulator), str(head_dim), seed, "ws_alt"], capture_output=True, text=True,
                           timeout=600, env={**os.environ, "TILED_ATTN_EMU_MUTATE": mutate})
        if mutate:
            assert r.returncode == 1 and re.search(r"^FAIL ws_alt .*deadlock", r.stdout, re.M), r.stdout[-3000:]
        else:
            assert r.returncode == 0 and re.search(r"^0 of \d+ cases failed$", r.stdout, re.M), r.stdout[-3000:]


# ------------------------------------------------------------------------------------------------
# 4. selection errors (no GPU needed)
# ------------------------------------------------------------------------------------------------
def test_kernel_argument_errors(monkeypatch):
    q = torch.zeros(1, 1, 4, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"kernel must be one of \('mma', 'wgmma', 'wgmma_ws'\) or None, got 'hgmma'"):
        cuda_attention.select_kernel("hgmma", q)
    for kernel in cuda_attention.SM90_KERNELS:
        with pytest.raises(ValueError, match=rf"kernel='{kernel}' needs an sm_90 \(Hopper\) CUDA device, got cpu"):
            cuda_attention.select_kernel(kernel, q)
    with pytest.raises(ValueError, match=r"kernel must be one of"):
        with cuda_attention.forced_kernel("tcgen05"):
            pass
    assert cuda_attention.select_kernel(None, q) == "mma"
    assert cuda_attention.select_kernel("mma", q) == "mma"
    # The config row's field is what kernel=None reads.
    key = ("fwd", "any", "*", 128)
    monkeypatch.setitem(configs.CUDA_ATTENTION, key, {**configs.CUDA_ATTENTION[key], "kernel": "wgmma"})
    with pytest.raises(ValueError, match=r"kernel='wgmma' needs an sm_90"):
        cuda_attention.select_kernel(None, q)
    with cuda_attention.forced_kernel("wgmma"):
        assert cuda_attention._forced[0] == "wgmma"
    assert cuda_attention._forced[0] is None


def test_head_dim_error_on_hopper(monkeypatch):
    monkeypatch.setattr(cuda_attention, "_capability", lambda device: (9, 0))  # as if on an H100
    with pytest.raises(ValueError, match=r"kernel='wgmma' supports head dims \(64, 128, 256\), got D=96"):
        cuda_attention.select_kernel("wgmma", torch.zeros(1, 1, 4, 96, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"kernel='wgmma_ws' supports head dims \(64, 96, 128, 192, 256\), got D=32"):
        cuda_attention.select_kernel("wgmma_ws", torch.zeros(1, 1, 4, 32, dtype=torch.float16))
    for kernel in cuda_attention.SM90_KERNELS:
        assert cuda_attention.select_kernel(kernel, torch.zeros(1, 1, 4, 256, dtype=torch.float16)) == kernel
    assert cuda_attention.select_kernel("wgmma_ws", torch.zeros(1, 1, 4, 96, dtype=torch.float16)) == "wgmma_ws"
    assert cuda_attention.select_kernel("wgmma_ws", torch.zeros(1, 1, 4, 192, dtype=torch.float16)) == "wgmma_ws"


# ------------------------------------------------------------------------------------------------
# On the GPU: the wgmma kernel forced behind ta.attention(..., backend="cuda")
# ------------------------------------------------------------------------------------------------
def _hopper() -> bool:
    return HAS_CUDA and not INTERPRET and torch.cuda.get_device_capability() == (9, 0)


GPU = pytest.mark.skipif(not _hopper() or not backend_available("cuda"),
                         reason="the wgmma kernel runs on an sm_90 (Hopper) CUDA device with the extension built")
GRID = [pytest.param(kernel, shape, d, causal, heads, dtype,
                     id=f"{kernel}-{shape[0]}x{shape[1]}-{d}-{'causal' if causal else 'full'}-{heads}-{DT[dtype]}")
        for kernel in cuda_attention.SM90_KERNELS
        for shape in SHAPES for d in cuda_attention.sm90_head_dims(kernel) for causal in (False, True)
        for heads in HEADS for dtype in (torch.float16, torch.bfloat16)]


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("kernel,shape,d,causal,heads,dtype", GRID)
def test_wgmma_grid(kernel, shape, d, causal, heads, dtype, seed):
    nq, nk = shape
    hq, hkv = HEADS[heads]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, hq, hkv, nq, nk, d, dtype, "cuda", gen)
    with cuda_attention.forced_kernel(kernel):
        out, lse = ta.attention(q, k, v, causal=causal, return_lse=True, backend="cuda")
    what = f"{kernel} B=2 H={hq}/{hkv} Nq={nq} Nk={nk} D={d} {DT[dtype]} causal={causal}"
    _check(out, lse, q, k, v, causal, nk - nq, 1.0 / math.sqrt(d), seed, what)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("kernel,d", [(k, d) for k in cuda_attention.SM90_KERNELS for d in cuda_attention.sm90_head_dims(k)])
def test_wgmma_strided_views_and_offsets(kernel, d, seed):
    """q/k/v split from one packed (B, N, 3, H, D) projection (read in place: TMA maps over the
    strided views), causal offsets that leave rows empty, and the explicit kernel= argument of
    attention_forward."""
    gen = torch.Generator().manual_seed(seed)
    b, n, h = 2, 300, 4
    qkv = torch.randn(b, n, 3, h, d, generator=gen).to(torch.bfloat16).cuda()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    for offset in (-120, 0, 77):
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:3], float("nan"), device="cuda")
        cuda_attention.attention_forward(q, k, v, out, lse, 1.0 / math.sqrt(d), True, offset, kernel=kernel)
        _check(out, lse, q, k, v, True, offset, 1.0 / math.sqrt(d), seed, f"{kernel} packed D={d} offset={offset}")


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("d", cuda_attention.SM90_WS_HEAD_DIMS)
def test_wgmma_ws_long_keys_and_many_heads(d, seed):
    """The TMA ring wraps many times (8k keys: 64-128 tiles over 2-4 slots), GQA 8:1 with B·Hq past
    one wave of CTAs, and a (B, N, H, D) layout (the head stride is D, the seq stride H·D)."""
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, nq, nk = 3, 16, 2, 257, 8191
    q = torch.randn(b, nq, hq, d, generator=gen).to(torch.float16).cuda().transpose(1, 2)
    k, v = (torch.randn(b, nk, hkv, d, generator=gen).to(torch.float16).cuda().transpose(1, 2) for _ in range(2))
    for causal in (False, True):
        with cuda_attention.forced_kernel("wgmma_ws"):
            out, lse = ta.attention(q, k, v, causal=causal, return_lse=True, backend="cuda")
        _check(out, lse, q, k, v, causal, nk - nq, 1.0 / math.sqrt(d), seed,
               f"wgmma_ws long keys D={d} causal={causal}")


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("d", cuda_attention.SM90_WS_HEAD_DIMS)
def test_wgmma_ws_persistent_walk(d, seed):
    """The persistent grid (WsTraits::kPersistent): far more query tiles than SMs, so each CTA walks
    several, the K / V ring and Q's full / empty phases running on across them; ragged last tiles; GQA
    4:1; the schedule's sections of one to all pairs (short keys: every pair in one section; 16k keys:
    a few pairs per section at D >= 128, against the L2's size). Causal and not, every batch entry
    checked on the short keys, two on the long ones."""
    from test_cuda_attention_kernel import _check_batches
    gen = torch.Generator().manual_seed(seed)
    for b, nq, nk, batches in ((4, 1000, 1000, range(4)), (2, 300, 16000, (0, 1))):
        q, k, v = _qkv(b, 32, 8, nq, nk, d, torch.bfloat16, "cuda", gen)
        for causal in (False, True):
            with cuda_attention.forced_kernel("wgmma_ws"):
                out, lse = ta.attention(q, k, v, causal=causal, return_lse=True, backend="cuda")
            _check_batches(out, lse, q, k, v, causal, nk - nq, 1.0 / math.sqrt(d), seed,
                           f"wgmma_ws persistent B={b} Nq={nq} Nk={nk} D={d} causal={causal}", batches)


def _kernel_names(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("d", cuda_attention.SM90_WS_HEAD_DIMS)
@pytest.mark.parametrize("causal", (False, True))
def test_backend_none_runs_wgmma_ws_where_selected(d, causal, seed, monkeypatch):
    """Where configs.ATTENTION_SELECT names the CUDA wgmma_ws kernel (a row set here for every head
    dim, whatever the table holds today), backend=None runs it (the profiler sees that kernel and no
    Triton forward), its out and lse pass the rule, and the gradients through it (the Triton
    backward from the CUDA forward's lse) pass the backward rule."""
    from test_attention_backward import _check as check_grads
    from test_attention_backward import _ours as grads_of
    monkeypatch.setitem(configs.ATTENTION_SELECT, ("sm90", d, causal), ((512, "cuda", "wgmma_ws"),))
    gen = torch.Generator().manual_seed(seed)
    nq, nk = 517, 645
    q, k, v = _qkv(1, 4, 2, nq, nk, d, torch.bfloat16, "cuda", gen)
    names = _kernel_names(lambda: ta.attention(q, k, v, causal=causal))
    assert any("flash_fwd_sm90_ws_kernel" in n for n in names), names
    assert not any("attention_fwd" in n and "kernel" in n and "sm90" not in n for n in names), names
    out, lse = ta.attention(q, k, v, causal=causal, return_lse=True)
    _check(out, lse, q, k, v, causal, nk - nq, 1.0 / math.sqrt(d), seed, f"backend=None wgmma_ws D={d}")
    go = torch.randn(q.shape, generator=gen).to(torch.bfloat16).cuda()
    grads = grads_of(q, k, v, go, causal=causal)
    check_grads(grads, q, k, v, go, None, causal, None, nk - nq, seed, f"backend=None wgmma_ws grads D={d}")
    # Below the row's n_min the default (Triton) runs.
    names = _kernel_names(lambda: ta.attention(q[:, :, :500], k, v, causal=causal))
    assert not any("flash_fwd_sm90" in n for n in names), names


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or INTERPRET or _hopper() or not backend_available("cuda"),
                    reason="the wrong-arch error needs a CUDA device other than sm_90")
def test_wgmma_refused_off_hopper():
    q = torch.zeros(1, 1, 4, 128, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match=r"kernel='wgmma' needs an sm_90"):
        with cuda_attention.forced_kernel("wgmma"):
            ta.attention(q, q, q, backend="cuda")
