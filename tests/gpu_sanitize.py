#!/usr/bin/env python
"""Every CUDA softmax kernel, forward and backward, at odd sizes and awkward layouts, checked against
float64 under the numerics rule (tests/helpers.py); exits non-zero on any mismatch or CUDA error.
A script (not collected by pytest), meant to run under compute-sanitizer:

    PYTHONPATH=. python -c "import tiled_attn.cuda as c; c.load()"     # build once, outside it
    PYTHONPATH=. compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu_sanitize.py
    PYTHONPATH=. compute-sanitizer --tool racecheck --error-exitcode 1 python tests/gpu_sanitize.py --quick
    PYTHONPATH=. python tests/gpu_sanitize.py --attention --big            # plain run, + 2^31 offsets

The caching allocator is switched off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) so every tensor is its own
cudaMalloc and memcheck sees an access one element past a tensor. Outputs are NaN-poisoned, so an
element a kernel forgets to write fails the check.
Cases: N in {1, 3, 33, 1000, 1025, 4097, 70001} with odd M, a many-rows case, float32/bfloat16/
float16, four layouts (contiguous; transposed: column stride M; a 1-element offset: misaligned base;
padded rows: row stride N + 5), an all -inf first row, the backward with a matching dy layout; then
split_row, the backward and block_row_smem again with tiny chunks / CTA shares so that rows are cut
into many pieces (partial last chunk, cluster CTAs with empty ranges) at these small sizes. A kernel
that holds a row on chip (block_row_reg, block_row_smem) runs only rows it takes (its limit depends
on dtype and layout: the extension's softmax_max_cols); the group "limits" runs each of them at its
limit and checks that one column more raises ValueError, before any launch.
Every case is printed before it runs (flushed), so a crash names its case.
--attention adds ta.attention(backend="cuda") at ragged sizes (MHA/GQA, causal both ways; head dims
64 and 128, or --attention-head-dims);
--attention-backward the Triton attention backward kernels (gradients of ta.attention(backend="triton")
at ragged sizes, odd D, MHA/GQA/MQA, a (B, N, H, D) layout, every dtype; --bwd-backend cuda: the wgmma
backward's, at D 64 / 128 in 16-bit); --no-softmax skips the
softmax kernels (a sanitizer run of the attention backward alone).
--big adds (2^31/4096 + 2) × 4096 bf16 (row offsets past 2^31) and a transposed 8 × (2^28 + 2)
(column offsets past 2^31): ~10 GB of device memory, minutes; not for the sanitizer.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import contextlib
import math
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/helpers.py

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tiled_attn as ta  # noqa: E402
from tiled_attn import _checks, _plan, configs, reference  # noqa: E402
from tiled_attn import cuda as tcuda  # noqa: E402
from tiled_attn.cuda import softmax as csoftmax  # noqa: E402
from helpers import assert_rule, fresh_seed  # noqa: E402

DEVICE = "cuda"  # run_attention_backward's tensors (a CPU dry run under the interpreter sets "cpu")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NS = (1, 3, 33, 1000, 1025, 4097, 70001)
LAYOUTS = ("contiguous", "transposed", "offset", "padded")


class Results:
    def __init__(self):
        self.counts = collections.Counter()
        self.failures: list[str] = []

    @contextlib.contextmanager
    def case(self, group: str, what: str):
        print(f"  {what}", flush=True)  # before it runs: a crash (no report) still names its case
        try:
            yield
            torch.cuda.synchronize()  # an asynchronous CUDA error surfaces here, in this case
            self.counts[(group, "ok")] += 1
        except Exception:  # noqa: BLE001 — record and go on: one report lists every failure
            self._fail(group, what)

    def skip(self, group: str):
        self.counts[(group, "skipped (row past the kernel's limit)")] += 1

    def _fail(self, group, what):
        self.counts[(group, "FAILED")] += 1
        self.failures.append(f"{what}\n{traceback.format_exc(limit=3)}")
        print(f"FAILED {what}", flush=True)


def make(m: int, n: int, dtype: torch.dtype, layout: str, gen: torch.Generator) -> torch.Tensor:
    """An (m, n) matrix with the given layout, every element drawn; row 0 all -inf when m >= 3."""
    def draw(*shape):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(dtype).cuda()
    if layout == "contiguous":
        x = draw(m, n)
    elif layout == "transposed":
        x = draw(n, m).t()
    elif layout == "offset":
        x = draw(m * n + 1)[1:].view(m, n)
    elif layout == "padded":
        x = draw(m, n + 5)[:, :n]
    else:
        raise ValueError(layout)
    if m >= 3:
        x[0] = float("-inf")
    return x


def limit_of(kernel, x: torch.Tensor) -> int:
    """The longest row `kernel` takes for x's dtype and layout on its device (-1: any), as the
    extension reports it (tiled_attn/cuda/softmax.py raises ValueError past it)."""
    if kernel not in csoftmax.ON_CHIP_KERNELS:
        return -1
    m, n = x.shape
    cfg = configs.cuda_softmax_config(kernel, configs.arch(x.device), configs.dtype_key(x.dtype), n)
    args = csoftmax._launch_args(kernel, cfg, m, n, x.device)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    return tcuda._build.call(tcuda.load(x.device).softmax_max_cols, kernel, x, out, *args)


def check_forward(res: Results, x: torch.Tensor, kernel, seed: int, what: str, group: str):
    if 0 <= limit_of(kernel, x) < x.shape[-1]:
        res.skip(group)  # the group "limits" checks the ValueError
        return
    with res.case(group, what):
        y = ta.softmax(x, -1, backend="cuda", kernel=kernel)
        assert_rule(y, torch.softmax(x.double().cpu(), -1), torch.softmax(x, -1), dtype=x.dtype, seed=seed,
                    what=what)


def check_backward(res: Results, x: torch.Tensor, dy: torch.Tensor, seed: int, what: str, group: str):
    with res.case(group, what):
        xl = x.detach().requires_grad_()
        (dx,) = torch.autograd.grad(ta.softmax(xl, -1, backend="cuda"), xl, dy)
        xt = x.detach().requires_grad_()
        (dx_torch,) = torch.autograd.grad(torch.softmax(xt, -1), xt, dy)
        ref = reference.softmax_backward(torch.softmax(x.double().cpu(), -1), dy.double().cpu(), -1)
        assert_rule(dx, ref, dx_torch, dtype=x.dtype, seed=seed, what=what)


def check_limits(res: Results, kernels, dtypes, seed: int):
    """Each on-chip kernel at exactly its limit, contiguous (one row: 16-byte packs) and transposed
    (two rows: the scalar path, a lower limit), and one column more: ValueError before any launch
    (the check runs in Python; the extension has the same check, and a C++ exception from it must
    not kill the process either: tests/test_cuda_softmax.py probes that)."""
    gen = torch.Generator().manual_seed(seed)
    for kernel in (k for k in csoftmax.ON_CHIP_KERNELS if k in kernels):
        for dtype in dtypes:
            dname = str(dtype).replace("torch.", "")
            for layout, m in (("contiguous", 1), ("transposed", 2)):
                limit = limit_of(kernel, make(m, 8, dtype, layout, gen))
                x = make(m, limit, dtype, layout, gen)
                check_forward(res, x, kernel, seed, f"forward {kernel} at its limit {m}x{limit} {dname} {layout}",
                              "limits")
                x = make(m, limit + 1, dtype, layout, gen)
                what = f"forward {kernel} past its limit {m}x{limit + 1} {dname} {layout}: ValueError"
                with res.case("limits", what):
                    assert limit_of(kernel, x) == limit, (limit_of(kernel, x), limit)
                    try:
                        ta.softmax(x, -1, backend="cuda", kernel=kernel)
                    except ValueError as e:
                        assert f"takes rows of at most {limit} columns" in str(e), str(e)
                    else:
                        raise AssertionError("no ValueError")


def rows_of(n: int) -> int:
    return 7 if n <= 1025 else 3


@contextlib.contextmanager
def patched(kernel: str, **fields):
    """Override fields of every CUDA_SOFTMAX row of `kernel` (restored after)."""
    saved = {k: dict(v) for k, v in configs.CUDA_SOFTMAX.items() if k[0] == kernel}
    for k in saved:
        configs.CUDA_SOFTMAX[k] = {**saved[k], **fields}
    try:
        yield
    finally:
        configs.CUDA_SOFTMAX.update(saved)


def run_softmax(res: Results, args, seed: int):
    gen = torch.Generator().manual_seed(seed)
    kernels = args.kernels or [None, *tcuda.SOFTMAX_KERNELS]
    dtypes = [DTYPES[d] for d in args.dtypes]
    ns = NS[::2] if args.quick else NS
    for dtype in dtypes:
        dname = str(dtype).replace("torch.", "")
        for n in ns:
            m = rows_of(n)
            for layout in (LAYOUTS[:2] if args.quick else LAYOUTS):
                x = make(m, n, dtype, layout, gen)
                for kernel in kernels:
                    check_forward(res, x, kernel, seed, f"forward {kernel or 'default'} {m}x{n} {dname} {layout}",
                                  f"forward/{kernel or 'default'}")
                dy = make(m, n, dtype, layout, gen)
                dy[0] = 1.0  # finite: the -inf row of x already gives NaN
                check_backward(res, x, dy, seed, f"backward {m}x{n} {dname} {layout}", "backward")
        # many rows of a short row: grid-stride loops, spare row groups in a warp (8/16-lane groups)
        for m, n in ((1001, 33), (5, 3), (333, 17), (97, 681)):
            x = make(m, n, dtype, "contiguous", gen)
            for kernel in kernels:
                check_forward(res, x, kernel, seed, f"forward {kernel or 'default'} {m}x{n} {dname}",
                              f"forward/{kernel or 'default'}")
            check_backward(res, x, make(m, n, dtype, "contiguous", gen), seed, f"backward {m}x{n} {dname}",
                           "backward")
        # rows cut into many pieces at small sizes
        with patched("split_row", chunk=512, min_chunk=128), patched("backward", chunk=512, min_chunk=128), \
                patched("block_row_smem", cta_bytes=256), patched("flat_rows", cta_bytes=64):
            for n in (33, 1025, 4097):
                for layout in ("contiguous", "transposed"):
                    x = make(rows_of(n), n, dtype, layout, gen)
                    for kernel in ("split_row", "block_row_smem", "flat_rows"):
                        check_forward(res, x, kernel, seed, f"forward {kernel} tiny pieces {x.shape[0]}x{n} "
                                      f"{dname} {layout}", f"forward/{kernel} (tiny pieces)")
                    dy = make(rows_of(n), n, dtype, layout, gen)
                    check_backward(res, x, dy, seed, f"backward tiny chunks {x.shape[0]}x{n} {dname} {layout}",
                                   "backward (tiny chunks)")


def run_attention(res: Results, seed: int, only=None, head_dims=(64, 128)):
    from tiled_attn.cuda import attention as cuda_attention
    gen = torch.Generator().manual_seed(seed)
    shapes = ((1, 1), (17, 33), (63, 1), (128, 257), (1, 1000), (300, 300), (257, 128))
    # The mma.sync kernel (its split-KV path at (1, 1000)) and, on sm_90, the wgmma kernels forced.
    kernels = ["mma"] + (["wgmma", "wgmma_ws"] if torch.cuda.get_device_capability() == (9, 0) else [])
    kernels = [k for k in kernels if only is None or k in only]
    for kernel, dtype, d, (nq, nk), (hq, hkv), causal in itertools.product(
            kernels, (torch.float16, torch.bfloat16), head_dims, shapes, ((2, 2), (6, 2)), (False, True)):
        if kernel != "mma" and d not in cuda_attention.sm90_head_dims(kernel):
            continue
        what = f"attention/{kernel} {nq}x{nk} D={d} H={hq}/{hkv} causal={causal} {dtype}"
        with res.case("attention", what), cuda_attention.forced_kernel(kernel):
            q, k, v = (torch.randn((1, h, s, d), generator=gen).to(dtype).cuda()
                       for h, s in ((hq, nq), (hkv, nk), (hkv, nk)))
            out, lse = ta.attention(q, k, v, causal=causal, return_lse=True, backend="cuda")
            scale, offset = 1 / math.sqrt(d), nk - nq
            ref_out, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal,
                                                   scale, True, offset)
            g = hq // hkv
            kr, vr = (t.repeat_interleave(g, dim=1) for t in (k, v))
            mask = reference._causal_mask(nq, nk, q.device, offset) if causal else None
            t_out = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, scale=scale)
            seen = (mask.any(dim=1) if causal else torch.ones(nq, dtype=torch.bool, device=q.device))
            t_out = torch.where(seen[:, None].cpu(), t_out.double().cpu(), ref_out.cpu())
            s = (q.float() @ kr.float().transpose(-1, -2)) * scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            assert_rule(out, ref_out, t_out, dtype=dtype, seed=seed, what=what + " out")
            assert_rule(lse, ref_lse, torch.logsumexp(s, -1), dtype=dtype, seed=seed,
                        what=what + " lse")
    # The persistent wgmma_ws grid with more query tiles than SMs (each CTA walks several: the ring's and
    # Q's barrier phases across tiles), and sections of a few pairs (16k keys).
    if "wgmma_ws" in kernels:
        from test_cuda_attention_kernel import _check_batches
        for d, (nq, nk), causal in itertools.product(head_dims, ((1000, 1000), (300, 16000)), (False, True)):
            if d not in cuda_attention.sm90_head_dims("wgmma_ws"):
                continue
            what = f"attention/wgmma_ws persistent 4x32/8 {nq}x{nk} D={d} causal={causal}"
            with res.case("attention", what), cuda_attention.forced_kernel("wgmma_ws"):
                q, k, v = (torch.randn((4 if nk < 4096 else 2, h, s, d), generator=gen).to(torch.bfloat16).cuda()
                           for h, s in ((32, nq), (8, nk), (8, nk)))
                out, lse = ta.attention(q, k, v, causal=causal, return_lse=True, backend="cuda")
                _check_batches(out, lse, q, k, v, causal, nk - nq, 1 / math.sqrt(d), seed, what, (0, q.shape[0] - 1))


def run_attention_backward(res: Results, seed: int, quick: bool, dtypes=None, backend: str = "triton",
                           only: str | None = None):
    """The Triton attention backward (delta, dK/dV, dQ kernels) at ragged sizes: odd D, Nq != Nk
    both ways (causal rows that see no key), MHA/GQA/MQA, a transposed (B, N, H, D) layout, each
    dtype; gradients against float64 autograd under tests/test_attention_backward.py's check (the
    rule, with its float32 recompute slack, and dq exactly 0 on rows that see no key), poisoned
    outputs. backend="cuda": the same cases at the wgmma backward's head dims and dtypes (64, 128;
    fp16, bf16), which is what backend "cuda" runs there on an H100. only: the kinds tagged so
    ("f32", "split"), e.g. a racecheck of one change's path."""
    from test_attention_backward import _check
    from tiled_attn.cuda import attention_backward as cb
    planned = cb.schedule  # the planner's own (kinds other than "split")
    gen = torch.Generator().manual_seed(seed)
    shapes = ((1, 1), (17, 33), (63, 1), (128, 257), (1, 300), (257, 128), (200, 200))
    heads = ((2, 2), (6, 2), (3, 1))
    # Each config row (tl.dot tile) once per dtype class: D 40/64 share the d64 rows, 96/128 d128.
    kinds = ((torch.bfloat16, 40), (torch.bfloat16, 128), (torch.float16, 64), (torch.float16, 256),
             (torch.float32, 40), (torch.float32, 128), (torch.float32, 256))
    if backend == "cuda":  # block_m 64 and 128 at D = 64 (the kernel's two tiles; 128 is D = 64's only);
        # "f32": float32 dK / dV stores (grad_dtype, the context-parallel ring's partials); "split": the
        # schedule forced to every group split to one query head per CTA, key-tile-major (the finish
        # kernel sums the partials; the planner's own choice runs in the other kinds)
        kinds = ((torch.bfloat16, 64, 64), (torch.float16, 64, 128), (torch.float16, 128, 64),
                 (torch.bfloat16, 128, 64), (torch.bfloat16, 64, 128, "f32"), (torch.float16, 128, 64, "f32"),
                 (torch.float16, 64, 128, "split"), (torch.bfloat16, 128, 64, "split"))
    if dtypes:
        kinds = tuple(kind for kind in kinds if kind[0] in [DTYPES[n] for n in dtypes])
    if only:
        kinds = tuple(kind for kind in kinds if kind[3:] == (only,))
    if quick:  # under compute-sanitizer (~2 s a case): every kernel config once per causal mode
        shapes, heads = ((17, 33), (257, 128)), ((6, 2),)
    for kind, (nq, nk), (hq, hkv), causal, layout in itertools.product(
            kinds, shapes, heads, (False, True), ("bhnd", "bnhd")):
        dtype, d = kind[:2]
        if layout == "bnhd" and (d != 128 or dtype != torch.bfloat16):
            continue
        what = f"attention backward {nq}x{nk} D={d} H={hq}/{hkv} causal={causal} {dtype} {layout}"
        if len(kind) >= 3:  # the wgmma backward's tile: its config row, and no plan made with another
            configs.CUDA_ATTENTION_BACKWARD[("sm90", d)] = {"kernel": "wgmma", "block_m": kind[2]}
            # "split": (kv_split = the whole group, longest_first)
            cb.schedule = (lambda *args: (args[2], True)) if kind[3:] == ("split",) else planned
            _plan.clear_all()
            what += f" block_m={kind[2]}" + {("f32",): " float32 partials", ("split",): " split groups"}.get(kind[3:], "")
        with res.case("attention backward", what):
            def draw(h, n):
                t = torch.randn((1, n, h, d) if layout == "bnhd" else (1, h, n, d), generator=gen)
                t = t.to(dtype).to(DEVICE)
                return (t.transpose(1, 2) if layout == "bnhd" else t).requires_grad_()
            q, k, v = draw(hq, nq), draw(hkv, nk), draw(hkv, nk)
            out, lse = ta.attention(q, k, v, causal=causal, backend=backend, return_lse=True)
            dout = torch.randn(out.shape, generator=gen).to(dtype).to(DEVICE)
            if kind[3:] == ("f32",):
                from tiled_attn.attention import _backward_impl
                grads = _backward_impl(dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), None,
                                       1.0 / math.sqrt(d), causal, nk - nq, backend, False, grad_dtype=torch.float32)
                assert all(g.dtype == torch.float32 for g in grads)
                grads = tuple(g.to(dtype) for g in grads)
            else:
                grads = torch.autograd.grad(out, (q, k, v), dout)
            _check(grads, q, k, v, dout, None, causal, None, nk - nq, seed, what)
    cb.schedule = planned


def run_big(res: Results, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n = 4096
    m = 2**31 // n + 2
    x = torch.randn((m, n), generator=gen, device="cuda", dtype=torch.bfloat16)
    for kernel in (None, "warp_row", "block_row_reg", "block_row_smem", "split_row", "block_shuffle"):
        what = f"2^31 row offsets {kernel or 'default'} {m}x{n} bf16"
        with res.case("big", what):
            y = ta.softmax(x, -1, backend="cuda", kernel=kernel)
            for r in (0, m // 2, m - 1):
                xr = x[r:r + 1]
                assert_rule(y[r:r + 1], torch.softmax(xr.double().cpu(), -1), torch.softmax(xr, -1),
                            dtype=x.dtype, seed=seed, what=f"{what} row {r}")
            del y
    with res.case("big", "2^31 backward"):
        dy = torch.randn((m, n), generator=gen, device="cuda", dtype=torch.bfloat16)
        xl = x.requires_grad_()
        (dx,) = torch.autograd.grad(ta.softmax(xl, -1, backend="cuda"), xl, dy)
        for r in (0, m - 1):
            xr = x[r:r + 1].detach().requires_grad_()
            (gt,) = torch.autograd.grad(torch.softmax(xr, -1), xr, dy[r:r + 1])
            ref = reference.softmax_backward(torch.softmax(xr.detach().double().cpu(), -1),
                                             dy[r:r + 1].double().cpu(), -1)
            assert_rule(dx[r:r + 1], ref, gt, dtype=x.dtype, seed=seed, what=f"2^31 backward row {r}")
    del x, dy, dx, xl
    xt = torch.randn((2**31 // 8 + 2, 8), generator=gen, device="cuda", dtype=torch.bfloat16).t()
    for kernel in (None, "split_row", "block_shuffle", "warp_row"):
        what = f"2^31 column offsets {kernel or 'default'} 8x{xt.shape[1]} bf16 transposed"
        with res.case("big", what):
            y = ta.softmax(xt, -1, backend="cuda", kernel=kernel)
            assert_rule(y[:1], torch.softmax(xt[:1].double().cpu(), -1), torch.softmax(xt[:1], -1),
                        dtype=xt.dtype, seed=seed, what=what)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", type=lambda s: [None if k == "default" else k for k in s.split(",")],
                   help="comma-separated kernel names ('default' = kernel=None); default: all")
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=list(DTYPES), help="fp32,bf16,fp16")
    p.add_argument("--quick", action="store_true", help="fewer sizes and layouts (racecheck is slow)")
    p.add_argument("--attention", action="store_true", help="also ta.attention(backend='cuda')")
    p.add_argument("--attention-kernels", type=lambda s: s.split(","), default=None,
                   help="with --attention: these forward kernels only (mma,wgmma,wgmma_ws; default all)")
    p.add_argument("--attention-head-dims", type=lambda s: tuple(int(d) for d in s.split(",")), default=(64, 128),
                   help="with --attention: these head dims (default 64,128; a kernel skips those it lacks)")
    p.add_argument("--attention-backward", action="store_true",
                   help="also the Triton attention backward kernels")
    p.add_argument("--no-softmax", action="store_true", help="skip the softmax kernels")
    p.add_argument("--bwd-dtypes", type=lambda s: s.split(","), default=None,
                   help="the attention backward's dtypes (fp32,bf16,fp16; default all)")
    p.add_argument("--bwd-only", choices=("f32", "split"), default=None,
                   help="only the backward kinds with this tag (--bwd-backend cuda)")
    p.add_argument("--bwd-backend", choices=("triton", "cuda"), default="triton",
                   help="the attention backward's backend (cuda: its wgmma kernel on an H100)")
    p.add_argument("--dq-mode", choices=("pass", "atomic"), default=None,
                   help="the attention backward's dQ mode for every plan (default: the config rows')")
    p.add_argument("--big", action="store_true", help="also the > 2^31-element cases (~10 GB)")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    if args.dq_mode:
        import pytest
        from test_attention_backward import _force_rows
        _force_rows(pytest.MonkeyPatch(), mode=args.dq_mode)  # for the whole run: never undone

    if not torch.cuda.is_available():
        print("gpu_sanitize: no CUDA device", file=sys.stderr)
        return 2
    if not args.no_softmax or args.attention:
        tcuda.require()
    _checks.POISON_OUTPUTS = True
    seed = fresh_seed() if args.seed is None else args.seed
    print(f"gpu_sanitize: seed {seed}, {torch.cuda.get_device_name()}, kernels "
          f"{[k or 'default' for k in (args.kernels or [None, *tcuda.SOFTMAX_KERNELS])]}", flush=True)
    res = Results()
    if not args.no_softmax:
        run_softmax(res, args, seed)
        check_limits(res, args.kernels or tcuda.SOFTMAX_KERNELS, [DTYPES[d] for d in args.dtypes], seed)
    if args.attention:
        run_attention(res, seed, args.attention_kernels, args.attention_head_dims)
    if args.attention_backward:
        run_attention_backward(res, seed, args.quick, args.bwd_dtypes, args.bwd_backend, args.bwd_only)
    if args.big:
        run_big(res, seed)

    groups = sorted({g for g, _ in res.counts})
    for g in groups:
        parts = ", ".join(f"{res.counts[(g, s)]} {s}" for s in
                          ("ok", "skipped (row past the kernel's limit)", "FAILED") if res.counts[(g, s)])
        print(f"  {g:<36} {parts}")
    if res.failures:
        print(f"\ngpu_sanitize: {len(res.failures)} FAILED (seed {seed}):", file=sys.stderr)
        for f in res.failures:
            print(f, file=sys.stderr)
        return 1
    print(f"gpu_sanitize: all passed (seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
