"""The CUDA attention kernel (csrc/attention/) on a machine without a GPU.

1. configs.CUDA_ATTENTION mirrors the templates' TileConfig rows, the instantiated head dims and the
   C++ attention_head_dim_supported list (the kernel runs the C++ rows; the table documents them);
   the sweep's variant table (csrc/attention/sweep/) and its script agree on the flags.
2. The kernel itself, unchanged, runs in tests/emulation/flash_fwd_emulator.cpp: every CUDA thread a
   CPU fiber, ldmatrix / mma.sync / cp.async / shfl / vote / __syncthreads emulated from the PTX ISA
   tables, against a float64 reference (ragged N, GQA, causal offsets, empty rows, no keys, negative
   and zero scale), with checks for writes outside out/lse and shared-memory races (a cp.async
   destination read before its wait_group + barrier, or overwritten while another warp may still
   read it) — for the default rows (attention_fwd) and for every sweep variant of the head dim.
   Needs g++ and the CUDA headers (the nvcc toolchain); ~3 minutes for all head dims on 2 cores.
3. The sweep's ctypes library builds and lists its variants (needs nvcc; ~15 s: one variant).
The GPU run (tests/test_attention.py with backend="cuda", compute-sanitizer) is the real check.
"""
from __future__ import annotations

import ctypes
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
import torch

from tiled_attn import configs
from tiled_attn.cuda import attention as cuda_attention

from helpers import fresh_seed

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
    src = (ATTN / "flash_fwd.cu").read_text()
    supported = src[src.index("bool attention_head_dim_supported"):src.index("namespace {")]
    assert tuple(int(c) for c in re.findall(r"case (\d+):", supported)) == cuda_attention.HEAD_DIMS
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


def _cuda_include() -> pathlib.Path | None:
    candidates = [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(pathlib.Path(nvcc).resolve().parents[1]))
        # /usr/local/bin/nvcc may be a wrapper script: the real toolkit is named inside it
        m = re.search(r"(/\S+)/bin/nvcc", pathlib.Path(nvcc).read_text(errors="ignore")[:4096])
        if m:
            candidates.append(m.group(1))
    for c in candidates:
        if c and (pathlib.Path(c) / "include" / "cuda_fp16.h").exists():
            return pathlib.Path(c) / "include"
    return None


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> pathlib.Path:
    cxx = shutil.which("g++")
    include = _cuda_include()
    if cxx is None or include is None:
        pytest.skip("the kernel emulator needs g++ and the CUDA headers")
    exe = tmp_path_factory.mktemp("emu") / "flash_fwd_emulator"
    cmd = [cxx, "-std=c++17", "-O1", "-Wno-attributes", f"-I{include}", f"-I{ROOT / 'csrc'}",
           "-DTILED_ATTN_EMULATION", str(ROOT / "tests" / "emulation" / "flash_fwd_emulator.cpp"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"emulator build failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return exe


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the kernel itself (tests/test_attention.py)")
@pytest.mark.parametrize("head_dim", cuda_attention.HEAD_DIMS)
def test_kernel_in_the_emulator(emulator, head_dim):
    seed = fresh_seed()
    r = subprocess.run([str(emulator), str(head_dim), str(seed)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, (f"[seed={seed}] emulated kernel failed for D={head_dim}:\n"
                               f"{r.stdout[-6000:]}{r.stderr[-2000:]}")
