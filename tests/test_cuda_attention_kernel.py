"""The CUDA attention kernel (csrc/attention/) on a machine without a GPU.

1. configs.CUDA_ATTENTION mirrors the templates' TileConfig rows, the instantiated head dims and the
   C++ dispatch list (FwdHeadDims) (the kernel runs the C++ rows; the table documents them);
   the sweep's variant table (csrc/attention/sweep/) and its script agree on the flags.
2. The kernel itself, unchanged, runs in tests/emulation/flash_fwd_emulator.cpp: every CUDA thread a
   CPU fiber, ldmatrix / mma.sync / cp.async / shfl / vote / __syncthreads emulated from the PTX ISA
   tables, against a float64 reference (ragged N, GQA, causal offsets, empty rows, no keys, negative
   and zero scale), with checks for writes outside out/lse and shared-memory races (a cp.async
   destination read before its wait_group + barrier, or overwritten while another warp may still
   read it) — for the default rows (attention_fwd) and for every sweep variant of the head dim.
   Needs g++ and the CUDA headers (the nvcc toolchain); ~3 minutes for all head dims on 2 cores.
3. The sweep's ctypes library builds and lists its variants (needs nvcc; ~15 s: one variant).
4. Split-KV (flash-decoding): the ("decode", ...) rows mirror DecodeConfig<D>; split_plan's choices
   (split for decode shapes, enough CTAs, no empty split); the emulator runs the split kernel and the
   merge kernel (its split cases: Nq = 1 and 3, ragged Nk 1-4099, 1-7 splits incl. splits past the
   keys and splits a causal row does not see, GQA groups 1/4/8, every head dim, both dtypes). On a
   GPU: forced and planned split launches against float64 (test_split_kv_*), and a decode step
   captured in a CUDA graph and replayed on new inputs.
The GPU run (tests/test_attention.py with backend="cuda", compute-sanitizer) is the real check.
"""
from __future__ import annotations

import ctypes
import json
import math
import pathlib
import re
import shutil

import pytest
import torch

from tiled_attn import configs
from tiled_attn.cuda import attention as cuda_attention

from helpers import build_attention_emulator, run_attention_emulator

ROOT = pathlib.Path(__file__).resolve().parents[1]
ATTN = ROOT / "csrc" / "attention"


FLAG_NAMES = {"kQRegs": "q_in_regs", "kFold": "fold", "kLean": "lean", "kJoint": "joint", "kSkew": "skew",
              "kLazy": "lazy"}


def _cfg_row(args: str) -> dict:
    """'128, 64, 4, 2, flag::kQRegs | flag::kFold[, 3]' -> the configs.CUDA_ATTENTION row."""
    parts = [a.strip() for a in args.split(",")]
    assert len(parts) in (5, 6), f"Cfg<{args}>: 5 or 6 arguments expected"
    bm, bn, w, st = (int(x) for x in parts[:4])
    names = [] if parts[4] == "0" else [f.strip().removeprefix("flag::") for f in parts[4].split("|")]
    assert all(n in FLAG_NAMES for n in names), f"unknown flag in Cfg<{args}>"
    flags = tuple(FLAG_NAMES[n] for n in FLAG_NAMES if n in names)  # the header's bit order
    return {"block_m": bm, "block_n": bn, "warps": w, "stages": st, "flags": flags,
            "min_blocks": int(parts[5]) if len(parts) == 6 else 1}


def _tile_configs(attn_dir: pathlib.Path = ATTN) -> dict:
    """TileConfig<D> and TileConfig<D, true> rows of flash_fwd.cuh, keyed like CUDA_ATTENTION."""
    text = (attn_dir / "flash_fwd.cuh").read_text()
    pattern = re.compile(r"template <>\s*struct TileConfig<(\d+)(, true)?> \{\s*using type = Cfg<([^>]*)>;\s*\};")
    rows = {}
    for m in pattern.finditer(text):
        key = ("fwd", "any", "*", int(m.group(1))) + (("causal",) if m.group(2) else ())
        rows[key] = _cfg_row(m.group(3))
    return rows


def test_table_mirrors_the_templates():
    templates = _tile_configs()
    assert templates, "no TileConfig<D> specialization parsed from csrc/attention/flash_fwd.cuh"
    table = {key: {**row, "flags": tuple(row["flags"])} for key, row in configs.CUDA_ATTENTION.items()
             if key[0] == "fwd"}
    assert table == templates, "configs.CUDA_ATTENTION differs from TileConfig<D> in flash_fwd.cuh"
    plain = tuple(sorted(key[3] for key in templates if len(key) == 4))
    assert plain == cuda_attention.HEAD_DIMS
    files = sorted(int(p.stem.removeprefix("flash_fwd_hdim")) for p in ATTN.glob("flash_fwd_hdim*.cu"))
    assert tuple(files) == cuda_attention.HEAD_DIMS, "one flash_fwd_hdim<D>.cu per supported head dim"
    dispatched = re.search(r"using FwdHeadDims = HeadDims<([\d, ]+)>;", (ATTN / "flash_fwd.cuh").read_text())
    assert dispatched, "no FwdHeadDims (the C++ dispatch's head dims) in flash_fwd.cuh"
    assert tuple(int(c) for c in dispatched.group(1).split(",")) == cuda_attention.HEAD_DIMS
    for d in cuda_attention.HEAD_DIMS:
        causal_key = ("fwd", "any", "*", d, "causal")
        assert cuda_attention.tile_config(d, causal=True) == configs.CUDA_ATTENTION.get(
            causal_key, configs.CUDA_ATTENTION[("fwd", "any", "*", d)])


def _sweep_module():
    import importlib
    return importlib.import_module("benchmarks.sweep_cuda_attention")


def test_sweep_table_and_script_agree():
    sweep = _sweep_module()
    header = (ATTN / "flash_fwd.cuh").read_text()
    bits = {name: int(v) for name, v in re.findall(r"constexpr unsigned (k\w+) = (\d+);", header)}
    assert bits and set(bits) == set(FLAG_NAMES), f"flags in flash_fwd.cuh: {sorted(bits)}"
    assert {bit: name for name, bit in bits.items()} == sweep.FLAGS
    assert {bits[n]: c for n, c in FLAG_NAMES.items()} == sweep.CONFIG_FLAGS
    text = (ATTN / "sweep" / "flash_fwd_sweep.cuh").read_text()
    body = text[text.index("kSweep[] = {"):text.index("#undef F")]
    rows = re.findall(r"^\s*\{(\d+), (\d+), (\d+), (\d+), (\d+), ([^,]+), (\d+), \"", body, flags=re.M)
    assert len(rows) == sweep.variant_count() > 0
    for d, *_ in rows:
        assert int(d) in cuda_attention.HEAD_DIMS
    # The kWs rows (the sm90 warp-specialized kernel): the script's bit and row list are the header's.
    assert int(re.search(r"constexpr unsigned kWs = 1u << (\d+);", text).group(1)) == sweep.WS.bit_length() - 1
    assert int(re.search(r"constexpr unsigned kWsSplit = 1u << (\d+);", text).group(1)) == sweep.WS_SPLIT.bit_length() - 1
    ws = [i for i, r in enumerate(rows) if re.search(r"\bkWs\b", r[5])]
    assert int(re.search(r"constexpr unsigned kWsSingle = 1u << (\d+);", text).group(1)) == sweep.WS_SINGLE.bit_length() - 1
    assert int(re.search(r"constexpr unsigned kWsDynamic = 1u << (\d+);", text).group(1)) == sweep.WS_DYNAMIC.bit_length() - 1
    assert int(re.search(r"constexpr unsigned kWsPingPong = 1u << (\d+);", text).group(1)) == sweep.WS_PING_PONG.bit_length() - 1
    assert int(re.search(r"constexpr unsigned kWsWide = 1u << (\d+);", text).group(1)) == sweep.WS_WIDE.bit_length() - 1
    assert int(re.search(r"constexpr unsigned kWsLocal = 1u << (\d+);", text).group(1)) == sweep.WS_LOCAL.bit_length() - 1
    # a split, single, dynamic, ping-pong, wide or local row is a kWs row; a dynamic one is persistent (not single)
    assert all(re.search(r"\bkWs\b", r[5]) for r in rows if re.search(r"kWs(Split|Single|Dynamic|PingPong|Wide|Local)", r[5]))
    assert not any("kWsDynamic" in r[5] and "kWsSingle" in r[5] for r in rows)
    assert ws and ws == sweep.ws_rows()
    for i in ws:
        d, bm, bn = (int(x) for x in rows[i][:3])
        assert d in cuda_attention.SM90_WS_HEAD_DIMS and bm % 64 == 0 and bn % 16 == 0


def test_sweep_apply_writes_mirrored_rows(tmp_path):
    """--apply rewrites TileConfig and CUDA_ATTENTION so that they still mirror each other, with a
    causal row only where the split pays, and is idempotent."""
    sweep = _sweep_module()
    (tmp_path / "csrc" / "attention").mkdir(parents=True)
    (tmp_path / "tiled_attn").mkdir()
    shutil.copy(ATTN / "flash_fwd.cuh", tmp_path / "csrc" / "attention")
    shutil.copy(ROOT / "tiled_attn" / "configs.py", tmp_path / "tiled_attn")
    variants = [{"index": 3, "head_dim": 64, "block_m": 128, "block_n": 64, "warps": 4, "stages": 2, "flags": 1 | 2 | 32,
                 "min_blocks": 1},
                {"index": 6, "head_dim": 64, "block_m": 256, "block_n": 64, "warps": 8, "stages": 2, "flags": 16,
                 "min_blocks": 1},
                {"index": 9, "head_dim": 128, "block_m": 128, "block_n": 32, "warps": 4, "stages": 3, "flags": 4 | 8,
                 "min_blocks": 3}]
    picks = {"64/all": {"variant": 3, "min_ratio": 1.01, "geomean_ratio": 1.05},
             "64/plain": {"variant": 6, "min_ratio": 1.10, "geomean_ratio": 1.12},
             "64/causal": {"variant": 3, "min_ratio": 1.04, "geomean_ratio": 1.06},
             "128/all": {"variant": 9, "min_ratio": 1.02, "geomean_ratio": 1.03},
             "128/plain": {"variant": 9, "min_ratio": 1.02, "geomean_ratio": 1.03}}
    doc = tmp_path / "sweep.json"
    doc.write_text(json.dumps({"variants": variants, "summary": {"picks": picks}}))
    for _ in range(2):
        sweep.apply_picks(doc, tmp_path)
    namespace: dict = {}
    exec(compile((tmp_path / "tiled_attn" / "configs.py").read_text(), "configs.py", "exec"), namespace)
    table = {k: {**r, "flags": tuple(r["flags"])} for k, r in namespace["CUDA_ATTENTION"].items() if k[0] == "fwd"}
    assert table == _tile_configs(tmp_path / "csrc" / "attention")
    assert table[("fwd", "any", "*", 64)]["flags"] == ("skew",)
    assert table[("fwd", "any", "*", 64, "causal")]["flags"] == ("q_in_regs", "fold", "lazy")
    assert table[("fwd", "any", "*", 128)]["min_blocks"] == 3 and ("fwd", "any", "*", 128, "causal") not in table
    assert table[("fwd", "any", "*", 256)] == configs.CUDA_ATTENTION[("fwd", "any", "*", 256)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the sweep library is built with nvcc")
def test_sweep_library_builds(tmp_path, monkeypatch):
    sweep = _sweep_module()
    if not torch.cuda.is_available():  # build for the H100 and load without a device
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
        monkeypatch.setattr(torch.cuda, "init", lambda: None)
    lib_path, info = sweep.build(tmp_path, 2, [0])
    assert info[0]["registers"] and info[0]["spill_bytes"] == 0
    lib = sweep.SweepLib(lib_path)
    rows = lib.variants()
    assert len(rows) == sweep.variant_count() and rows[0]["built"] and not any(r["built"] for r in rows[1:])
    assert rows[0]["threads"] == rows[0]["warps"] * 32 and rows[0]["smem_bytes"] > 0
    # Refused before any launch (safe on a GPU too): a head dim that is not the variant's, and a
    # variant this library does not hold. 1 = cudaErrorInvalidValue.
    strides = (ctypes.c_int64 * 12)(*([8] * 12))
    d = rows[0]["head_dim"]
    assert lib.lib.tiled_attn_sweep_fwd(0, 16, 16, 16, 16, 16, 1, 1, 1, 64, 64, d + 16, strides, 0.1, 0, 0, None) == 1
    assert lib.lib.tiled_attn_sweep_fwd(1, 16, 16, 16, 16, 16, 1, 1, 1, 64, 64, d, strides, 0.1, 0, 0, None) == 1


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> pathlib.Path:
    return build_attention_emulator("flash_fwd_emulator", tmp_path_factory.mktemp("emu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the kernel itself (tests/test_attention.py)")
@pytest.mark.parametrize("head_dim", cuda_attention.HEAD_DIMS)
def test_kernel_in_the_emulator(emulator, head_dim):
    run_attention_emulator(emulator, head_dim, timeout=1800)


# ------------------------------------------------------------------------------------------------
# Split-KV (flash-decoding): DecodeConfig, split_plan, and on a GPU the kernels themselves
# ------------------------------------------------------------------------------------------------
TILE_FIELDS = ("block_m", "block_n", "warps", "stages", "flags", "min_blocks")


def _decode_configs(attn_dir: pathlib.Path = ATTN) -> dict:
    """DecodeConfig<D> of flash_fwd.cuh (the primary template and its specializations) per head dim."""
    text = (attn_dir / "flash_fwd.cuh").read_text()
    primary = re.search(r"template <int kHeadDim>\s*struct DecodeConfig \{\s*using type = Cfg<([^>]*)>;\s*\};", text)
    assert primary, "no primary DecodeConfig template in flash_fwd.cuh"
    special = {int(m.group(1)): _cfg_row(m.group(2)) for m in re.finditer(
        r"template <>\s*struct DecodeConfig<(\d+)> \{\s*using type = Cfg<([^>]*)>;\s*\};", text)}
    return {d: special.get(d, _cfg_row(primary.group(1))) for d in cuda_attention.HEAD_DIMS}


def test_decode_table_mirrors_the_templates():
    templates = _decode_configs()
    for d in cuda_attention.HEAD_DIMS:
        row = configs.CUDA_ATTENTION[("decode", "any", "*", d)]
        tile = {f: (tuple(row[f]) if f == "flags" else row[f]) for f in TILE_FIELDS}
        assert tile == templates[d], f"configs.CUDA_ATTENTION decode row for D={d} differs from DecodeConfig<{d}>"
        assert cuda_attention.decode_config(d) is row
        # The split kernel needs whole m16 tiles per warp and one barrier per tile with a prefetch.
        assert row["block_m"] == 16 * row["warps"] and "joint" in row["flags"] and row["stages"] >= 2


def _kernel_split_len(seen: int, splits: int, block_n: int) -> int:
    """flash_fwd_launch.cuh split_len_for, written again."""
    per = -(-seen // splits)
    return max(block_n, -(-per // block_n) * block_n)


@pytest.mark.parametrize("b,nk", [(1, 4096), (1, 32768), (1, 131072), (16, 4096), (16, 32768), (16, 131072)])
def test_split_plan_for_the_decode_suite(b, nk):
    """Nq = 1, Hq = 32, Hkv = 8, D = 128 on 132 SMs: split, with enough CTAs for the resident slots
    (at least one per SM) and never more than one wave of them."""
    cfg = cuda_attention.decode_config(128)
    splits = cuda_attention.split_plan(b, 32, 8, 1, nk, 128, False, nk - 1, 132, cfg)
    assert splits >= 1
    ctas = b * 8 * splits  # 4 packed rows: one row tile per (batch, kv head)
    smem = cuda_attention._smem_bytes(cfg, 128)
    slots = min(cfg["max_ctas_per_sm"], cuda_attention.SMEM_PER_SM // (smem + 1024)) * 132
    assert smem == (16 + 4 * 64) * (128 + 8) * 2 and slots == 3 * 132  # 72 KiB: three CTAs per SM
    assert 132 <= ctas <= slots, (splits, ctas, slots)
    assert (splits - 1) * _kernel_split_len(nk, splits, cfg["block_n"]) < nk  # no empty split
    assert _kernel_split_len(nk, splits, cfg["block_n"]) >= min(nk, cfg["min_split_keys"])


def test_split_plan_declines():
    cfg = cuda_attention.decode_config(128)
    plan = lambda *a: cuda_attention.split_plan(*a, 132, cfg)  # noqa: E731
    assert plan(1, 32, 8, 4096, 4096, 128, True, 0) == 0     # a prefill: 16384 packed rows
    assert plan(1, 32, 8, 17, 4096, 128, False, 0) == 0      # 68 rows > max_rows
    assert plan(1, 32, 8, 1, cfg["min_keys"] - 1, 128, False, 0) == 0
    assert plan(1, 32, 8, 3, 4096, 128, True, -3) == 0       # causal: no row sees a key
    assert plan(1, 32, 8, 1, 4096, 128, True, 4095) > 1
    # causal top-left: the one query sees 1 key of 4096 (the forward kernel's single tile).
    assert plan(1, 32, 8, 1, 4096, 128, True, 0) == 0
    assert plan(1, 32, 8, 1, 4096, 128, True, cfg["min_keys"] - 2) == 0
    assert plan(1, 32, 8, 1, 4096, 128, True, cfg["min_keys"] - 1) >= 1
    assert plan(512, 32, 8, 1, 4096, 128, False, 0) == 1     # the grid is full without splitting


def test_split_plan_leaves_no_split_empty():
    import itertools
    for d, b, (hq, hkv), nq, nk, causal in itertools.product(
            cuda_attention.HEAD_DIMS, (1, 3, 16), ((32, 8), (8, 8), (16, 1)), (1, 2, 4), (512, 777, 4099, 65536),
            (False, True)):
        cfg = cuda_attention.decode_config(d)
        offset = nk - nq
        splits = cuda_attention.split_plan(b, hq, hkv, nq, nk, d, causal, offset, 132, cfg)
        if splits == 0:
            assert nq * hq // hkv > cfg["max_rows"]
            continue
        seen = min(max(nq + offset, 0), nk) if causal else nk
        split_len = _kernel_split_len(seen, splits, cfg["block_n"])
        assert (splits - 1) * split_len < seen <= splits * split_len, (d, b, hq, hkv, nq, nk, causal, splits)


GPU_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="the split-KV kernels run on a CUDA device")


def _cuda_ready():
    from tiled_attn import cuda
    if not cuda.is_available():
        pytest.skip("the CUDA extension is not available (not built)")


def _split_run(q, k, v, scale, causal, offset, num_splits):
    from tiled_attn import _checks
    attention_mod = __import__("importlib").import_module("tiled_attn.attention")
    out, lse = (_checks.new_output(t) for t in attention_mod._alloc(q, v))
    cuda_attention.attention_forward(q, k, v, out, lse, scale, causal, offset, num_splits=num_splits)
    return out, lse


# (B, Hq, Hkv, Nq, Nk, D, dtype, causal, offset (None: bottom-right Nk − Nq), splits (None: planned))
SPLIT_CASES = [
    (1, 32, 8, 1, 4099, 128, torch.bfloat16, False, None, 7),
    (1, 32, 8, 1, 4099, 128, torch.bfloat16, False, None, None),
    (2, 8, 2, 3, 799, 64, torch.float16, True, None, 5),
    (1, 8, 1, 3, 239, 128, torch.bfloat16, True, 0, 4),        # top-left: splits 1-3 unseen by every row
    (1, 4, 2, 3, 129, 96, torch.float16, True, None, 3),       # the last split unseen by queries 0, 1
    (2, 4, 2, 3, 1, 64, torch.bfloat16, True, None, 2),        # queries 0, 1 see no key: 0 and -inf
    (1, 4, 4, 1, 1, 256, torch.float16, False, None, 2),       # MHA, one key, a split past it
    (1, 16, 1, 1, 32768, 128, torch.bfloat16, False, None, None),  # MQA, planned
    (3, 12, 4, 2, 1000, 32, torch.float16, True, None, 6),
    (1, 24, 8, 1, 2000, 192, torch.bfloat16, True, None, 5),
    (1, 8, 1, 3, 700, 256, torch.bfloat16, False, None, 7),    # 24 packed rows: two row tiles
]


@GPU_ONLY
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: "B{}-H{}x{}-Nq{}-Nk{}-D{}-{}-c{}-o{}-s{}".format(
    *c[:6], str(c[6])[6:], int(c[7]), c[8], c[9]))
def test_split_kv_matches_reference(case, seed):
    from test_attention import _check, _qkv
    _cuda_ready()
    b, hq, hkv, nq, nk, d, dtype, causal, offset, splits = case
    offset = nk - nq if offset is None else offset
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(b, hq, hkv, nq, nk, d, dtype, "cuda", gen)
    scale = 1.0 / math.sqrt(d)
    if splits is None:
        splits = cuda_attention.split_plan(b, hq, hkv, nq, nk, d, causal, offset, cuda_attention._sm_count(q.device),
                                           cuda_attention.decode_config(d, q.device))
        assert splits >= 1, "a decode shape must take the split path"
    out, lse = _split_run(q, k, v, scale, causal, offset, splits)
    _check(out, lse, q, k, v, causal, offset, scale, seed, f"cuda split-KV {case}")
    # Non-contiguous q/out layouts and a negative scale (the kernel without the folded scale).
    out2, lse2 = _split_run(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, -scale, causal, offset, splits)
    _check(out2, lse2, q, k, v, causal, offset, -scale, seed, f"cuda split-KV scale<0 {case}")


def _check_batches(out, lse, q, k, v, causal, offset, scale, seed, what, batches):
    """The rule on a few batch entries of a launch too large for the float64 reference."""
    from test_attention import _check
    for i in batches:
        _check(out[i:i + 1], lse[i:i + 1], q[i:i + 1], k[i:i + 1], v[i:i + 1], causal, offset, scale, seed,
               f"{what} batch {i}")


@GPU_ONLY
@pytest.mark.parametrize("num_splits", [0, 2], ids=["forward", "split"])
def test_more_than_65535_batch_heads(num_splits, seed):
    """B·Hkv = 65537 (B·Hq = 131074) passes grid.y's 65535: both kernels launch in slices of heads
    (launch_common.cuh launch_sliced, bh_offset); the entries past the first slice are checked."""
    _cuda_ready()
    b, hq, hkv, nq, nk, d = 65537, 2, 1, 1, 70, 32
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.float16)
               for shape in ((b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)))
    out, lse = _split_run(q, k, v, 1 / math.sqrt(d), True, nk - nq, num_splits)
    _check_batches(out, lse, q, k, v, True, nk - nq, 1 / math.sqrt(d), seed, f"B·Hkv=65537 splits={num_splits}",
                   [0, 32767, 32768, 65534, 65535, 65536])


@pytest.mark.huge
@pytest.mark.gpu
@GPU_ONLY
def test_split_workspace_past_2_31_floats(seed):
    """B·Hq·Nq·S·(D+2) = 256·32·1·1200·258 > 2^31 floats (2.5 G, 10 GB): the partials' offsets are
    64-bit in the split kernel and the merge; the last batch entries lie past element 2^31 (and most
    of the 1200 splits lie past the 2400 keys: the identity state)."""
    _cuda_ready()
    b, hq, hkv, nq, nk, d, splits = 256, 32, 8, 1, 2400, 256, 1200
    assert b * hq * nq * splits * (d + 2) > 2**31
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
               for shape in ((b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)))
    out, lse = _split_run(q, k, v, 1 / 16, False, nk - nq, splits)
    _check_batches(out, lse, q, k, v, False, nk - nq, 1 / 16, seed, "workspace > 2^31", [0, b // 2, b - 1])


@GPU_ONLY
def test_split_kv_is_what_ta_attention_runs_for_decode(seed, monkeypatch):
    """The decode suite's shape through ta.attention(backend="cuda") takes the split path."""
    import math as _math
    from test_attention import _check, _qkv
    _cuda_ready()
    calls = []
    ext = cuda_attention._extension(torch.device("cuda"))
    from tiled_attn.cuda import _build
    real_call = _build.call  # every call into the extension goes through it
    monkeypatch.setattr(_build, "call", lambda fn, *a: (calls.append(fn), real_call(fn, *a))[1])
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(1, 32, 8, 1, 4096, 128, torch.bfloat16, "cuda", gen)
    out, lse = __import__("tiled_attn").attention(q, k, v, return_lse=True, backend="cuda")
    assert ext.attention_fwd_split in calls and ext.attention_fwd not in calls
    _check(out, lse, q, k, v, False, 4095, 1 / _math.sqrt(128), seed, "ta.attention cuda decode")


@GPU_ONLY
@pytest.mark.parametrize("causal", [False, True])
def test_split_kv_in_a_cuda_graph(causal, seed):
    """A decode step (Hq = 32, Hkv = 8, Nk = 4099) captured once and replayed on new q/k/v: the
    replay equals an eager call on the same inputs bit for bit, and the reference."""
    import tiled_attn as ta
    from test_attention import _check, _qkv
    _cuda_ready()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(2, 32, 8, 1, 4099, 128, torch.bfloat16, "cuda", gen)
    static = [t.clone() for t in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (builds/loads the extension)
        ta.attention(*static, causal=causal, return_lse=True, backend="cuda")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = ta.attention(*static, causal=causal, return_lse=True, backend="cuda")
    q2, k2, v2 = _qkv(2, 32, 8, 1, 4099, 128, torch.bfloat16, "cuda", gen)
    for dst, src in zip(static, (q2, k2, v2)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    e_out, e_lse = ta.attention(q2, k2, v2, causal=causal, return_lse=True, backend="cuda")
    assert torch.equal(g_out, e_out) and torch.equal(g_lse, e_lse), "graph replay differs from the eager call"
    _check(g_out, g_lse, q2, k2, v2, causal, 4099 - 1, 1 / math.sqrt(128), seed, "cuda graph decode")
