"""The CUDA attention kernel (csrc/attention/) on a machine without a GPU.

1. configs.CUDA_ATTENTION mirrors the templates' TileConfig rows, the instantiated head dims and the
   C++ attention_head_dim_supported list (the kernel runs the C++ rows; the table documents them).
2. The kernel itself, unchanged, runs in tests/emulation/flash_fwd_emulator.cpp: every CUDA thread a
   CPU fiber, ldmatrix / mma.sync / cp.async / shfl / __syncthreads emulated from the PTX ISA tables,
   against a float64 reference (ragged N, GQA, causal offsets, empty rows, no keys), with checks for
   writes outside out/lse and shared-memory races (a cp.async destination read before its
   wait_group + barrier, or overwritten while another warp may still read it). Needs g++ and the CUDA
   headers (the nvcc toolchain); ~1 minute for all head dims on 2 cores.
The GPU run (tests/test_attention.py with backend="cuda", compute-sanitizer) is the real check.
"""
from __future__ import annotations

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


def _tile_configs() -> dict:
    text = (ATTN / "flash_fwd.cuh").read_text()
    pattern = re.compile(r"struct TileConfig<(\d+)> \{\s*static constexpr int kBlockM = (\d+), kBlockN = (\d+), "
                         r"kWarps = (\d+), kStages = (\d+);\s*static constexpr bool kQInRegs = (true|false);")
    rows = {}
    for m in pattern.finditer(text):
        d, bm, bn, w, s, qr = m.groups()
        rows[int(d)] = {"block_m": int(bm), "block_n": int(bn), "warps": int(w), "stages": int(s),
                        "q_in_regs": qr == "true"}
    return rows


def test_table_mirrors_the_templates():
    templates = _tile_configs()
    assert templates, "no TileConfig<D> specialization parsed from csrc/attention/flash_fwd.cuh"
    table = {key[3]: row for key, row in configs.CUDA_ATTENTION.items() if key[0] == "fwd"}
    assert table == templates, "configs.CUDA_ATTENTION differs from TileConfig<D> in flash_fwd.cuh"
    assert tuple(sorted(templates)) == cuda_attention.HEAD_DIMS
    files = sorted(int(p.stem.removeprefix("flash_fwd_hdim")) for p in ATTN.glob("flash_fwd_hdim*.cu"))
    assert tuple(files) == cuda_attention.HEAD_DIMS, "one flash_fwd_hdim<D>.cu per supported head dim"
    src = (ATTN / "flash_fwd.cu").read_text()
    supported = src[src.index("bool attention_head_dim_supported"):src.index("namespace {")]
    assert tuple(int(c) for c in re.findall(r"case (\d+):", supported)) == cuda_attention.HEAD_DIMS


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
    r = subprocess.run([str(emulator), str(head_dim), str(seed)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (f"[seed={seed}] emulated kernel failed for D={head_dim}:\n"
                               f"{r.stdout[-6000:]}{r.stderr[-2000:]}")
