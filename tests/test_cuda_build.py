"""The CUDA backend's CPU-side contract (tiled_attn/cuda, csrc/bindings.cpp, the CUDA_SOFTMAX table).

Runs on any machine: importing tiled_attn needs no compiler; backend='cuda' refuses CPU tensors with
a ValueError; require() names what is missing; the kernel names agree between Python, the bindings and
csrc/softmax/; every kernel has a launch config for every length; the kernel choice and the split
sizes follow the table. The kernels' numerics run on a GPU (tests/test_softmax.py, parametrized over
ta.softmax_kernels("cuda"), and tests/gpu_sanitize.py under compute-sanitizer).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

import tiled_attn as ta
from tiled_attn import configs
from tiled_attn import cuda as tcuda
from tiled_attn.cuda import _build
from tiled_attn.cuda import softmax as csoftmax

from helpers import cuda_include

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"


@pytest.fixture
def fresh_availability():
    tcuda.is_available.cache_clear()
    yield
    tcuda.is_available.cache_clear()


def test_import_needs_no_compiler():
    """A fresh interpreter with no nvcc/ninja on PATH and no CUDA_HOME imports tiled_attn, lists the
    CUDA kernels and asks is_available() without loading torch.utils.cpp_extension."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = os.path.dirname(sys.executable)
    code = ("import sys, tiled_attn as ta, tiled_attn.cuda as c\n"
            "names = ta.softmax_kernels('cuda')\n"
            "ok = c.is_available()\n"
            "print(len(names), ok, 'torch.utils.cpp_extension' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    n, ok, loaded = out.stdout.split()
    assert int(n) == len(tcuda.SOFTMAX_KERNELS) and loaded == "False"
    if not torch.cuda.is_available():  # with a GPU, a toolchain in a default place may still be found
        assert ok == "False"


def test_cuda_backend_rejects_cpu_tensors():
    x = torch.randn(3, 5)
    for kernel in (None, *tcuda.SOFTMAX_KERNELS):
        with pytest.raises(ValueError, match=r"backend='cuda' needs CUDA tensors, got x on cpu"):
            ta.softmax(x, backend="cuda", kernel=kernel)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_require_without_cuda_names_the_problem(fresh_availability):
    assert not tcuda.is_available()
    with pytest.raises(RuntimeError, match=r"backend='cuda' is not available: .*(CPU-only build|no CUDA device)"):
        tcuda.require()


def test_require_names_a_missing_toolkit(monkeypatch, tmp_path, fresh_availability):
    """With a device but no toolkit (CUDA_HOME without nvcc) the message says how to fix it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"no CUDA toolkit found .*set CUDA_HOME"):
        tcuda.require()
    assert not tcuda.is_available()


def test_require_names_missing_sources(monkeypatch, tmp_path, fresh_availability):
    monkeypatch.setenv("TILED_ATTN_CSRC", str(tmp_path))
    assert _build.csrc_dir() is None
    with pytest.raises(RuntimeError, match=r"csrc/ sources were not found .*TILED_ATTN_CSRC"):
        tcuda.require()


def test_csrc_found_from_env_and_next_to_package(monkeypatch):
    monkeypatch.delenv("TILED_ATTN_CSRC", raising=False)
    assert _build.csrc_dir() == CSRC
    monkeypatch.setenv("TILED_ATTN_CSRC", str(CSRC))
    assert _build.csrc_dir() == CSRC


def test_toolkit_root_behind_a_wrapper(tmp_path):
    """An nvcc wrapper outside the toolkit (e.g. /usr/local/bin/nvcc) still finds the headers when
    it is a symlink into the toolkit."""
    kit = tmp_path / "cuda-x"
    (kit / "bin").mkdir(parents=True)
    (kit / "include").mkdir()
    (kit / "include" / "cuda_runtime.h").write_text("")
    (kit / "bin" / "nvcc").write_text("")
    link_dir = tmp_path / "localbin"
    link_dir.mkdir()
    (link_dir / "nvcc").symlink_to(kit / "bin" / "nvcc")
    assert _build._toolkit_root(link_dir / "nvcc") == kit


def test_arch_flags():
    assert _build.arch_flags((9, 0)) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert _build.arch_flags((8, 0)) == ["-gencode=arch=compute_80,code=sm_80"]
    assert _build.arch_flags((8, 9)) == ["-gencode=arch=compute_89,code=sm_89"]


def test_sources_cover_the_ladder_and_attention():
    srcs, with_attention = _build.sources(CSRC)
    assert srcs[0] == CSRC / "bindings.cpp"
    names = {p.name for p in srcs}
    assert {f"{k}.cu" for k in tcuda.SOFTMAX_KERNELS} | {"backward.cu"} <= names
    assert with_attention == any((CSRC / "attention").glob("*.cu"))


# ------------------------------------------------------------------------------------------------
# names: Python, bindings, csrc/softmax agree
# ------------------------------------------------------------------------------------------------
def test_kernel_names_agree_everywhere():
    assert ta.softmax_kernels("cuda") == list(tcuda.SOFTMAX_KERNELS)
    assert len(set(tcuda.SOFTMAX_KERNELS)) == len(tcuda.SOFTMAX_KERNELS)
    header = (CSRC / "softmax" / "softmax.h").read_text()
    bound = re.findall(r'\{"(\w+)", forward_(\w+)\}', header)  # kForwardKernels, which bindings.cpp binds
    assert [a for a, _ in bound] == list(tcuda.SOFTMAX_KERNELS)
    assert all(a == b for a, b in bound), bound
    assert "sm::kForwardKernels" in (CSRC / "bindings.cpp").read_text()
    for name in tcuda.SOFTMAX_KERNELS:
        src = CSRC / "softmax" / f"{name}.cu"
        assert src.is_file(), f"{name} has no csrc/softmax/{name}.cu"
        text = src.read_text()
        assert re.search(rf"cudaError_t forward_{name}\(", text), f"{src.name} defines no forward_{name}"
        assert f"cudaError_t forward_{name}(" in header
        # llm.c style: the file opens by saying what the rung adds and when it wins
        assert text.startswith(f"// {name}.cu"), f"{src.name} must open with its header comment"


def test_cu_files_include_no_torch():
    for src in CSRC.rglob("*.cu*"):
        text = src.read_text()
        assert not re.search(r"#include\s*[<\"](torch|ATen|c10)/", text), f"{src} includes a torch header"


# ------------------------------------------------------------------------------------------------
# the table and the choices made from it
# ------------------------------------------------------------------------------------------------
LENGTHS = (1, 3, 1024, 1025, 2048, 2049, 8192, 8193, 262144, 262145, 10**8)


@pytest.mark.parametrize("arch", ["sm90", "sm80", "cpu"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_every_kernel_has_a_config_for_every_length(arch, dtype):
    for n in LENGTHS:
        rule = configs.cuda_softmax_config("default", arch, dtype, n)
        assert rule["kernel"] in tcuda.SOFTMAX_KERNELS
        assert rule.get("few_rows_kernel", rule["kernel"]) in tcuda.SOFTMAX_KERNELS
        for kernel in (*tcuda.SOFTMAX_KERNELS, "backward"):
            cfg = configs.cuda_softmax_config(kernel, arch, dtype, n)
            assert 32 <= cfg["threads"] <= 1024 and cfg["threads"] % 32 == 0, (kernel, cfg)
            if kernel == "block_smem_tree":
                assert cfg["threads"] & (cfg["threads"] - 1) == 0, "the tree needs a power of two"
            if kernel in ("split_row", "backward"):
                assert 0 < cfg["min_chunk"] <= cfg["chunk"] and cfg["blocks_per_sm"] >= 1
            if kernel == "block_row_smem":
                assert 1 <= cfg["cluster"] <= 8 and cfg["cta_bytes"] >= 0


@pytest.fixture
def h100(monkeypatch):
    monkeypatch.setattr(csoftmax, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


# The benchmark's softmax shapes (benchmarks/, both dtypes) and the rule's boundaries: warp_row only
# while a lane caches at most 32 values (N <= 1024), then a block per row in registers, in shared
# memory, and split rows for the longest rows or too few rows to fill the SMs.
@pytest.mark.parametrize("m,n,kernel", [
    (262144, 32, "warp_row"), (65536, 128, "warp_row"), (4096, 1000, "warp_row"), (32768, 1024, "warp_row"),
    (4096, 1025, "block_row_reg"), (4096, 2048, "block_row_reg"), (8192, 4096, "block_row_reg"),
    (4096, 8193, "block_row_smem"), (4096, 16384, "block_row_smem"), (512, 131072, "block_row_smem"),
    (8, 131072, "split_row"), (64, 1048576, "split_row"), (8, 4194304, "split_row"), (1, 33554432, "split_row"),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_default_kernel_choice(h100, m, n, kernel, dtype):
    x = torch.empty((m, n), device="meta", dtype=dtype)  # shapes only: nothing is read
    assert csoftmax.plan(x, x, None)[0] == kernel


class _FakeExt:
    """The extension's softmax_max_cols, answering (`limit`, no error) for the on-chip kernels;
    records calls."""

    def __init__(self, limit):
        self.limit = limit
        self.asked = []

    def softmax_max_cols(self, kernel, x, out, threads, cluster, cta_bytes, chunk):
        self.asked.append(kernel)
        return (self.limit if kernel in csoftmax.ON_CHIP_KERNELS else -1), ""


def test_default_hands_rows_past_an_on_chip_limit_to_split_row(h100):
    x = torch.empty((6000, 4096), device="meta").t()  # transposed: the scalar path's limit
    assert csoftmax.plan(x, x, None, _FakeExt(8192))[0] == "block_row_reg"
    assert csoftmax.plan(x, x, None, _FakeExt(4096))[0] == "split_row"


@pytest.mark.parametrize("kernel", csoftmax.ON_CHIP_KERNELS)
def test_pinned_kernel_past_its_limit_raises_value_error_in_python(h100, kernel):
    """Before the extension is asked to launch (its own check, then a C++ exception, killed the first
    H100 runs; it is a returned error now, tests/test_cuda_softmax.py probes it), naming the kernel,
    the limit and the length."""
    x = torch.empty((3, 4097), device="meta")
    ext = _FakeExt(4096)
    with pytest.raises(ValueError, match=rf"kernel='{kernel}' takes rows of at most 4096 columns .* got 4097 "
                                         r"\(kernel='split_row' or kernel=None take any length\)"):
        csoftmax.plan(x, x, kernel, ext)
    assert ext.asked == [kernel]
    assert csoftmax.plan(x[:, :4096], x[:, :4096], kernel, ext)[0] == kernel  # at the limit: taken


def test_only_on_chip_kernels_ask_the_extension_for_a_limit(h100):
    """The limit costs a call into the extension: the other kernels (limit -1 there) skip it."""
    x = torch.empty((3, 5000), device="meta")
    ext = _FakeExt(10)
    for kernel in tcuda.SOFTMAX_KERNELS:
        if kernel not in csoftmax.ON_CHIP_KERNELS:
            assert csoftmax.plan(x, x, kernel, ext)[0] == kernel
    assert ext.asked == []


@pytest.mark.parametrize("result,expected", [("", None), ((4096, ""), 4096), ((-1, ""), -1), ((1, 2, ""), (1, 2)),
                                             (True, True), (["naive"], ["naive"])])
def test_call_returns_the_result_when_there_is_no_error(result, expected):
    assert _build.call(lambda *args: result, 1, "a") == expected


@pytest.mark.parametrize("result", ["ValueError: threads must be a multiple of 32 in [32, 1024], got 33",
                                    (0, "ValueError: threads must be a multiple of 32 in [32, 1024], got 33")])
def test_call_raises_the_error_the_extension_returns(result):
    """The bindings return "Kind: message" instead of throwing (csrc/bindings.cpp, Checker)."""
    with pytest.raises(ValueError) as info:
        _build.call(lambda: result)
    assert str(info.value) == "threads must be a multiple of 32 in [32, 1024], got 33"
    with pytest.raises(TypeError, match=r"^x must be float32, float16 or bfloat16, got Int$"):
        _build.call(lambda: "TypeError: x must be float32, float16 or bfloat16, got Int")
    with pytest.raises(RuntimeError, match=r"^CUDA softmax backward failed: cudaErrorInvalidValue \(x\)$"):
        _build.call(lambda: "RuntimeError: CUDA softmax backward failed: cudaErrorInvalidValue (x)")
    with pytest.raises(RuntimeError, match=r"^no kind here$"):  # an unknown kind: all of it, as RuntimeError
        _build.call(lambda: "no kind here")


def test_every_bound_function_but_the_test_hook_returns_its_errors():
    """No TORCH_CHECK (a C++ throw) in bindings.cpp outside _raise_for_test, and no std::ostream
    (c10::str, <<): an integer inserted into one there crashed the H100 build (bindings.cpp to_text)."""
    text = (CSRC / "bindings.cpp").read_text()
    hook = text[text.index("void raise_for_test("):]
    hook = hook[:hook.index("\n}\n")]
    code = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text.replace(hook, ""))  # string literals out
    code = "\n".join(line.split("//")[0] for line in code.splitlines())  # comments out
    assert re.findall(r"TORCH_CHECK\w*\(|\bthrow\b|c10::str\(|stringstream|<<", code) == []


def test_on_chip_kernels_are_the_ones_the_bindings_limit():
    bindings = (CSRC / "bindings.cpp").read_text()
    body = bindings[bindings.index("int64_t max_cols("):]
    body = body[:body.index("\n}\n")]
    assert tuple(re.findall(r'kernel == "(\w+)"', body)) == csoftmax.ON_CHIP_KERNELS


@pytest.mark.parametrize("m,n", [(1, 33554432), (8, 4194304), (1, 131072), (512, 131072), (3, 70001),
                                 (1, 1), (100000, 5000)])
def test_split_chunks(h100, m, n):
    cfg = configs.cuda_softmax_config("split_row", "sm90", "bf16", n)
    chunk = csoftmax._chunk(cfg, m, n, torch.device("cuda", 0))
    splits = -(-n // chunk)
    blocks = cfg["blocks_per_sm"] * 132
    assert min(n, cfg["min_chunk"]) <= chunk <= cfg["chunk"]
    if n // cfg["min_chunk"] >= -(-blocks // m):  # enough columns to cut: the GPU is filled
        assert splits * m >= blocks


# ------------------------------------------------------------------------------------------------
# bindings.cpp against this torch's headers (no CUDA build of torch needed)
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None or cuda_include() is None,
                    reason="needs g++ and the CUDA headers (cuda_runtime.h)")
# (attention, sm90): the softmax-only build, + the attention kernels, + the wgmma forward (sm_90 builds)
@pytest.mark.parametrize("with_attention,with_sm90", [(0, 0), (1, 0), (1, 1)])
def test_bindings_compile_against_torch_headers(with_attention, with_sm90):
    from torch.utils import cpp_extension
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-w", f"-DTILED_ATTN_WITH_ATTENTION={with_attention}",
           f"-DTILED_ATTN_WITH_SM90={with_sm90}",
           "-DTORCH_EXTENSION_NAME=tiled_attn_cuda", f"-I{sysconfig.get_paths()['include']}",
           f"-I{cuda_include()}", f"-I{CSRC}", *[f"-I{p}" for p in cpp_extension.include_paths()],
           str(CSRC / "bindings.cpp")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]


# ------------------------------------------------------------------------------------------------
# the ladder on the CPU: tests/emulation/softmax_emulator.cpp runs every launcher and kernel of
# csrc/softmax/ (compiled unchanged, softmax_emu.h force-included) with CUDA threads as fibers
# ------------------------------------------------------------------------------------------------
def _gxx(args, **kw):
    return subprocess.run(["g++", "-std=c++17", "-O1", "-fno-strict-aliasing", "-Wno-attributes",
                           f"-I{cuda_include()}", f"-I{CSRC}", "-include",
                           str(ROOT / "tests" / "emulation" / "softmax_emu.h"), *args],
                          capture_output=True, text=True, **kw)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None or cuda_include() is None,
                    reason="needs g++ and the CUDA headers (cuda_runtime.h, cuda_fp16.h)")
def test_softmax_emulator(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from helpers import fresh_seed
    sources = sorted((CSRC / "softmax").glob("*.cu"))
    objects = [tmp_path / f"{s.name}.o" for s in sources]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda so: _gxx(["-x", "c++", "-c", str(so[0]), "-o", str(so[1])], timeout=900),
                                zip(sources, objects)))
    for src, r in zip(sources, results):
        assert r.returncode == 0, f"{src.name} does not compile for the emulator:\n{r.stderr[-4000:]}"
    exe = tmp_path / "softmax_emulator"
    r = _gxx([str(ROOT / "tests" / "emulation" / "softmax_emulator.cpp"), *map(str, objects), "-lpthread",
              "-o", str(exe)], timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    seed = fresh_seed()
    run = subprocess.run([str(exe), str(seed)], capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, f"seed {seed}:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    assert "all passed" in run.stdout
