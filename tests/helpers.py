"""The numerics rule of DESIGN §4, stated once, and the input makers every test uses.

Rule: with e_ours = max|ours − ref| and e_torch = max|torch's own op in the input dtype − ref|, where
ref is the same op in float64 on the same (already rounded) inputs, a result passes iff
    e_ours ≤ 2·e_torch + eps(dtype).
NaN must appear exactly where the reference has NaN; ±inf exactly where it has ±inf; anywhere else
a non-finite value fails. Every failure message carries the seed and both errors.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import torch

from tiled_attn import _checks

HAS_CUDA = torch.cuda.is_available()
INTERPRET = _checks.triton_interpret()
LOW = (torch.float16, torch.bfloat16)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def fresh_seed() -> int:
    """A new seed every run (fresh inputs), printed by every failure that uses it."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def device_for(backend: str) -> str:
    """Where a backend's tensors live in this run: CUDA when present, else the CPU (the Triton
    interpreter runs CPU tensors)."""
    return "cuda" if HAS_CUDA else "cpu"


def backend_available(backend: str) -> bool:
    if backend == "torch":
        return True
    if backend == "triton":
        return HAS_CUDA or INTERPRET
    if backend == "cuda":
        if not HAS_CUDA:
            return False
        from tiled_attn import cuda
        return cuda.is_available()
    raise ValueError(backend)


def skip_reason(backend: str) -> str:
    if backend == "triton":
        return "Triton backend needs a CUDA device or TRITON_INTERPRET=1"
    return f"{backend} backend needs a CUDA device with a CUDA toolchain"


def randn(shape, dtype, device, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Normal draws made on the CPU from `gen` (reproducible from the seed), then moved."""
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(device)


def max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x − ref| over the entries where ref is finite; non-finite x there counts as inf."""
    x, ref = x.double().cpu(), ref.double().cpu()
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0
    d = (x[finite] - ref[finite]).abs()
    d = torch.where(torch.isfinite(d), d, torch.full_like(d, float("inf")))
    return d.max().item()


def assert_rule(ours: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor, *, dtype: torch.dtype,
                seed: int, what: str = "") -> None:
    """Assert DESIGN §4: `ours` against the float64 `ref`, allowed 2× torch's own error + eps."""
    ours_c, ref_c = ours.detach().double().cpu(), ref.detach().double().cpu()
    tag = f"[{what} seed={seed}]"
    assert ours_c.shape == ref_c.shape, f"{tag} shape {tuple(ours_c.shape)} != reference {tuple(ref_c.shape)}"
    nan_ref, nan_ours = torch.isnan(ref_c), torch.isnan(ours_c)
    assert torch.equal(nan_ours, nan_ref), (
        f"{tag} NaN pattern differs from the reference: {int(nan_ours.sum())} NaN in ours, "
        f"{int(nan_ref.sum())} in the reference, {int((nan_ours & ~nan_ref).sum())} unexpected")
    inf_ref = torch.isinf(ref_c)
    assert torch.equal(ours_c[inf_ref], ref_c[inf_ref]), f"{tag} ±inf entries differ from the reference"
    e_ours = max_err(ours_c, ref_c)
    e_torch = max_err(torch_out, ref_c)
    tol = 2 * e_torch + torch.finfo(dtype).eps
    assert e_ours <= tol, (f"{tag} error {e_ours:.3e} exceeds 2×torch's {e_torch:.3e} + eps "
                           f"({tol:.3e}) for {dtype}")


# -- offline sm_90a builds (CPU CI: what only the compiler rejects, and register spills) -----------
def sm90a_build_problem(label: str, kernel, signature: dict, consts: dict, attrs: dict, options: dict) -> str:
    """Compile one @triton.jit kernel for sm_90a (no GPU needed) and run Triton's ptxas -v on it:
    "" when it builds with no register spills and at most 227 KB of shared memory (the sm90 opt-in
    limit), else what is wrong. Only without TRITON_INTERPRET (it replaces @triton.jit)."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    try:
        compiled = triton.compile(ASTSource(kernel, signature, consts, attrs),
                                  target=GPUTarget("cuda", 90, 32), options=options)
    except Exception as e:  # noqa: BLE001 -- the caller reports every failing build, not just the first
        return f"{label}: {type(e).__name__}: {str(e)[-1500:]}"
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    report = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                            capture_output=True, text=True).stderr
    os.unlink(f.name)
    spills = sum(int(s) for s in re.findall(r"(\d+) bytes spill stores", report))
    regs = re.findall(r"Used (\d+) registers", report)
    print(f"{label}: {regs} regs, {compiled.metadata.shared} B smem, spill stores {spills}", flush=True)
    if spills:
        return f"{label}: {spills} bytes of register spills ({options})"
    if compiled.metadata.shared > 227 * 1024:
        return f"{label}: {compiled.metadata.shared} bytes of shared memory (> 227 KB)"
    return ""


def assert_none_without_interpreter(module: str, call: str, timeout: int) -> None:
    """Run `module.call` (a list of problems) in a child process without TRITON_INTERPRET, from
    tests/, and assert it returns none (its output is the failure message)."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (f"import sys; sys.path[:0] = ['.', '..']; import {module} as t; "
            f"p = t.{call}; print('\\n'.join(p)); sys.exit(1 if p else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)),
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]


# -- the CPU emulators of the CUDA kernels (tests/emulation/): g++ and the CUDA headers, no GPU -------
ROOT = pathlib.Path(__file__).resolve().parents[1]


def cuda_include() -> pathlib.Path | None:
    """The CUDA toolkit's include directory (cuda_runtime.h, cuda_fp16.h), or None."""
    candidates = [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(pathlib.Path(nvcc).resolve().parents[1]))
        # /usr/local/bin/nvcc may be a wrapper script: the real toolkit is named inside it
        m = re.search(r"(/\S+)/bin/nvcc", pathlib.Path(nvcc).read_text(errors="ignore")[:4096])
        if m:
            candidates.append(m.group(1))
    for c in candidates:
        if c and all((pathlib.Path(c) / "include" / h).exists() for h in ("cuda_runtime.h", "cuda_fp16.h")):
            return pathlib.Path(c) / "include"
    return None


def build_attention_emulator(name: str, out_dir: pathlib.Path) -> pathlib.Path:
    """Build tests/emulation/<name>.cpp (an attention kernel, compiled unchanged for the host) into
    out_dir; pytest.skip without g++ or the CUDA headers."""
    import pytest
    cxx = shutil.which("g++")
    include = cuda_include()
    if cxx is None or include is None:
        pytest.skip("the kernel emulator needs g++ and the CUDA headers")
    exe = out_dir / name
    cmd = [cxx, "-std=c++17", "-O1", "-Wno-attributes", f"-I{include}", f"-I{ROOT / 'csrc'}",
           "-DTILED_ATTN_EMULATION", str(ROOT / "tests" / "emulation" / f"{name}.cpp"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"emulator build failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return exe


def run_attention_emulator(exe: pathlib.Path, head_dim: int, timeout: int) -> str:
    """Run an emulator from build_attention_emulator on every case of `head_dim` with a fresh seed;
    assert it exits 0 (the message carries the seed and the output's tail) and return its stdout."""
    seed = fresh_seed()
    r = subprocess.run([str(exe), str(head_dim), str(seed)], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (f"[seed={seed}] emulated {exe.name} failed for D={head_dim}:\n"
                               f"{r.stdout[-6000:]}{r.stderr[-2000:]}")
    return r.stdout
