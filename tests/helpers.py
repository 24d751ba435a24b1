"""The numerics rule of DESIGN §4, stated once, and the input makers every test uses.

Rule: with e_ours = max|ours − ref| and e_torch = max|torch's own op in the input dtype − ref|, where
ref is the same op in float64 on the same (already rounded) inputs, a result passes iff
    e_ours ≤ 2·e_torch + eps(dtype).
NaN must appear exactly where the reference has NaN; ±inf exactly where it has ±inf; anywhere else
a non-finite value fails. Every failure message carries the seed, how to reproduce it, and both
errors.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys

import torch

from tiled_attn import _checks

HAS_CUDA = torch.cuda.is_available()
INTERPRET = _checks.triton_interpret()
LOW = (torch.float16, torch.bfloat16)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# -- seeds (DESIGN §4: fixed per test in CI, fresh on request, a failing one reproducible) ----------
# TILED_ATTN_SEED unset (CI): every seed is a fixed function of the test's pytest node id, so a landing
# never fails at random. TILED_ATTN_SEED=random: a fresh base per process (local and GPU sweeps).
# TILED_ATTN_SEED=<int>: that base, mixed into every test's seeds, so a failure reproduces. Unset is
# base 0; every failure says which base it ran with (reproduce_hint).
SEED_ENV = "TILED_ATTN_SEED"
_random_base: int | None = None      # this process's draw for TILED_ATTN_SEED=random
_current_test: str | None = None     # node id set by conftest's autouse fixture (begin_test)
_draws: dict[str, int] = {}          # fresh_seed() calls so far, per node id


def seed_mode() -> str:
    """"fixed" (TILED_ATTN_SEED unset or empty), "random", or "int"."""
    v = os.environ.get(SEED_ENV, "").strip().lower()
    return "fixed" if not v else "random" if v == "random" else "int"


def seed_base() -> int:
    """The base mixed into every seed: 0 when unset, this process's random draw for "random", else
    the integer given (decimal or 0x...)."""
    global _random_base
    mode = seed_mode()
    if mode == "fixed":
        return 0
    if mode == "random":
        if _random_base is None:
            _random_base = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        return _random_base
    v = os.environ[SEED_ENV].strip()
    try:
        return int(v, 0)
    except ValueError:
        raise ValueError(f"{SEED_ENV} must be unset, 'random' or an integer, not {v!r}") from None


def seed_for(test_id: str, draw: int | str = 0) -> int:
    """The seed of `test_id`'s draw `draw` under the current TILED_ATTN_SEED: a hash, so it changes
    with neither the order tests run in nor which others run (-k, xdist, shards)."""
    digest = hashlib.sha256(f"{seed_base()}|{test_id}|{draw}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def current_test_id() -> str:
    """The running test's node id (from conftest's fixture, else PYTEST_CURRENT_TEST minus its
    " (call)" suffix); outside pytest (tests/gpu_sanitize.py) the script's name."""
    if _current_test is not None:
        return _current_test
    cur = os.environ.get("PYTEST_CURRENT_TEST")
    if cur:
        return cur.rsplit(" (", 1)[0]
    return "script:" + os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "python")


def begin_test(test_id: str) -> int:
    """Called by conftest before each test: restarts its draw count and seeds the global RNGs
    (torch, random, numpy) from it, so an unseeded torch.randn or module init is fixed too."""
    global _current_test
    _current_test = test_id
    _draws[test_id] = 0
    g = seed_for(test_id, "global")
    torch.manual_seed(g)
    random.seed(g)
    try:
        import numpy as np
        np.random.seed(g)
    except ImportError:  # pragma: no cover
        pass
    return g


def end_test() -> None:
    global _current_test
    if _current_test is not None:
        _draws.pop(_current_test, None)
    _current_test = None


def fresh_seed(test_id: str | None = None) -> int:
    """The next seed of this test: draw 0, 1, 2, ... of seed_for(node id) (the `seed` fixture is
    draw 0), so two calls differ but every run gives the same ones (TILED_ATTN_SEED unset).
    Printed by every failure that uses it. In a @given test draw the seed from hypothesis instead
    (data.draw(st.integers(...))): its replay of a failing example must see the same seed."""
    test_id = test_id or current_test_id()
    n = _draws.get(test_id, 0)
    _draws[test_id] = n + 1
    return seed_for(test_id, n)


def reproduce_hint() -> str:
    """How to rerun with the same seeds, for failure messages."""
    mode = seed_mode()
    if mode == "fixed":
        return f"{SEED_ENV} unset: a rerun reproduces it"
    return f"reproduce with {SEED_ENV}={seed_base()}"


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
                seed: int, what: str = "", ulp_floor: bool = False) -> None:
    """Assert DESIGN §4: `ours` against the float64 `ref`, allowed 2× torch's own error + eps.

    ulp_floor: the eps term is eps·max(1, |ref|) per element, for ops whose outputs are naturally
    larger than 1 (log-softmax and its gradient). eps is an ulp of 1.0; an output near 15 is
    correctly rounded to within half an ulp of 15, four times eps, so with the absolute floor a
    correctly rounded result failed whenever torch happened to round every element exactly (seen:
    float64 log_softmax of rows at −200..−215, e_torch = 0, ours half an ulp of 15 off). Elements
    of |ref| ≤ 1 keep the absolute eps, so an error common to a whole row (a wrong ln l, a rounded
    lse = m + ln l) still fails on the outputs near 0."""
    ours_c, ref_c = ours.detach().double().cpu(), ref.detach().double().cpu()
    tag = f"[{what} seed={seed}; {reproduce_hint()}]"
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
    if ulp_floor:
        finite = torch.isfinite(ref_c)
        d = (ours_c[finite] - ref_c[finite]).abs()
        d = torch.where(torch.isfinite(d), d, torch.full_like(d, float("inf")))
        allowed = 2 * e_torch + torch.finfo(dtype).eps * ref_c[finite].abs().clamp(min=1.0)
        if d.numel() and not bool((d <= allowed).all()):
            i = int((d - allowed).argmax())
            size = ref_c[finite][i].abs().item()
            raise AssertionError(f"{tag} error {d[i].item():.3e} at |ref| = {size:.3e} exceeds "
                                 f"2×torch's {e_torch:.3e} + eps·max(1, |ref|) "
                                 f"({allowed[i].item():.3e}) for {dtype}")
        return
    assert e_ours <= tol, (f"{tag} error {e_ours:.3e} exceeds 2×torch's {e_torch:.3e} + eps "
                           f"({tol:.3e}) for {dtype}")


# -- offline sm_90a builds (CPU CI: what only the compiler rejects, and register spills) -----------
def with_constexpr_defaults(kernel, const: dict) -> dict:
    """`const` plus the defaults of the kernel's constexpr parameters it leaves out: an offline
    build must see those as constexprs, as a launch does, not as runtime arguments."""
    import inspect
    defaults = {p.name: p.default for p in kernel.params
                if p.is_constexpr and p.default is not inspect.Parameter.empty}
    return {**defaults, **const}


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


def build_attention_emulator(name: str, out_dir: pathlib.Path, defines: tuple = ()) -> pathlib.Path:
    """Build tests/emulation/<name>.cpp (an attention kernel, compiled unchanged for the host, with
    `defines` as -D flags) into out_dir; pytest.skip without g++ or the CUDA headers."""
    import pytest
    cxx = shutil.which("g++")
    include = cuda_include()
    if cxx is None or include is None:
        pytest.skip("the kernel emulator needs g++ and the CUDA headers")
    exe = out_dir / name
    cmd = [cxx, "-std=c++17", "-O1", "-Wno-attributes", f"-I{include}", f"-I{ROOT / 'csrc'}",
           "-DTILED_ATTN_EMULATION", *(f"-D{d}" for d in defines), str(ROOT / "tests" / "emulation" / f"{name}.cpp"),
           "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"emulator build failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return exe


def run_attention_emulator(exe: pathlib.Path, head_dim: int, timeout: int) -> str:
    """Run an emulator from build_attention_emulator on every case of `head_dim` with the test's next
    seed (fresh_seed); assert it exits 0 (the message carries the seed and the output's tail) and
    return its stdout."""
    seed = fresh_seed()
    r = subprocess.run([str(exe), str(head_dim), str(seed)], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (f"[seed={seed}; {reproduce_hint()}] emulated {exe.name} failed for "
                               f"D={head_dim}:\n{r.stdout[-6000:]}{r.stderr[-2000:]}")
    return r.stdout
