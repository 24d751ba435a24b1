"""Build and load the csrc/ extension (DESIGN §2): one torch.utils.cpp_extension.load of
csrc/bindings.cpp + csrc/softmax/*.cu + csrc/attention/*.cu (+ csrc/attention/sm90/*.cu, the wgmma
forward, on compute capability 9.0 only), compiled on first use for the current device only, then
cached (ninja rebuilds only what changed; a new arch gets its own build).

Nothing here runs at import: importing tiled_attn never needs a compiler, and `is_available()` only
looks for a device and an nvcc.

Every call into the extension goes through `call(fn, *args)`: the bound functions return their
errors instead of throwing them (csrc/bindings.cpp, Checker and to_text, say why) and `call`
raises them here.

Environment:
    TILED_ATTN_CSRC         the csrc/ directory (default: next to the package, an editable install)
    TILED_ATTN_BUILD_DIR    where to build (default: torch's extension cache, ~/.cache/torch_extensions)
    TILED_ATTN_VERBOSE_BUILD=1  show the compiler's output
    CUDA_HOME / CUDA_PATH   the CUDA toolkit (default: the one holding the nvcc on PATH, /usr/local/cuda)
"""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import torch

EXT_NAME = "tiled_attn_cuda"


def csrc_dir() -> Path | None:
    """The csrc/ sources: $TILED_ATTN_CSRC, else the repository root next to the package."""
    env = os.environ.get("TILED_ATTN_CSRC")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "csrc"
    return path if (path / "bindings.cpp").is_file() else None


def _toolkit_root(nvcc: Path) -> Path | None:
    """The toolkit directory holding include/cuda_runtime.h for this nvcc (it may be a wrapper
    script or a symlink outside the toolkit, e.g. /usr/local/bin/nvcc)."""
    for cand in (nvcc.parent.parent, nvcc.resolve().parent.parent, Path("/usr/local/cuda")):
        if (cand / "include" / "cuda_runtime.h").is_file():
            return cand
    return None


def cuda_home() -> Path | None:
    """The CUDA toolkit: $CUDA_HOME / $CUDA_PATH, else the one of the nvcc on PATH, else
    /usr/local/cuda; None when there is none with both bin/nvcc (or nvcc on PATH) and headers."""
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env:
        home = Path(env)
        return home if (home / "bin" / "nvcc").is_file() else None
    which = shutil.which("nvcc")
    if which:
        return _toolkit_root(Path(which))
    default = Path("/usr/local/cuda")
    return default if (default / "bin" / "nvcc").is_file() else None


def missing() -> list[str]:
    """What stops the extension from building here, as sentences a user can act on ([] = nothing)."""
    problems = []
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            problems.append(f"this torch ({torch.__version__}) is a CPU-only build: install a CUDA "
                            "build of torch (https://pytorch.org/get-started/locally/)")
        else:
            problems.append("no CUDA device is visible (torch.cuda.is_available() is False: check the "
                            "driver and CUDA_VISIBLE_DEVICES)")
    if cuda_home() is None:
        want = f" {torch.version.cuda}" if torch.version.cuda else ""
        problems.append(f"no CUDA toolkit found (nvcc is not on PATH and CUDA_HOME is unset or lacks "
                        f"bin/nvcc): install the CUDA toolkit{want} and set CUDA_HOME, e.g. "
                        "CUDA_HOME=/usr/local/cuda")
    if shutil.which("ninja") is None:
        problems.append("ninja is not installed (torch builds extensions with it): pip install ninja")
    if csrc_dir() is None:
        problems.append("the csrc/ sources were not found next to the package (a wheel install ships "
                        "none): use an editable install (pip install -e .) or set TILED_ATTN_CSRC to "
                        "the repository's csrc/ directory")
    return problems


def arch_flags(capability: tuple[int, int]) -> list[str]:
    """nvcc flags for exactly this device: sm_90a on Hopper (the 'a' target admits its
    arch-specific instructions: wgmma, setmaxnreg), the plain sm_XY elsewhere."""
    major, minor = capability
    if (major, minor) == (9, 0):
        return ["-gencode=arch=compute_90a,code=sm_90a"]
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def sources(csrc: Path, capability: tuple[int, int] | None = None) -> tuple[list[Path], bool]:
    """bindings.cpp, the softmax ladder and, when present, the attention kernel's .cu files; for
    compute capability 9.0 also the wgmma attention forward (csrc/attention/sm90/*.cu: sm_90a
    instructions, so built for that arch only; with_sm90(capability) says whether they are in)."""
    softmax = sorted((csrc / "softmax").glob("*.cu"))
    attention = sorted((csrc / "attention").glob("*.cu"))
    if attention and with_sm90(csrc, capability):
        attention += sorted((csrc / "attention" / "sm90").glob("*.cu"))
    return [csrc / "bindings.cpp", *softmax, *attention], bool(attention)


def with_sm90(csrc: Path, capability: tuple[int, int] | None) -> bool:
    """Whether the build for `capability` includes the wgmma attention forward (csrc/attention/sm90/)."""
    return tuple(capability or ()) == (9, 0) and any((csrc / "attention" / "sm90").glob("*.cu"))


def _verbose() -> bool:
    return os.environ.get("TILED_ATTN_VERBOSE_BUILD", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _load(capability: tuple[int, int]):
    from torch.utils import cpp_extension  # imported here: it pulls in setuptools, and needs no GPU

    problems = missing()
    if problems:
        raise RuntimeError("the tiled_attn CUDA backend cannot be built here: " + "; ".join(problems))
    home = cuda_home()
    if cpp_extension.CUDA_HOME is None or not (Path(cpp_extension.CUDA_HOME) / "include" / "cuda_runtime.h").is_file():
        # torch guesses the toolkit from `which nvcc` once, at import; a wrapper script on PATH
        # (/usr/local/bin/nvcc) makes that guess /usr/local, which has no CUDA headers.
        cpp_extension.CUDA_HOME = str(home)
    csrc = csrc_dir()
    srcs, with_attention = sources(csrc, capability)
    define = f"-DTILED_ATTN_WITH_ATTENTION={int(with_attention)}"
    define_sm90 = f"-DTILED_ATTN_WITH_SM90={int(with_attention and with_sm90(csrc, capability))}"
    # No --use_fast_math: the kernels' exp2f already lowers to one ex2.approx, the one division per
    # row must stay IEEE, and fast-math's flush-to-zero would change tiny probabilities.
    cuda_flags = ["-O3", "-lineinfo", define, define_sm90, *arch_flags(capability)]
    build_dir = os.environ.get("TILED_ATTN_BUILD_DIR")
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    major, minor = capability
    try:
        return cpp_extension.load(
            name=f"{EXT_NAME}_sm{major}{minor}",
            sources=[str(s) for s in srcs],
            extra_cflags=["-O3", define, define_sm90],
            extra_cuda_cflags=cuda_flags,
            extra_include_paths=[str(csrc)],
            build_directory=build_dir,
            with_cuda=True,
            verbose=_verbose(),
        )
    except Exception as e:  # compiler or linker output is in the message / verbose log
        raise RuntimeError(
            f"building the tiled_attn CUDA extension from {csrc} failed ({type(e).__name__}: {e}). "
            "Set TILED_ATTN_VERBOSE_BUILD=1 to see the compiler output.") from e


def load(device: torch.device | int | None = None):
    """The compiled extension module for `device` (default: the current CUDA device)."""
    if isinstance(device, torch.device):
        device = device.index
    if device is None:
        device = torch.cuda.current_device()
    return _load(tuple(torch.cuda.get_device_capability(device)))


# The exceptions an error string of the extension may name ("Kind: message").
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "RuntimeError": RuntimeError}


def call(fn, *args):
    """fn(*args) for a function of the extension, raising the error it returns.

    The bound functions never throw (their TORCH_CHECK errors killed Python with SIGSEGV on the
    H100: csrc/bindings.cpp, to_text, says why): they return an error string, "" on success or
    "ValueError: <msg>" / "TypeError: <msg>" / "RuntimeError: <msg>", alone (softmax_fwd,
    softmax_bwd, attention_fwd: call returns None) or as the last element of a tuple
    (softmax_max_cols: (limit, error); call returns limit, or the tuple of the values before the
    error when there are several). That error is raised as the exception it names, with the message
    after "Kind: " (an unknown kind: RuntimeError with all of it). Any other result (a bool, a list)
    is returned as is.
    """
    result = fn(*args)
    if isinstance(result, str):
        error, value = result, None
    elif isinstance(result, tuple) and result and isinstance(result[-1], str):
        error, value = result[-1], (result[0] if len(result) == 2 else result[:-1])
    else:
        return result
    if error:
        kind, sep, message = error.partition(": ")
        exc = _ERRORS.get(kind) if sep else None
        if exc is None:
            raise RuntimeError(error)
        raise exc(message)
    return value
