"""Sweep the CUDA attention kernel's configurations on the GPU against torch's FlashAttention-2.

    PYTHONPATH=. python benchmarks/sweep_cuda_attention.py --out $OUT/cuda_attn_sweep

The variants are the rows of csrc/attention/sweep/flash_fwd_sweep.cuh (head dim, tile, warps,
stages, flags, and the gain each is predicted to bring). This script
  1. builds them into a small ctypes library with nvcc alone (no torch headers, so no 2-minute
     bindings compile): one object per variant, --jobs in parallel, ptxas -v kept for the register
     and spill count of each; linked against the shared CUDA runtime that torch has already loaded;
  2. per point of the attention suite's grid (bf16, B·N = 32768 tokens, H·D = 2048, D in {64, 128,
     256}, N in {512, 2048, 8192, 16384}, causal and not; inputs (B, H, N, D) contiguous and the
     output laid out (B, N, H, D) like tiled_attn's wrapper) checks SDPA flash and every variant of
     that head dim: DESIGN §4's rule against a float32 reference on the first and last (batch, head)
     pairs (whole rows: every query tile, both ends of the batch and head offsets), lse within 1e-3
     of the reference's there (a missing or doubled key tile moves lse by ~1/N_tiles), and on the
     whole output finite values within 4·e_flash + eps(bf16) of FA2's. A variant that fails is not
     timed;
  3. times the survivors and SDPA flash (and cuDNN with --cudnn, tiled_attn's Triton forward with
     --triton) in interleaved rounds (each round
     runs every provider for ~--round-ms of back-to-back calls timed by CUDA events; the median
     round counts), so clock drift and thermals hit all providers alike;
  4. prints per head dim a variant x point table of TFLOP/s and the ratio to FA2, the worst ratio of
     each variant (the issue's bar: >= 1.0 at every point), and the pick: the variant with the best
     worst-case ratio, overall and separately for non-causal and causal launches, as the lines to
     paste into TileConfig (flash_fwd.cuh) and configs.CUDA_ATTENTION. Writes sweep.json and
     sweep.md to --out.
A --budget (seconds, whole run) stops timing early; what was not timed is marked `skip`.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import hashlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import check_rule, max_err  # noqa: E402
from tiled_attn.cuda import _build  # noqa: E402

TOKENS, HIDDEN = 32768, 2048
HEAD_DIMS = (64, 128, 256)
SEQLENS = (512, 2048, 8192, 16384)
LSE_TOL = 1e-3

# Names of the flag bits of csrc/attention/flash_fwd.cuh (namespace flag), for the report.
FLAGS = {1: "kQRegs", 2: "kFold", 4: "kLean", 8: "kJoint", 16: "kSkew", 32: "kLazy"}
WS = 1 << 16  # a row of the sm90 warp-specialized kernel (sweep_flags::kWs), built on sm_90 only
WS_SPLIT = 1 << 17  # with WS: K and V released apart (sweep_flags::kWsSplit, WsTraits::kSplitRelease)
WS_SINGLE = 1 << 18  # with WS: one CTA per query tile, not the persistent grid (sweep_flags::kWsSingle)
WS_DYNAMIC = 1 << 19  # with WS: the persistent grid fed by a tile counter (sweep_flags::kWsDynamic)
WS_PING_PONG = 1 << 20  # with WS: the consumers' ping-pong (sweep_flags::kWsPingPong, WsTraits::kPingPong)
WS_WIDE = 1 << 21  # with WS: the persistent epilogue's 16-byte stores (sweep_flags::kWsWide, WsTraits::kWideStore)
WS_LOCAL = 1 << 22  # with WS: sections of one KV head's pairs (sweep_flags::kWsLocal, WsTraits::kLocalOrder)
# WsTraits's bool parameters after the consumer count, in order, and the flag that sets each (for the
# report: the names of those set)
WS_OPTIONS = (("split", WS_SPLIT), ("persistent", None), ("dynamic", WS_DYNAMIC), ("ping-pong", WS_PING_PONG),
              ("wide", WS_WIDE), ("local", WS_LOCAL))
CONFIG_FLAGS = {1: "q_in_regs", 2: "fold", 4: "lean", 8: "joint", 16: "skew", 32: "lazy"}

SWEEP_DIR = ROOT / "csrc" / "attention" / "sweep"
# What the extension build and .ci/compile_csrc.sh pass too (torch's cpp_extension adds the defines).
NVCC_FLAGS = ["-std=c++17", "-O3", "-lineinfo", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC",
              "-Xptxas", "-v", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
              "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


def log(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------------
# Build
# ------------------------------------------------------------------------------------------------
def _rows_text() -> list[str]:
    text = (SWEEP_DIR / "flash_fwd_sweep.cuh").read_text()
    body = text[text.index("kSweep[] = {"):text.index("#undef F")]
    return re.findall(r"^\s*\{\d+,.*$", body, flags=re.M)


def variant_count() -> int:
    """Rows of kSweep, counted in the header (the library reports the same number once built)."""
    return len(_rows_text())


def ws_rows() -> list[int]:
    """Indices of the kWs rows (the sm90 warp-specialized kernel), read from the header."""
    return [i for i, row in enumerate(_rows_text()) if re.search(r"\bkWs\b", row.split('"')[0])]


def _sources_digest(flags: list[str]) -> str:
    h = hashlib.sha256(" ".join(flags).encode())
    for path in sorted((ROOT / "csrc").rglob("*")):
        if path.suffix in (".cu", ".cuh", ".h"):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _ptxas_summary(log_text: str) -> dict:
    regs = re.findall(r"Used (\d+) registers", log_text)
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log_text)]
    return {"registers": max(map(int, regs)) if regs else None, "spill_bytes": sum(spills)}


def build(build_root: Path, jobs: int, variants: list[int]) -> tuple[Path, dict]:
    """Compile the entry and the selected variants (one object each, in parallel), link a shared
    library; cached by a digest of csrc/ and the flags. Returns (library, per-variant ptxas info)."""
    home = _build.cuda_home()
    if home is None:
        raise SystemExit("no CUDA toolkit found (nvcc): set CUDA_HOME")
    nvcc = str(home / "bin" / "nvcc")
    cap = torch.cuda.get_device_capability()
    flags = [*NVCC_FLAGS, *_build.arch_flags(cap), f"-I{ROOT / 'csrc'}"]
    digest = _sources_digest(flags + [str(v) for v in variants])
    out = build_root / f"sweep-{digest}"
    lib = out / "libtiled_attn_sweep.so"
    info_path = out / "ptxas.json"
    if lib.is_file() and info_path.is_file():
        log(f"build: cached {lib}")
        return lib, {int(k): v for k, v in json.loads(info_path.read_text()).items()}
    out.mkdir(parents=True, exist_ok=True)
    jobs_list = [("entry", SWEEP_DIR / "flash_fwd_sweep_entry.cu", [])]
    jobs_list += [(f"v{i}", SWEEP_DIR / "flash_fwd_sweep.cu", [f"-DTILED_ATTN_SWEEP_ONLY={i}"]) for i in variants]

    def compile_one(job):
        name, src, extra = job
        t0 = time.perf_counter()
        r = subprocess.run([nvcc, *flags, *extra, "-c", str(src), "-o", str(out / f"{name}.o")],
                           capture_output=True, text=True)
        return name, r.returncode, r.stdout + r.stderr, time.perf_counter() - t0

    t0 = time.perf_counter()
    info, failed = {}, []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for name, rc, text, secs in pool.map(compile_one, jobs_list):
            (out / f"{name}.log").write_text(text)
            if rc != 0:
                failed.append((name, text))
            elif name != "entry":
                info[int(name[1:])] = {**_ptxas_summary(text), "compile_s": round(secs, 1)}
    if failed:
        for name, text in failed:
            log(f"build: {name} FAILED\n{text[-4000:]}")
        raise SystemExit(f"build failed: {', '.join(n for n, _ in failed)}")
    objs = [str(out / "entry.o")] + [str(out / f"v{i}.o") for i in variants]
    r = subprocess.run([nvcc, "-shared", *_build.arch_flags(cap), "-cudart", "shared", "-o", str(lib), *objs,
                        "-Xlinker", f"-rpath={home / 'lib64'}"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"link failed:\n{r.stdout}{r.stderr}")
    info_path.write_text(json.dumps(info))
    log(f"build: {len(variants)} variants in {time.perf_counter() - t0:.1f} s ({jobs} jobs) -> {lib}")
    return lib, info


class SweepLib:
    """The ctypes view of csrc/attention/sweep/flash_fwd_sweep_entry.cu."""

    def __init__(self, path: Path):
        torch.cuda.init()  # torch's libcudart.so is loaded first, so the library binds to the same one
        self.lib = ctypes.CDLL(str(path))
        c = ctypes
        self.lib.tiled_attn_sweep_count.restype = c.c_int
        self.lib.tiled_attn_sweep_info.restype = c.c_int
        self.lib.tiled_attn_sweep_info.argtypes = [c.c_int] + [c.POINTER(c.c_int)] * 5 + [
            c.POINTER(c.c_uint)] + [c.POINTER(c.c_int)] * 4 + [c.POINTER(c.c_char_p)]
        self.lib.tiled_attn_sweep_fwd.restype = c.c_int
        self.lib.tiled_attn_sweep_fwd.argtypes = ([c.c_int] + [c.c_void_p] * 5 + [c.c_int64] * 6 +
                                                  [c.POINTER(c.c_int64), c.c_float, c.c_int, c.c_int64, c.c_void_p])
        self.lib.tiled_attn_sweep_error_string.restype = c.c_char_p
        self.lib.tiled_attn_sweep_error_string.argtypes = [c.c_int]

    def variants(self) -> list[dict]:
        c = ctypes
        rows = []
        for i in range(self.lib.tiled_attn_sweep_count()):
            ints = [c.c_int() for _ in range(5)]
            flags, why = c.c_uint(), c.c_char_p()
            min_blocks, threads, smem, built = (c.c_int() for _ in range(4))
            self.lib.tiled_attn_sweep_info(i, *[c.byref(x) for x in ints], c.byref(flags), c.byref(min_blocks),
                                           c.byref(threads), c.byref(smem), c.byref(built), c.byref(why))
            d, bm, bn, w, s = (x.value for x in ints)
            rows.append({"index": i, "head_dim": d, "block_m": bm, "block_n": bn, "warps": w, "stages": s,
                         "flags": flags.value, "min_blocks": min_blocks.value, "threads": threads.value,
                         "smem_bytes": smem.value, "built": bool(built.value), "why": why.value.decode()})
        return rows

    def error(self, rc: int) -> str:
        return self.lib.tiled_attn_sweep_error_string(rc).decode()


def flag_names(flags: int, names=FLAGS) -> list[str]:
    return [n for bit, n in names.items() if flags & bit]


def describe(v: dict) -> str:
    if v["flags"] & WS:
        on = [name for name, bit in WS_OPTIONS
              if (not v["flags"] & WS_SINGLE if bit is None else v["flags"] & bit)]
        return (f"WsTraits<{v['head_dim']}, {v['block_n']}, {v['block_m'] // 64}: {' '.join(on) or 'single'}> "
                f"({v['stages']} stages)")
    fl = "|".join(flag_names(v["flags"])) or "0"
    mb = v.get("min_blocks")
    return f"Cfg<{v['block_m']}, {v['block_n']}, {v['warps']}, {v['stages']}, {fl}{'' if not mb or mb == 1 else f', {mb}'}>"


def ctas_per_sm(v: dict, regs: int | None) -> int | None:
    """Resident CTAs per SM on sm90 from registers (allocated per warp in 256-register units),
    shared memory (228 KB per SM, 1 KB reserved per CTA) and the 64-warp limit."""
    if not regs:
        return None
    warps = v["threads"] // 32
    by_regs = 65536 // (warps * ((regs * 32 + 255) // 256 * 256))
    by_smem = (228 * 1024) // (v["smem_bytes"] + 1024)
    return max(0, min(by_regs, by_smem, 64 // warps))


# ------------------------------------------------------------------------------------------------
# Points, reference, providers
# ------------------------------------------------------------------------------------------------
def points(head_dims, seqlens=SEQLENS) -> list[dict]:
    return [dict(D=d, N=n, B=TOKENS // n, H=HIDDEN // d, causal=c)
            for d in head_dims for c in (False, True) for n in seqlens]


def label(p: dict) -> str:
    return f"N={p['N']}{' causal' if p['causal'] else ''}"


def flops(p: dict) -> float:
    return 4.0 * p["B"] * p["H"] * p["N"] ** 2 * p["D"] / (2 if p["causal"] else 1)


def reference_rows(q, k, v, pairs, causal: bool, scale: float):
    """float32 (no TF32) output and natural-log lse of the (batch, head) pairs, in row chunks of at
    most 2^27 scores."""
    outs, lses = [], []
    n = q.shape[2]
    rows = max(1, (1 << 27) // n)
    for b, h in pairs:
        qf, kf, vf = (t[b, h].float() for t in (q, k, v))
        o = torch.empty_like(qf)
        lse = torch.empty(n, device=q.device)
        for r0 in range(0, n, rows):
            s = (qf[r0:r0 + rows] @ kf.T) * scale
            if causal:
                i = torch.arange(r0, min(n, r0 + rows), device=q.device)[:, None]
                s.masked_fill_(torch.arange(n, device=q.device)[None, :] > i, float("-inf"))
            lse[r0:r0 + rows] = torch.logsumexp(s, dim=-1)
            o[r0:r0 + rows] = torch.softmax(s, dim=-1) @ vf
            del s
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def sdpa_provider(backend: str, q, k, v, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def run(reps: int = 1):
        with sdpa_kernel([which]):
            for _ in range(reps):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out
    return run


def triton_provider(q, k, v, causal: bool):
    import tiled_attn as ta

    def run(reps: int = 1):
        for _ in range(reps):
            out = ta.attention(q, k, v, causal=causal, backend="triton")
        return out
    return run


def variant_provider(lib: SweepLib, index: int, p: dict, q, k, v, out, lse):
    """One variant on (q, k, v) into `out` (a (B, N, H, D) buffer viewed (B, H, N, D)) and lse."""
    strides = (ctypes.c_int64 * 12)(*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3])
    scale = 1.0 / math.sqrt(p["D"])
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
            p["B"], p["H"], p["H"], p["N"], p["N"], p["D"], strides, scale, int(p["causal"]), 0)
    fwd = lib.lib.tiled_attn_sweep_fwd

    def run(reps: int = 1):
        stream = torch.cuda.current_stream().cuda_stream
        for _ in range(reps):
            rc = fwd(index, *args, stream)
            if rc != 0:
                raise RuntimeError(f"variant {index}: {lib.error(rc)}")
        return out
    return run


def time_rounds(providers: dict, rounds: int, round_ms: float, deadline: float) -> dict:
    """Median ms per call of each provider over `rounds` interleaved rounds of ~round_ms each."""
    per_call = {}
    for name, fn in providers.items():  # warm-up + estimate
        fn(1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(1)
        torch.cuda.synchronize()
        per_call[name] = time.perf_counter() - t0
    reps = {n: max(1, min(200, math.ceil(round_ms / 1e3 / max(t, 1e-6)))) for n, t in per_call.items()}
    samples = {n: [] for n in providers}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        if r >= 2 and time.perf_counter() > deadline:
            break
        for name, fn in providers.items():
            start.record()
            fn(reps[name])
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / reps[name])
    return {n: (statistics.median(s), len(s), reps[n]) for n, s in samples.items()}


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
def summarize(variants: list[dict], pts: list[dict], results: dict) -> dict:
    """Worst and geometric-mean ratio to FA2 per variant (all points, non-causal, causal), and picks."""
    summary, picks = {}, {}
    for d in sorted({p["D"] for p in pts}):
        vs = [v for v in variants if v["head_dim"] == d and v["built"]]
        for v in vs:
            row = {}
            for part, sel in (("all", None), ("plain", False), ("causal", True)):
                rs = [results.get((v["index"], label(p), d), {}).get("ratio") for p in pts
                      if p["D"] == d and (sel is None or p["causal"] == sel)]
                ok = [r for r in rs if r is not None]
                row[part] = {"min": min(ok) if ok and len(ok) == len(rs) else None,
                             "geomean": math.exp(statistics.fmean(math.log(r) for r in ok)) if ok else None,
                             "points": len(ok), "of": len(rs)}
            summary[v["index"]] = row
        for part in ("all", "plain", "causal"):
            cands = [(summary[v["index"]][part]["min"], summary[v["index"]][part]["geomean"], v["index"]) for v in vs
                     if summary[v["index"]][part]["min"] is not None]
            if cands:
                best = max(cands)
                picks[f"{d}/{part}"] = {"variant": best[2], "min_ratio": best[0], "geomean_ratio": best[1]}
    return {"per_variant": summary, "picks": picks}


def config_row(v: dict) -> dict:
    return {"block_m": v["block_m"], "block_n": v["block_n"], "warps": v["warps"], "stages": v["stages"],
            "flags": tuple(flag_names(v["flags"], CONFIG_FLAGS)), "min_blocks": v.get("min_blocks", 1)}


def markdown(meta: dict, variants: list[dict], pts: list[dict], results: dict, summ: dict, ptxas: dict) -> str:
    by_index = {v["index"]: v for v in variants}
    lines = [f"# CUDA attention sweep: {meta['device']}, {meta['date']}", "",
             f"torch {meta['torch']}, CUDA {meta['cuda']}; command: `{meta['command']}`", "",
             "Cells: TFLOP/s (ratio to SDPA flash = FA2, measured in the same interleaved rounds); "
             "FAILED = wrong result (not timed), skip = time budget. FLOPs = 4·B·H·N²·D (halved for causal).", ""]
    for d in sorted({p["D"] for p in pts}):
        dp = [p for p in pts if p["D"] == d]
        lines += [f"## D = {d}", "", "| variant | Cfg | regs | CTAs/SM | " + " | ".join(label(p) for p in dp) +
                  " | worst | geomean |", "|" + "---|" * (len(dp) + 6)]
        for name in ("sdpa-flash", "sdpa-cudnn", "triton"):
            cells = [results.get((name, label(p), d)) for p in dp]
            if any(cells):
                lines.append(f"| {name} | | | | " + " | ".join(
                    f"{c['tflops']:.0f}" if c and c.get("tflops") else (c or {}).get("status", "") for c in cells) +
                    " | | |")
        for v in [v for v in variants if v["head_dim"] == d]:
            cells = []
            for p in dp:
                r = results.get((v["index"], label(p), d))
                if not r:
                    cells.append("")
                elif r.get("tflops"):
                    cells.append(f"{r['tflops']:.0f} ({r['ratio']:.2f})")
                else:
                    cells.append(r["status"])
            s = summ["per_variant"].get(v["index"], {}).get("all", {})
            info = ptxas.get(v["index"], {})
            worst = f"{s['min']:.3f}" if s.get("min") is not None else ""
            geo = f"{s['geomean']:.3f}" if s.get("geomean") is not None else ""
            cfg = describe(v).replace("|", "\\|")  # a pipe inside a table cell, even in code, splits it
            lines.append(f"| {v['index']} | `{cfg}` | {info.get('registers', '')}"
                         f"{'+spill' if info.get('spill_bytes') else ''} | {ctas_per_sm(v, info.get('registers')) or ''} | " +
                         " | ".join(cells) + f" | {worst} | {geo} |")
        lines.append("")
        for part in ("all", "plain", "causal"):
            pk = summ["picks"].get(f"{d}/{part}")
            if pk:
                v = by_index[pk["variant"]]
                lines.append(f"- best worst-case ratio ({part}): variant {pk['variant']} `{describe(v)}` "
                             f"min {pk['min_ratio']:.3f}, geomean {pk['geomean_ratio']:.3f}")
        lines.append("")
    lines += ["## Predictions (csrc/attention/sweep/flash_fwd_sweep.cuh)", ""]
    lines += [f"- {v['index']} D={v['head_dim']} `{describe(v)}`: {v['why']}" for v in variants]
    lines += ["", "## To adopt a pick", "",
              "Non-causal (or both): `template <> struct TileConfig<D> { using type = Cfg<...>; };` in "
              "csrc/attention/flash_fwd.cuh and the row `(\"fwd\", \"any\", \"*\", D)` in configs.CUDA_ATTENTION; "
              "a different causal pick: `template <> struct TileConfig<D, true> { using type = Cfg<...>; };` and "
              "the row `(\"fwd\", \"any\", \"*\", D, \"causal\")`.", ""]
    for key, pk in summ["picks"].items():
        d, part = key.split("/")
        v = by_index[pk["variant"]]
        tmpl = "TileConfig<%s%s>" % (d, ", true" if part == "causal" else "")
        lines.append(f"- {key}: `template <> struct {tmpl} {{ using type = {describe(v)}; }};` / "
                     f"`{config_row(v)}`")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# Adopting the picks
# ------------------------------------------------------------------------------------------------
def choose(picks: dict, d: int, split_margin: float = 0.005) -> tuple[int, int | None]:
    """(variant for every launch of head dim d, variant for causal launches or None). Causal gets its
    own row only when the separate non-causal and causal picks beat the single pick's worst ratio."""
    both, plain, causal = (picks.get(f"{d}/{part}") for part in ("all", "plain", "causal"))
    if plain and causal and plain["variant"] != causal["variant"] and (
            both is None or min(plain["min_ratio"], causal["min_ratio"]) > both["min_ratio"] + split_margin):
        return plain["variant"], causal["variant"]
    return (both or plain or causal)["variant"], None


def _cfg_text(v: dict) -> str:
    fl = " | ".join(f"flag::{n}" for n in flag_names(v["flags"])) or "0"
    return f"Cfg<{v['block_m']}, {v['block_n']}, {v['warps']}, {v['stages']}, {fl}" + (
        f", {v['min_blocks']}>" if v.get("min_blocks", 1) != 1 else ">")


def _row_text(d: int, v: dict, causal: bool) -> str:
    key = f'("fwd", "any", "*", {d}' + (', "causal")' if causal else ")")
    names = [f'"{n}"' for n in flag_names(v["flags"], CONFIG_FLAGS)]
    flags = "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"
    return (f'    {key}: {{"block_m": {v["block_m"]}, "block_n": {v["block_n"]}, "warps": {v["warps"]}, '
            f'"stages": {v["stages"]}, "flags": {flags}, "min_blocks": {v.get("min_blocks", 1)}}},')


def apply_picks(sweep_json: Path, root: Path = ROOT) -> list[str]:
    """Rewrite TileConfig<D> (and TileConfig<D, true>) in csrc/attention/flash_fwd.cuh and the
    matching configs.CUDA_ATTENTION rows for every head dim the sweep measured. Returns what changed."""
    doc = json.loads(sweep_json.read_text())
    by_index = {v["index"]: v for v in doc["variants"]}
    picks = doc["summary"]["picks"]
    cuh_path, cfg_path = root / "csrc" / "attention" / "flash_fwd.cuh", root / "tiled_attn" / "configs.py"
    cuh, cfg = cuh_path.read_text(), cfg_path.read_text()
    changes = []
    for d in sorted({int(k.split("/")[0]) for k in picks}):
        main_v, causal_v = choose(picks, d)
        if any(by_index[i]["flags"] & WS for i in (main_v, causal_v) if i is not None):
            raise SystemExit(f"D={d}: the pick is a kWs row (the sm90 warp-specialized kernel): adopt it by hand "
                             "in ws_consumers / ws_block_n (csrc/attention/sm90/flash_fwd_sm90_ws_kernel.cuh)")
        plain_re = re.compile(r"template <>\s*struct TileConfig<%d> \{[^}]*\};\n" % d)
        causal_re = re.compile(r"template <>\s*struct TileConfig<%d, true> \{[^}]*\};\n" % d)
        cuh = causal_re.sub("", cuh)
        text = f"template <>\nstruct TileConfig<{d}> {{ using type = {_cfg_text(by_index[main_v])}; }};\n"
        if causal_v is not None:
            text += f"template <>\nstruct TileConfig<{d}, true> {{ using type = {_cfg_text(by_index[causal_v])}; }};\n"
        cuh, n = plain_re.subn(lambda _m: text, cuh)
        if n != 1:
            raise SystemExit(f"TileConfig<{d}> not found once in {cuh_path}")
        cfg = re.sub(r'\n    \("fwd", "any", "\*", %d, "causal"\): \{[^}]*\},' % d, "", cfg)
        rows = _row_text(d, by_index[main_v], False)
        if causal_v is not None:
            rows += "\n" + _row_text(d, by_index[causal_v], True)
        cfg, n = re.subn(r'    \("fwd", "any", "\*", %d\): \{[^}]*\},' % d, lambda _m: rows, cfg)
        if n != 1:
            raise SystemExit(f'the ("fwd", "any", "*", {d}) row not found once in {cfg_path}')
        changes.append(f"D={d}: variant {main_v} {describe(by_index[main_v])}" +
                       (f", causal: variant {causal_v} {describe(by_index[causal_v])}" if causal_v is not None else ""))
    cuh_path.write_text(cuh)
    cfg_path.write_text(cfg)
    return changes


# ------------------------------------------------------------------------------------------------
def run_point(p: dict, lib: SweepLib, variants: list[dict], results: dict, gen, args, deadline: float,
              t_start: float) -> None:
    """Check SDPA flash (and cuDNN) and every variant of p's head dim at point p, then time the
    ones that pass; fills results[(provider, label, D)]."""
    dev = torch.device("cuda")
    d, causal = p["D"], p["causal"]
    q, k, v_ = (torch.randn(p["B"], p["H"], p["N"], d, generator=gen, device=dev, dtype=torch.bfloat16)
                for _ in range(3))
    pairs = [(0, 0), (p["B"] - 1, p["H"] - 1)]
    ref_o, ref_lse = reference_rows(q, k, v_, pairs, causal, 1.0 / math.sqrt(d))

    def sub(t):  # the checked (batch, head) pairs
        return torch.stack([t[b, h] for b, h in pairs]).float()

    providers = {"sdpa-flash": sdpa_provider("flash", q, k, v_, causal)}
    if args.cudnn:
        providers["sdpa-cudnn"] = sdpa_provider("cudnn", q, k, v_, causal)
    flash_out = providers["sdpa-flash"]().clone()
    e_flash = max_err(sub(flash_out), ref_o)
    if args.triton:  # tiled_attn's Triton forward (backend=None's default), checked like a variant
        triton_fn = triton_provider(q, k, v_, causal)
        chk = check_rule(sub(triton_fn()), ref_o, e_flash, torch.bfloat16)
        if chk.ok:
            providers["triton"] = triton_fn
        else:
            results[("triton", label(p), d)] = {"status": "FAILED", "message": chk.message}
    if "sdpa-cudnn" in providers:
        try:
            chk = check_rule(sub(providers["sdpa-cudnn"]()), ref_o, e_flash, torch.bfloat16)
            status = "ok" if chk.ok else "FAILED"
        except RuntimeError as e:
            status = "unsupported"
            log(f"  sdpa-cudnn D={d} {label(p)}: unsupported ({str(e)[:100]})")
        if status != "ok":
            providers.pop("sdpa-cudnn")
            results[("sdpa-cudnn", label(p), d)] = {"status": status}

    out_buf = torch.empty(p["B"], p["N"], p["H"], d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    lse_buf = torch.empty(p["B"], p["H"], p["N"], device=dev, dtype=torch.float32)
    for v in [v for v in variants if v["head_dim"] == d]:
        key = (v["index"], label(p), d)
        fn = variant_provider(lib, v["index"], p, q, k, v_, out_buf, lse_buf)
        out_buf.fill_(float("nan"))
        lse_buf.fill_(float("nan"))
        try:
            fn()
            torch.cuda.synchronize()
        except RuntimeError as e:
            results[key] = {"status": "error", "message": str(e)[:200]}
            log(f"  variant {v['index']} D={d} {label(p)}: ERROR {e}")
            if not torch.cuda.is_available() or "illegal" in str(e) or "launch failure" in str(e):
                raise
            continue
        chk = check_rule(sub(out_buf), ref_o, e_flash, torch.bfloat16)
        e_lse = max_err(torch.stack([lse_buf[b, h] for b, h in pairs]), ref_lse)
        finite = bool(torch.isfinite(out_buf).all()) and bool(torch.isfinite(lse_buf).all())
        e_full = max_err(out_buf.float(), flash_out.float())
        tol_full = 4 * e_flash + torch.finfo(torch.bfloat16).eps
        msg = []
        if not chk.ok:
            msg.append(chk.message)
        if not e_lse <= LSE_TOL:
            msg.append(f"lse error {e_lse:.2e} > {LSE_TOL}")
        if not finite:
            msg.append("non-finite output or lse")
        if not e_full <= tol_full:
            msg.append(f"max|ours - flash| {e_full:.2e} > {tol_full:.2e}")
        if msg:
            results[key] = {"status": "FAILED", "message": "; ".join(msg)}
            log(f"  variant {v['index']} D={d} {label(p)}: FAILED {'; '.join(msg)}")
            continue
        results[key] = {"status": "ok", "e_ours": chk.e_ours, "e_flash": e_flash, "e_lse": e_lse}
        providers[v["index"]] = fn

    timed = time_rounds(providers, args.rounds, args.round_ms, deadline)
    f_ms = timed["sdpa-flash"][0]
    for name, (ms, n_rounds, reps) in timed.items():
        r = results.setdefault((name, label(p), d), {"status": "ok"})
        r.update(ms=ms, tflops=flops(p) / ms / 1e9, ratio=f_ms / ms, rounds=n_rounds, reps=reps)
    short = {"sdpa-flash": "FA2", "sdpa-cudnn": "cuDNN", "triton": "triton"}
    line = " ".join(f"{short.get(n, f'v{n}')}:{flops(p) / t[0] / 1e9:.0f}" for n, t in timed.items())
    log(f"D={d:3d} {label(p):14s} {line}  ({time.perf_counter() - t_start:.0f} s)")


# ------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="directory for sweep.json and sweep.md")
    ap.add_argument("--apply", type=Path, metavar="SWEEP_JSON",
                    help="no GPU: write the picks of a finished sweep into TileConfig (flash_fwd.cuh) and "
                         "configs.CUDA_ATTENTION, then exit")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="parallel nvcc processes")
    ap.add_argument("--build-dir", type=Path, default=None,
                    help="where objects and the library go (default: $TILED_ATTN_BUILD_DIR or ~/.cache/tiled_attn)")
    ap.add_argument("--head-dims", type=int, nargs="*", default=list(HEAD_DIMS))
    ap.add_argument("--variants", type=int, nargs="*", default=None, help="variant indices (default: all)")
    ap.add_argument("--ws", action="store_true",
                    help="only the kWs rows (the sm90 warp-specialized kernel's tiles); add --cudnn to compare")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--round-ms", type=float, default=15.0)
    ap.add_argument("--cudnn", action="store_true", help="also time SDPA's cuDNN backend")
    ap.add_argument("--triton", action="store_true", help="also time tiled_attn's Triton forward (backend='triton')")
    ap.add_argument("--seqlens", type=int, nargs="*", default=list(SEQLENS), help="N of the points (B = 32768 / N)")
    ap.add_argument("--budget", type=float, default=160.0, help="seconds for the whole run; timing stops early")
    args = ap.parse_args(argv)
    if args.apply:
        for line in apply_picks(args.apply):
            log(line)
        log("now: bash .ci/compile_csrc.sh csrc/attention && python -m pytest -q tests/test_cuda_attention_kernel.py")
        return 0
    if args.out is None:
        ap.error("--out is required (or --apply SWEEP_JSON)")
    t_start = time.perf_counter()
    deadline = t_start + args.budget
    if not torch.cuda.is_available():
        raise SystemExit("the sweep needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    args.out.mkdir(parents=True, exist_ok=True)

    n_all = variant_count()
    selected = sorted(set(args.variants)) if args.variants is not None else list(range(n_all))
    if args.ws:
        selected = [i for i in selected if i in set(ws_rows())]
    if torch.cuda.get_device_capability() != (9, 0):
        selected = [i for i in selected if i not in set(ws_rows())]  # sm_90a instructions
    build_root = args.build_dir or Path(os.environ.get("TILED_ATTN_BUILD_DIR") or Path.home() / ".cache" / "tiled_attn")
    lib_path, ptxas = build(build_root, args.jobs, selected)
    lib = SweepLib(lib_path)
    listed = lib.variants()
    if len(listed) != n_all:
        raise SystemExit(f"the library lists {len(listed)} variants, the header {n_all}: "
                         "keep one kSweep row per line in flash_fwd_sweep.cuh")
    variants = [v for v in listed if v["built"] and v["head_dim"] in args.head_dims]
    log(f"{len(variants)} variants on {torch.cuda.get_device_name()} (build + load {time.perf_counter() - t_start:.1f} s)")
    for v in variants:
        info = ptxas.get(v["index"], {})
        log(f"  {v['index']:2d} D={v['head_dim']:3d} {describe(v):48s} regs {info.get('registers')} spill "
            f"{info.get('spill_bytes')} smem {v['smem_bytes'] // 1024} KB CTAs/SM {ctas_per_sm(v, info.get('registers'))}")

    pts = points(args.head_dims, args.seqlens)
    results: dict = {}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(20261122)
    aborted = None
    for p in pts:
        if time.perf_counter() > deadline:
            log(f"budget reached: skipping D={p['D']} {label(p)}")
            for v in variants:
                if v["head_dim"] == p["D"]:
                    results[(v["index"], label(p), p["D"])] = {"status": "skip"}
            continue
        try:
            run_point(p, lib, variants, results, gen, args, deadline, t_start)
        except Exception as e:  # a sticky CUDA error (illegal address) poisons every later call
            aborted = f"D={p['D']} {label(p)}: {type(e).__name__}: {e}"
            log(f"ABORTED at {aborted}")
            break

    summ = summarize(variants, pts, results)
    meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(),
            "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + (argv or sys.argv[1:])),
            "seconds": round(time.perf_counter() - t_start, 1)}
    if aborted:
        meta["aborted"] = aborted
    records = []
    for (who, lab, d), r in results.items():
        records.append({"provider": who if isinstance(who, str) else f"variant{who}", "variant": who if isinstance(who, int) else None,
                        "D": d, "point": lab, **r})
    doc = {"meta": meta, "variants": [{**v, "ptxas": ptxas.get(v["index"]), "cfg": describe(v)} for v in variants],
           "records": records, "summary": {"per_variant": {str(k): v for k, v in summ["per_variant"].items()},
                                           "picks": summ["picks"]}}
    (args.out / "sweep.json").write_text(json.dumps(doc, indent=1))
    md = markdown(meta, variants, pts, results, summ, ptxas)
    (args.out / "sweep.md").write_text(md)
    log("")
    log(md)
    log(f"wrote {args.out / 'sweep.json'} and {args.out / 'sweep.md'} ({meta['seconds']} s)")
    return 1 if aborted else 0


if __name__ == "__main__":
    raise SystemExit(main())
