"""The Triton attention backward kernels (tiled_attn/triton/attention_bwd.py) build for the H100.

CPU CI cannot run them on a GPU, but it can compile them for sm_90a and read ptxas's report: every
configs.TRITON_ATTENTION_BACKWARD row the sm90 lookup returns (bf16 and float32; fp16 shares the
bf16 rows), at head dims 40/64/96/128/224/256 and both causal modes, must build with no register
spills and at most 227 KB of shared memory. So a tile that no longer fits fails here, not in the
GPU's time. The candidates of benchmarks/tune_triton_attention_backward.py are checked by the slow
test (-m slow) the same way.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

from helpers import HAS_CUDA, assert_none_without_interpreter, sm90a_build_problem

HEAD_DIMS = (40, 64, 96, 128, 224, 256)
_FP32_ARGS = ("Lse", "Delta", "DLse", "DQacc", "Part")
_SCALARS = ("qk_scale", "sm_scale")


def _builds(which: str = "shipped") -> list:
    """(label, kernel, dtype, constexprs, options) of every backward build to check."""
    from tiled_attn.triton import attention_backward as tb
    from tiled_attn.triton.attention_bwd import (attention_bwd_delta_kernel, attention_bwd_dkdv_kernel,
                                                 attention_bwd_dq_kernel, attention_bwd_dq_store_kernel,
                                                 attention_bwd_finish_kernel)
    kernels = {"dkdv": attention_bwd_dkdv_kernel, "dq": attention_bwd_dq_kernel}
    out, seen = [], set()

    def add(label, kern, dt, const):
        opts = {k: const.pop(k) for k in ("num_warps", "num_stages") if k in const}
        key = (kern.fn.__name__, dt, tuple(sorted(const.items())), tuple(sorted(opts.items())))
        if key not in seen:
            seen.add(key)
            out.append((label, kern, dt, const, opts))

    if which == "shipped":
        rows = []
        for dt, torch_dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            for d in HEAD_DIMS:
                q = torch.empty(1, 1, 1, d, dtype=torch_dt)
                for causal in (False, True):
                    atomic = tb.dq_mode(q, False, arch="sm90") == "atomic"
                    for name in kernels:
                        rows.append((name, dt, d, causal,
                                     tb.launch_constants(q, name, False, causal, "sm90", atomic)))
                block_d = max(16, 1 << (d - 1).bit_length())
                add(f"delta {dt} D={d}", attention_bwd_delta_kernel, dt,
                    dict(BLOCK_M=64, HEAD_DIM=d, BLOCK_D=block_d, HAS_DLSE=True, WIDE=False, ZERO_ACC=True,
                         num_warps=4))
                add(f"finish {dt} D={d}", attention_bwd_finish_kernel, dt,
                    dict(SPLITS=4, BLOCK_M=64, BLOCK_N=max(8, min(64, 2048 // block_d)), HEAD_DIM=d,
                         BLOCK_D=block_d, WIDE=False, num_warps=4))
                add(f"dq store {dt} D={d}", attention_bwd_dq_store_kernel, dt,
                    dict(BLOCK_M=64, HEAD_DIM=d, BLOCK_D=block_d, WIDE=False, num_warps=4))
    else:
        bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
        sys.path.insert(0, bench)
        import tune_triton_attention_backward as tune
        rows = []
        for name, d, cand in tune.all_candidates():
            q = torch.empty(1, 1, 1, d, dtype=torch.bfloat16)
            base = tb.launch_constants(q, name, False, False, "sm90", cand.get("dq") == "atomic")
            tiles = {k: v for k, v in cand.items() if k not in ("dq", "band")}
            if name == "dkdv":
                tiles["BAND"] = cand.get("band", True)
            for causal in (False, True):
                rows.append((name, "bf16", d, causal, dict(base, CAUSAL=causal, **tiles)))
    for name, dt, d, causal, const in rows:
        const = dict(const, WIDE=False)
        label = (f"{name}{' atomic' if const.get('ATOMIC_DQ') else ''} {dt} D={d} causal={causal} "
                 f"{const['BLOCK_M']}x{const['BLOCK_N']} w{const['num_warps']} s{const['num_stages']}"
                 f"{' one-loop' if const.get('BAND') is False else ''}")
        add(label, kernels[name], dt, const)
    return out


def _compile_one(which: str, index: int) -> str:
    label, kern, dt, const, opts = _builds(which)[index]
    signature, attrs, consts = {}, {}, dict(const)
    for i, name in enumerate(kern.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name in _FP32_ARGS:
            signature[name] = "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in _SCALARS:
            signature[name] = "fp32"
        elif not name.startswith("stride") and name[0].isupper():
            signature[name] = "*" + dt
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.startswith("stride") and name.endswith("d"):
            signature[name] = "constexpr"
            consts[name] = 1
        else:
            signature[name] = "i32"
            if name.startswith("stride"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sm90a_build_problem(label, kern, signature, consts, attrs, opts)


def compile_backward_for_sm90a(which: str = "shipped", jobs: int = 2) -> list[str]:
    """Problems (compile errors, spills, shared memory over 227 KB) of _builds(which); run without
    TRITON_INTERPRET."""
    import concurrent.futures
    n = len(_builds(which))
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        results = list(pool.map(_compile_one, [which] * n, range(n)))
    return [p for p in results if p]


@pytest.mark.skipif(HAS_CUDA, reason="the GPU run compiles and runs every kernel itself")
def test_backward_compiles_for_sm90a():
    """Every shipped backward config builds for sm_90a without spills (~40 kernels, ~2-4 min)."""
    assert_none_without_interpreter("test_attention_backward_sm90", "compile_backward_for_sm90a('shipped')", 3000)


@pytest.mark.slow
@pytest.mark.skipif(HAS_CUDA, reason="the GPU run compiles and runs every kernel itself")
def test_backward_sweep_candidates_compile_for_sm90a():
    """Every candidate of benchmarks/tune_triton_attention_backward.py builds for sm_90a without
    spills (-m slow)."""
    assert_none_without_interpreter("test_attention_backward_sm90", "compile_backward_for_sm90a('candidates')", 3000)
