"""The one benchmark harness. Suites declare shapes and providers; everything else happens here.

For every (case, provider) of a suite:
  1. a provider that is unavailable on this machine (backend not built, no GPU) or that declines the
     case is recorded as such, never run;
  2. it runs once on the case's first input set; an exception is recorded as `unsupported` (a
     ValueError/TypeError/NotImplementedError/RuntimeError: the documented way to refuse a case,
     e.g. SDPA's "No available kernel") or `error` (anything else), with its message;
  3. its output is checked with DESIGN §4's rule against a reference computed once per case:
     e_ours = max|ours − ref| must be ≤ 2·e_torch + eps(dtype), where e_torch is torch's own op in
     the input dtype against the same reference, and NaN/±inf must sit exactly where the
     reference has them. A provider that fails is recorded FAILED with both errors and NOT timed;
  4. only then is it timed: median over repeats, after warm-up, cycling several input sets so no
     repeat finds its inputs in L2 (see `rotation_sets`), on the GPU inside a CUDA graph so that
     Python launch overhead is not counted (falling back to per-call CUDA events when a provider
     cannot be captured; the mode used is recorded per row). Peak extra memory of one call
     (torch.cuda.max_memory_allocated delta, output included) is recorded.

The reference is the float64 op (tiled_attn.reference) on the already-rounded inputs, like
tests/helpers.py, but computed on the device (a float64 CPU copy of a 67M-element tensor would cost
more than the timing). The one exception is the GPU attention grid, whose float64 scores would not
fit: above 2^30 score elements the reference runs in float32 (no TF32), chunked over heads. Its own
error (~1e-6 relative) is three orders of magnitude below bf16's eps (7.8e-3), so it cannot move a
verdict; each record names the reference dtype it was checked against.
"""
from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

import tiled_attn as ta
from tiled_attn import _checks, reference

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "fp64": torch.float64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

# Status of one (case, provider) record.
OK, FAILED, UNSUPPORTED, ERROR, UNAVAILABLE, SKIPPED = (
    "ok", "FAILED", "unsupported", "error", "unavailable", "skipped")
# Exceptions that mean "this provider does not cover this case" rather than "it crashed".
REFUSALS = (ValueError, TypeError, NotImplementedError, RuntimeError)

# Score elements above which the attention reference runs in float32 instead of float64, and the
# element budget of one reference chunk (1 GiB of float32 scores).
REF_FLOAT64_MAX_SCORES = 1 << 30
REF_CHUNK_ELEMS = 1 << 28


class DeviceLost(RuntimeError):
    """The CUDA context is unusable (e.g. an illegal address in a kernel): stop measuring."""


# ----------------------------------------------------------------------------------------------
# Declarations: what a suite file writes
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """An operation: how to make inputs, the reference, torch's own op, and what is counted."""
    name: str
    unit: str                                   # "GB/s" or "TFLOP/s"
    ceiling: str                                # key of the ceiling the % column divides by
    make_inputs: Callable[[dict, torch.device, torch.Generator], tuple]
    reference: Callable[[dict, tuple], tuple]   # -> (reference output, reference dtype name)
    torch_output: Callable[[dict, tuple], torch.Tensor]
    work: Callable[[dict], float]               # bytes (GB/s) or FLOPs (TFLOP/s) of one call
    label: Callable[[dict], str]
    convention: str                             # one sentence: what `work` counts
    # Where an input set holds several layouts of the same inputs (varlen: packed and padded;
    # kvcache: contiguous and paged) and each provider reads one: the bytes one call reads, which
    # the rotation counts instead of the whole set (else a small case's own layout stays in L2).
    read_bytes: Callable[[dict], int] | None = None


@dataclass
class Provider:
    """One line of a plot: `fn(case, inputs) -> output`. `role` is "ours" or "baseline"."""
    name: str
    fn: Callable[[dict, tuple], Any]
    role: str = "ours"
    available: Callable[[torch.device], str | None] | None = None   # None if usable, else why not
    supports: Callable[[dict], str | None] | None = None             # None if it covers the case
    graphable: bool = True
    # Maps the timed call's own output layout to the op's, for the check only (never timed): e.g.
    # a padded (B, H, N, D) batch's valid rows into varlen's packed (total, H, D).
    output: Callable[[dict, tuple, Any], Any] | None = None
    # The call syncs the host in eager calls (tiled_attn reads cu_seqlens / cache_seqlens /
    # block_table once per call to check them) but never under CUDA-graph capture, where those
    # checks are skipped: the graph column's pre-capture warm-up lets it (CudaTimer.measure).
    host_syncs: bool = False


@dataclass
class Expand:
    """Providers only known at run time (a backend's kernel list); `make()` may raise, which
    records one unavailable row named `name`."""
    name: str
    make: Callable[[torch.device], list]


@dataclass(frozen=True)
class Plot:
    """kind "lines": metric against `x` (log2 axis), one subplot per (`rows`, `cols`) value;
    kind "bars": one group of bars per case."""
    kind: str = "lines"
    x: str = "N"
    rows: str | None = None
    cols: str | None = None


@dataclass
class Suite:
    name: str
    title: str
    op: Op
    device: str                      # "cuda" or "cpu"
    shapes: Sequence[dict]
    dtypes: Sequence[str]
    providers: Sequence[Provider | Expand]
    baselines: Sequence[str] = ()    # provider names the ratio columns divide by
    quick_shapes: Sequence[dict] | None = None
    plot: Plot = field(default_factory=Plot)
    notes: str = ""

    def cases(self, quick: bool = False, dtypes: Sequence[str] | None = None) -> list[dict]:
        shapes = self.quick_shapes if quick and self.quick_shapes else self.shapes
        return [dict(shape, dtype=d) for d in (dtypes or self.dtypes) for shape in shapes]


# ----------------------------------------------------------------------------------------------
# The numerics rule on the device (DESIGN §4; tests/helpers.assert_rule states it for the tests)
# ----------------------------------------------------------------------------------------------
def max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x − ref| where ref is finite; a non-finite x there counts as inf."""
    finite = torch.isfinite(ref)
    if not bool(finite.any()):
        return 0.0
    d = (x.to(ref.dtype) - ref).abs()
    d = torch.nan_to_num(d, nan=math.inf, posinf=math.inf)
    return float(torch.where(finite, d, torch.zeros_like(d)).max())


@dataclass
class Check:
    ok: bool
    e_ours: float | None
    e_torch: float | None
    tol: float | None
    message: str = ""


def check_rule(out, ref, e_torch, dtype: torch.dtype) -> Check:
    """The rule for one output, or for each of several (a tuple of outputs, references and
    torch's errors: gradients); several pass iff each does, and the record names the worst (the
    largest e_ours / tol)."""
    if isinstance(ref, tuple):
        if not isinstance(out, (tuple, list)) or len(out) != len(ref):
            return Check(False, None, None, None, f"returned {type(out).__name__}, not {len(ref)} outputs")
        checks = [check_rule(o, r, e, dtype) for o, r, e in zip(out, ref, e_torch)]
        bad = [(i, c) for i, c in enumerate(checks) if not c.ok]
        if bad:
            i, c = bad[0]
            return Check(False, c.e_ours, c.e_torch, c.tol, f"output {i}: {c.message}")
        return max(checks, key=lambda c: c.e_ours / c.tol if c.tol else 0.0)
    if not isinstance(out, torch.Tensor):
        return Check(False, None, e_torch, None, f"returned {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(ref.shape):
        return Check(False, None, e_torch, None,
                     f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    o = out.detach().to(ref.dtype)
    nan_o, nan_r = torch.isnan(o), torch.isnan(ref)
    if not torch.equal(nan_o, nan_r):
        return Check(False, None, e_torch, None,
                     f"NaN pattern differs: {int(nan_o.sum())} NaN in output, "
                     f"{int(nan_r.sum())} in the reference")
    inf_r = torch.isinf(ref)
    if bool(inf_r.any()) and not torch.equal(o[inf_r], ref[inf_r]):
        return Check(False, None, e_torch, None, "±inf entries differ from the reference")
    e_ours = max_err(o, ref)
    tol = 2 * e_torch + torch.finfo(dtype).eps
    if not e_ours <= tol:
        return Check(False, e_ours, e_torch, tol, f"error {e_ours:.3e} exceeds 2×torch's "
                     f"{e_torch:.3e} + eps = {tol:.3e}")
    return Check(True, e_ours, e_torch, tol)


# ----------------------------------------------------------------------------------------------
# Timers
# ----------------------------------------------------------------------------------------------
@dataclass
class Timing:
    ms: float
    reps: int
    mode: str
    peak_bytes: int | None = None
    note: str = ""
    graph_ms: float | None = None  # the CUDA-graph column beside an eager headline


def _clamp(v: float, lo: int, hi: int) -> int:
    return int(max(lo, min(hi, v)))


class CudaTimer:
    """Median of CUDA-event timings. `call(i)` runs the provider on input set i % n_sets.

    Graph mode captures G calls (cycling the sets, G·t ≈ 2 ms so the graph launch is negligible)
    into one CUDA graph and times replays: the kernel time without Python's launch overhead, which
    for a 16 MB softmax (~10 µs) would otherwise dominate. Events mode times each eager call.
    """

    def __init__(self, warmup_ms: float = 5.0, rep_ms: float = 30.0, graphs: bool = True,
                 min_reps: int = 3, eager_first: bool = False, rounds: int = 1):
        self.warmup_ms, self.rep_ms, self.graphs, self.min_reps = warmup_ms, rep_ms, graphs, min_reps
        # DESIGN §6: the headline is what a user's eager call gets (per-call events, back to back,
        # host cost included); the CUDA-graph replay (kernel time) is the second column.
        self.eager_first = eager_first
        # Eager rounds per point (run_case): the first with the provider's check and graph column,
        # then rounds − 1 more of every provider in turn (CBA ABC ...: _more_rounds), the headline the
        # median of the rounds. An eager call near the host's cost reads that host's state: on the H100
        # machine (2026-11-27) torch.softmax's eager GB/s at 65536x128 fp32 moved by 30% between
        # two runs, and two providers running the same kernel in one run differed by 8%, while
        # the graph column stayed within 1%. Interleaved rounds give drift to every provider alike.
        self.rounds = rounds

    def again(self, call: Callable[[int], Any], n_sets: int, first: Timing) -> float | None:
        """One more eager round (ms) of a point measure() timed as `first`, or None where that
        headline is not per-call eager timing (a slow call's two samples, a graph headline)."""
        if first.mode != "events" or first.reps < self.min_reps:
            return None
        return self._events(call, n_sets, max(first.ms, 1e-3), first.peak_bytes, "").ms

    def measure(self, call: Callable[[int], Any], n_sets: int = 1, graphable: bool = True,
                host_syncs: bool = False) -> Timing:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = call(0)
        end.record()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        est = max(start.elapsed_time(end), 1e-3)
        if est < self.rep_ms:
            # The first call pays one-time costs (planning, a JIT compile: up to seconds, while the
            # GPU idles and drops its clocks): estimate from a few more calls, so the warm-up
            # below is warmup_ms of real calls and not a single one.
            again = []
            for i in range(3):
                start.record()
                call((i + 1) % n_sets)
                end.record()
                torch.cuda.synchronize()
                again.append(start.elapsed_time(end))
            est = max(min(again), 1e-3)
        if est >= self.rep_ms:  # a slow rung (e.g. one thread per row on a 33M-column row):
            # two eager samples after the first call, where Python's launch overhead is noise.
            # The first call is never a sample: it pays one-time costs (a library's handle and
            # heuristics, a JIT compile), e.g. it made a cold 8192³ matmul read as 27 TFLOP/s.
            samples = []
            for i in (1, 2):
                start.record()
                out = call(i % n_sets)
                end.record()
                torch.cuda.synchronize()
                del out
                samples.append(start.elapsed_time(end))
            est = max(min(samples), 1e-3)
            if est >= self.rep_ms:
                return Timing(statistics.median(samples), 2, "events", peak, "slow call: 2 samples")
        note = ""
        if self.eager_first:
            t = self._events(call, n_sets, est, peak, note)
            if self.graphs and graphable:
                try:
                    t.graph_ms = self._graph(call, n_sets, est, peak, host_syncs).ms
                except Exception as err:  # capture refused: no second column for this row
                    torch.cuda.synchronize()
                    t.note = f"no graph column ({type(err).__name__}: {str(err)[:80]})"
            return t
        if self.graphs and graphable:
            try:
                return self._graph(call, n_sets, est, peak, host_syncs)
            except Exception as err:  # capture refused (a host sync, an uncapturable op): eager
                torch.cuda.synchronize()
                note = f"graph capture failed ({type(err).__name__}: {str(err)[:120]}); eager events"
        return self._events(call, n_sets, est, peak, note)

    def _events(self, call, n_sets, est, peak, note) -> Timing:
        for i in range(_clamp(self.warmup_ms / est, 1, 1000)):
            call(i % n_sets)
        n = _clamp(self.rep_ms / est, self.min_reps, 1000)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
        for i, (s, e) in enumerate(ev):
            s.record()
            call(i % n_sets)
            e.record()
        torch.cuda.synchronize()
        return Timing(statistics.median(s.elapsed_time(e) for s, e in ev), n, "events", peak,
                      note)

    def _graph(self, call, n_sets, est, peak, host_syncs: bool = False) -> Timing:
        per_graph = n_sets * max(1, math.ceil(2.0 / (est * n_sets)))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        prev = torch.cuda.get_sync_debug_mode()
        # A host sync (.item(), a blocking copy) cannot be captured: make torch raise on one in
        # this eager warm-up (on a side stream before capture, as torch asks) instead of
        # finding out inside the capture. A provider that syncs only outside a capture
        # (Provider.host_syncs) warms up without that check.
        torch.cuda.set_sync_debug_mode(prev if host_syncs else "error")
        try:
            with torch.cuda.stream(side):
                for i in range(min(3, n_sets)):
                    call(i)
        finally:
            torch.cuda.set_sync_debug_mode(prev)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(per_graph):
                call(i % n_sets)
        g_est = est * per_graph
        for _ in range(_clamp(self.warmup_ms / g_est, 1, 100)):
            graph.replay()
        n = _clamp(self.rep_ms / g_est, self.min_reps, 200)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
        for s, e in ev:
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        ms = statistics.median(s.elapsed_time(e) for s, e in ev) / per_graph
        del graph
        return Timing(ms, n * per_graph, "cuda-graph", peak)


class CpuTimer:
    """Median of perf_counter timings of single calls (the CPU suite: tiny, no rotation)."""

    def __init__(self, warmup_ms: float = 20.0, rep_ms: float = 200.0, min_reps: int = 2):
        self.warmup_ms, self.rep_ms, self.min_reps = warmup_ms, rep_ms, min_reps

    def measure(self, call: Callable[[int], Any], n_sets: int = 1, graphable: bool = True) -> Timing:
        t0 = time.perf_counter()
        call(0)
        est = max((time.perf_counter() - t0) * 1e3, 1e-3)
        if est >= self.rep_ms:  # a slow call (the interpreter): its one timing is the figure
            return Timing(est, 1, "cpu-perf_counter", None)
        for i in range(_clamp(self.warmup_ms / est, 0, 100)):
            call(i % n_sets)
        times = []
        for i in range(_clamp(self.rep_ms / est, self.min_reps, 1000)):
            t0 = time.perf_counter()
            call(i % n_sets)
            times.append((time.perf_counter() - t0) * 1e3)
        return Timing(statistics.median(times), len(times), "cpu-perf_counter", None)


# ----------------------------------------------------------------------------------------------
# Ceilings
# ----------------------------------------------------------------------------------------------
def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))


def measure_ceilings(device: torch.device, timer) -> dict:
    """Copy bandwidth (read + write bytes of a large device-to-device copy) and the dense matmul
    rate (8192³ bf16 on random data on the GPU; 1024³ float32 on the CPU)."""
    cuda = device.type == "cuda"
    elems = (1 << 27) if cuda else (1 << 24)          # 512 MiB / 64 MiB of float32
    src = torch.randn(elems, device=device)
    dst = torch.empty_like(src)
    t = timer.measure(lambda i: dst.copy_(src), 1, graphable=False)
    copy_bytes = 2 * src.numel() * src.element_size()
    del src, dst
    n, mm_dtype = (8192, torch.bfloat16) if cuda else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=mm_dtype)
    b = torch.randn(n, n, device=device, dtype=mm_dtype)
    tm = timer.measure(lambda i: a @ b, 1, graphable=False)
    del a, b
    return {
        "copy_gbps": copy_bytes / (t.ms * 1e-3) / 1e9,
        "copy_note": f"device-to-device copy of {elems * 4 >> 20} MiB, counting read + write bytes",
        "matmul_tflops": 2 * n ** 3 / (tm.ms * 1e-3) / 1e12,
        "matmul_note": f"{n}x{n}x{n} {DTYPE_NAMES[mm_dtype]} matmul on random data",
        "l2_bytes": l2_bytes(device),
    }


# ----------------------------------------------------------------------------------------------
# Running a suite
# ----------------------------------------------------------------------------------------------
@dataclass
class RunConfig:
    device: torch.device
    timer: Any
    ceilings: dict
    seed: int = 0
    quick: bool = False
    dtypes: Sequence[str] | None = None
    provider_filter: Callable[[str], bool] | None = None
    time_cap_s: float | None = None
    progress: Callable[..., Any] | None = None    # report.Progress factory (total, title)


def rotation_sets(set_bytes: int, device: torch.device) -> int:
    """Input sets to cycle so that a set is out of L2 when it comes round again: between two uses
    of a set the n−1 others (≥ 2·L2 − one set ≥ L2 bytes) are read. One set of ≥ 2·L2 evicts its
    own beginning. The CPU suite is tiny and uses one set."""
    l2 = l2_bytes(device)
    if not l2 or set_bytes <= 0:
        return 1
    return _clamp(math.ceil(2 * l2 / set_bytes), 1, 64)


def _nbytes(inputs: Iterable) -> int:
    return sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _describe(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}"


def _device_alive(device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        torch.zeros(1, device=device).add_(1).item()
        return True
    except Exception:
        return False


def expand_providers(suite: Suite, device: torch.device) -> list[tuple[Provider | None, str, str]]:
    """(provider, name, unavailable reason or "") for every provider the suite declares."""
    rows = []
    for p in suite.providers:
        if isinstance(p, Expand):
            try:
                made = p.make(device)
            except Exception as err:
                rows.append((None, p.name, _describe(err)))
                continue
            items = made
        else:
            items = [p]
        for q in items:
            reason = q.available(device) if q.available else None
            rows.append((q, q.name, reason or ""))
    return rows


def _record(suite: Suite, case: dict, name: str, role: str, status: str, **kw) -> dict:
    rec = {"suite": suite.name, "case": dict(case), "label": suite.op.label(case),
           "provider": name, "role": role, "status": status, "error": "", "ms": None,
           "value": None, "unit": suite.op.unit, "pct_ceiling": None, "ratios": {},
           "e_ours": None, "e_torch": None, "tol": None, "ref_dtype": None, "peak_mb": None,
           "timing": None, "reps": None, "n_sets": None, "seed": None, "wall_s": None}
    rec.update(kw)
    return rec


class _CaseData:
    """Inputs, reference and torch's error for one case, made lazily and shared by providers."""

    def __init__(self, suite: Suite, case: dict, cfg: RunConfig, seed: int):
        self.suite, self.case, self.cfg, self.seed = suite, case, cfg, seed
        self.sets: list[tuple] = []
        self._ref = None

    def _make(self, index: int) -> tuple:
        gen = torch.Generator(device=self.cfg.device).manual_seed(self.seed + index)
        return self.suite.op.make_inputs(self.case, self.cfg.device, gen)

    def first(self) -> tuple:
        if not self.sets:
            self.sets.append(self._make(0))
        return self.sets[0]

    def all_sets(self) -> list[tuple]:
        op = self.suite.op
        n = rotation_sets(op.read_bytes(self.case) if op.read_bytes else _nbytes(self.first()),
                          self.cfg.device)
        while len(self.sets) < n:
            self.sets.append(self._make(len(self.sets)))
        return self.sets

    def reference(self):
        """(ref, ref dtype name, e_torch), computed once per case."""
        if self._ref is None:
            inputs = self.first()
            with _no_tf32():
                ref, ref_dtype = self.suite.op.reference(self.case, inputs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch_out = self.suite.op.torch_output(self.case, inputs)
            e_torch = (tuple(max_err(t, r) for t, r in zip(torch_out, ref)) if isinstance(ref, tuple)
                       else max_err(torch_out, ref))
            self._ref = (ref, ref_dtype, e_torch)
            del torch_out
        return self._ref


@contextlib.contextmanager
def _no_tf32():
    if not torch.cuda.is_available():
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def run_case(suite: Suite, case: dict, providers, cfg: RunConfig, seed: int,
             advance: Callable[[str], None] = lambda name: None) -> list[dict]:
    data = _CaseData(suite, case, cfg, seed)
    dtype = DTYPES[case["dtype"]]
    records, timed = [], []  # timed: (record, call, n_sets, first Timing) of each provider timed
    for p, name, unavailable in providers:
        role = p.role if p else "ours"
        advance(name)
        t_start = time.perf_counter()
        if unavailable:
            records.append(_record(suite, case, name, role, UNAVAILABLE, error=unavailable))
            continue
        declined = p.supports(case) if p.supports else None
        if declined:
            records.append(_record(suite, case, name, role, UNSUPPORTED, error=declined))
            continue
        inputs = data.first()
        # The reference first: a provider that writes into its inputs then fails the check
        # instead of corrupting the reference.
        ref, ref_dtype, e_torch = data.reference()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = p.fn(case, inputs)
                _sync(cfg.device)
                if p.output:
                    out = p.output(case, inputs, out)
        except Exception as err:
            if not _device_alive(cfg.device):
                raise DeviceLost(f"{suite.name} {suite.op.label(case)} {name}: {_describe(err)}") from err
            status = UNSUPPORTED if isinstance(err, REFUSALS) else ERROR
            records.append(_record(suite, case, name, role, status, error=_describe(err)))
            continue
        check = check_rule(out, ref, e_torch, dtype)
        del out
        common = dict(e_ours=check.e_ours, e_torch=check.e_torch, tol=check.tol,
                      ref_dtype=ref_dtype, seed=seed)
        if not check.ok:
            records.append(_record(suite, case, name, role, FAILED, error=check.message, **common))
            continue
        sets = data.all_sets()
        call = (lambda fn, sets: lambda i: fn(case, sets[i % len(sets)]))(p.fn, sets)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = cfg.timer.measure(call, len(sets),
                                      p.graphable, **({"host_syncs": True} if p.host_syncs else {}))
        except Exception as err:
            if not _device_alive(cfg.device):
                raise DeviceLost(f"{suite.name} {suite.op.label(case)} {name}: {_describe(err)}") from err
            records.append(_record(suite, case, name, role, ERROR,
                                   error="while timing: " + _describe(err), **common))
            continue
        graph = {}
        if t.graph_ms:
            gv, gpct = _rate(suite, cfg, case, t.graph_ms)
            graph = dict(graph_ms=t.graph_ms, graph_value=gv, graph_pct_ceiling=gpct)
        value, pct = _rate(suite, cfg, case, t.ms)
        records.append(_record(
            suite, case, name, role, OK, ms=t.ms, value=value, **graph, pct_ceiling=pct,
            peak_mb=None if t.peak_bytes is None else t.peak_bytes / 2 ** 20,
            timing=t.mode + (f" ({t.note})" if t.note else ""), reps=t.reps, n_sets=len(sets),
            wall_s=time.perf_counter() - t_start, **common))
        timed.append((records[-1], call, len(sets), t))
    _more_rounds(suite, cfg, case, timed)
    _add_ratios(records, suite.baselines)
    return records


def _rate(suite: Suite, cfg: RunConfig, case: dict, ms: float) -> tuple[float, float | None]:
    """(the op's value — GB/s or TFLOP/s — of one call taking `ms`, its % of the ceiling)."""
    value = suite.op.work(case) / (ms * 1e-3) / (1e9 if suite.op.unit == "GB/s" else 1e12)
    ceiling = cfg.ceilings.get(suite.op.ceiling)
    return value, (100 * value / ceiling if ceiling else None)


def _more_rounds(suite: Suite, cfg: RunConfig, case: dict, timed: list) -> None:
    """The timer's rounds − 1 further eager rounds of every timed provider of a point, in turn,
    every other round in reverse order (ABC, CBA, ABC, ...); each record's headline becomes the
    median of its rounds (all kept in `eager_rounds_ms`). Why the reversal: on the H200 (attention
    suite, 2026-11-29) a provider's eager time moved by up to 18% between rounds with its place in
    the round (the clock after the heavier or lighter kernel before it), so a fixed order gave each
    provider the same neighbour, and a bias, every round."""
    rounds = {id(rec): [t.ms] for rec, _, _, t in timed}
    for i in range(getattr(cfg.timer, "rounds", 1) - 1):
        for rec, call, n_sets, t in (timed[::-1] if i % 2 == 0 else timed):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ms = cfg.timer.again(call, n_sets, t)
            if ms is not None:
                rounds[id(rec)].append(ms)
    for rec, _, _, _ in timed:
        ms_all = rounds[id(rec)]
        if len(ms_all) > 1:
            rec["ms"] = statistics.median(ms_all)
            rec["value"], rec["pct_ceiling"] = _rate(suite, cfg, case, rec["ms"])
            rec["eager_rounds_ms"] = ms_all


def _add_ratios(records: list[dict], baselines: Sequence[str]) -> None:
    """ratio[b] = time of baseline b / time of this provider (> 1: this provider is faster), from
    the headline (eager) times; graph_ratios the same from the CUDA-graph column where both have it."""
    ms = {r["provider"]: r["ms"] for r in records if r["status"] == OK}
    gms = {r["provider"]: r["graph_ms"] for r in records if r["status"] == OK and r.get("graph_ms")}
    for r in records:
        if r["status"] == OK:
            r["ratios"] = {b: ms[b] / r["ms"] for b in baselines if b in ms and b != r["provider"]}
            if r.get("graph_ms"):
                r["graph_ratios"] = {b: gms[b] / r["graph_ms"] for b in baselines
                                     if b in gms and b != r["provider"]}


def run_suite(suite: Suite, cfg: RunConfig) -> dict:
    """All cases × providers of `suite`; returns the suite's result (records + timing)."""
    t0 = time.perf_counter()
    providers = [row for row in expand_providers(suite, cfg.device)
                 if cfg.provider_filter is None or cfg.provider_filter(row[1])]
    cases = suite.cases(cfg.quick, cfg.dtypes)
    bar = cfg.progress(len(cases) * len(providers), suite.name) if cfg.progress else None
    records, capped, lost = [], False, ""
    for ci, case in enumerate(cases):
        label = suite.op.label(case)
        if cfg.time_cap_s and time.perf_counter() - t0 > cfg.time_cap_s or lost:
            capped = capped or not lost
            why = lost or f"suite time cap of {cfg.time_cap_s:.0f} s reached"
            for p, name, _ in providers:
                records.append(_record(suite, case, name, p.role if p else "ours", SKIPPED, error=why))
            if bar:
                bar.advance(len(providers), label, "skipped")
            continue
        seed = (cfg.seed + 100_003 * ci) & 0x7FFFFFFF
        try:
            records += run_case(suite, case, providers, cfg, seed,
                                (lambda n: bar.advance(1, label, n)) if bar else (lambda n: None))
        except DeviceLost as err:
            lost = f"device lost: {err}"
            records.append(_record(suite, case, "(device)", "ours", ERROR, error=lost))
        except Exception as err:  # making inputs or the reference failed (e.g. out of memory)
            if not _device_alive(cfg.device):
                lost = f"device lost: {label}: {_describe(err)}"
            records.append(_record(suite, case, "(case)", "ours", ERROR,
                                   error="inputs/reference: " + _describe(err)))
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
    if bar:
        bar.close()
    return {"name": suite.name, "title": suite.title, "device": suite.device,
            "unit": suite.op.unit, "ceiling": suite.op.ceiling, "convention": suite.op.convention,
            "notes": suite.notes, "baselines": list(suite.baselines),
            "plot": vars(suite.plot), "elapsed_s": time.perf_counter() - t0, "capped": capped,
            "device_lost": lost, "records": records}


# ----------------------------------------------------------------------------------------------
# Ops: inputs, references, torch's own op, and what is counted
# ----------------------------------------------------------------------------------------------
def _randn(shape, case, device, gen) -> torch.Tensor:
    return torch.randn(shape, device=device, generator=gen).to(DTYPES[case["dtype"]])


def _esize(case) -> int:
    return torch.empty((), dtype=DTYPES[case["dtype"]]).element_size()


def _softmax_label(c):
    return f"{c['M']}x{c['N']} {c['dtype']}"


SOFTMAX = Op(
    name="softmax", unit="GB/s", ceiling="copy_gbps",
    make_inputs=lambda c, dev, g: (_randn((c["M"], c["N"]), c, dev, g),),
    reference=lambda c, inp: (reference.safe_softmax(inp[0].double(), -1), "fp64"),
    torch_output=lambda c, inp: torch.softmax(inp[0], -1),
    work=lambda c: 2 * c["M"] * c["N"] * _esize(c),
    label=_softmax_label,
    convention="bytes = one read + one write of the M×N tensor; % of the copy bandwidth, which "
               "also counts read + write",
)


# Issue 16's random softmax shapes: the set the selection of backend=None is fitted on
# (benchmarks/sweep_softmax_random.py) and the held-out set it is checked on (the suite
# softmax_random), from fixed seeds so both are the same on every machine.
RANDOM_SOFTMAX = dict(sweep_seed=16, heldout_seed=1016, sweep=64, heldout=32, n_max=1 << 25,
                      elems=(1 << 20, 1 << 28))


def random_softmax_shapes(seed: int, count: int, exclude_n: Iterable[int] = (),
                          n_max: int = RANDOM_SOFTMAX["n_max"],
                          elems: tuple[int, int] = RANDOM_SOFTMAX["elems"]) -> list[dict]:
    """`count` shapes {M, N} with distinct row lengths N log-uniform in [1, n_max] (none of
    `exclude_n`) and M·N log-uniform in `elems` (M >= 1; for N past elems[0] in [N, elems[1]],
    so a long row still gets the whole range of sizes it can have)."""
    rng = random.Random(seed)
    seen, shapes = set(exclude_n), []
    lo_e, hi_e = elems
    while len(shapes) < count:
        n = min(n_max, max(1, round(2 ** rng.uniform(0, math.log2(n_max)))))
        if n in seen:
            continue
        seen.add(n)
        e = 2 ** rng.uniform(math.log2(max(lo_e, n)), math.log2(hi_e))
        m = min(hi_e // n, max(-(-lo_e // n), round(e / n), 1))
        shapes.append(dict(M=m, N=n))
    return shapes


def random_softmax_sets() -> tuple[list[dict], list[dict]]:
    """(the sweep's shapes, the held-out shapes): two seeds, held-out lengths none of the sweep's."""
    r = RANDOM_SOFTMAX
    sweep = random_softmax_shapes(r["sweep_seed"], r["sweep"])
    return sweep, random_softmax_shapes(r["heldout_seed"], r["heldout"], {s["N"] for s in sweep})


def _softmax_backward_inputs(c, dev, g):
    y = torch.softmax(_randn((c["M"], c["N"]), c, dev, g), -1)  # the y autograd would save
    return y, _randn((c["M"], c["N"]), c, dev, g)


SOFTMAX_BACKWARD = Op(
    name="softmax_backward", unit="GB/s", ceiling="copy_gbps",
    make_inputs=_softmax_backward_inputs,
    reference=lambda c, inp: (reference.softmax_backward(inp[0].double(), inp[1].double(), -1), "fp64"),
    torch_output=lambda c, inp: torch._softmax_backward_data(inp[1], inp[0], -1, inp[0].dtype),
    work=lambda c: 3 * c["M"] * c["N"] * _esize(c),
    label=_softmax_label,
    convention="bytes = read y + read dy + write dx (3 × M×N); % of the copy bandwidth "
               "(read + write)",
)


def attention_reference(q, k, v, causal: bool) -> tuple[torch.Tensor, str]:
    """reference.attention (float64, or float32 above REF_FLOAT64_MAX_SCORES score elements),
    chunked over (batch, kv-head) pairs so neither the scores nor the GQA-repeated K/V of one chunk
    pass REF_CHUNK_ELEMS. Causal is bottom-right aligned (ta.attention's convention; the suites use
    Nq == Nk or non-causal decode, where torch's top-left is the same)."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = hq // hkv
    ref_dtype = torch.float64 if b * hq * nq * nk <= REF_FLOAT64_MAX_SCORES else torch.float32
    q2 = q.reshape(b * hkv, g, nq, d)
    k2, v2 = k.reshape(b * hkv, 1, nk, d), v.reshape(b * hkv, 1, nk, d)
    rows = max(1, min(REF_CHUNK_ELEMS // max(1, g * nq * nk), REF_CHUNK_ELEMS // max(1, g * nk * d)))
    out = torch.empty(q2.shape, dtype=ref_dtype, device=q.device)
    for r0 in range(0, b * hkv, rows):
        sl = slice(r0, r0 + rows)
        out[sl] = reference.attention(q2[sl].to(ref_dtype), k2[sl].to(ref_dtype),
                                      v2[sl].to(ref_dtype), causal=causal)
    return out.view(b, hq, nq, d), DTYPE_NAMES[ref_dtype]


def _sdpa_default(q, k, v, causal: bool):
    kw = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)


ATTENTION = Op(
    name="attention", unit="TFLOP/s", ceiling="matmul_tflops",
    make_inputs=lambda c, dev, g: tuple(_randn((c["B"], c["H"], c["N"], c["D"]), c, dev, g)
                                        for _ in range(3)),
    reference=lambda c, inp: attention_reference(*inp, c["causal"]),
    torch_output=lambda c, inp: _sdpa_default(*inp, c["causal"]),
    work=lambda c: 4 * c["B"] * c["H"] * c["N"] ** 2 * c["D"] / (2 if c["causal"] else 1),
    label=lambda c: f"D={c['D']} N={c['N']} B={c['B']} H={c['H']}"
                    f"{' causal' if c['causal'] else ''} {c['dtype']}",
    convention="FLOPs = 4·B·H·N²·D (halved for causal); % of the measured dense matmul rate",
)


def attention_grad_reference(q, k, v, dout, causal: bool) -> tuple[tuple, str]:
    """(dq, dk, dv) of reference.attention by autograd, float64 (float32 above
    REF_FLOAT64_MAX_SCORES score elements), chunked over (batch, kv head) pairs like
    attention_reference (a GQA group's query heads in one chunk: dK / dV summed over it)."""
    b, h, n, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = h // hkv
    ref_dtype = torch.float64 if b * h * n * nk <= REF_FLOAT64_MAX_SCORES else torch.float32
    flat = [t.reshape(b * hkv, g if t.shape[1] == h else 1, t.shape[2], d) for t in (q, k, v, dout)]
    grads = [torch.empty(t.shape, dtype=ref_dtype, device=q.device) for t in flat[:3]]
    rows = max(1, REF_CHUNK_ELEMS // max(1, g * n * nk))
    for r0 in range(0, b * hkv, rows):
        sl = slice(r0, r0 + rows)
        qc, kc, vc = (t[sl].to(ref_dtype).requires_grad_() for t in flat[:3])
        out = reference.attention(qc, kc, vc, causal=causal)
        for g, gc in zip(grads, torch.autograd.grad(out, (qc, kc, vc), flat[3][sl].to(ref_dtype))):
            g[sl] = gc
        del out
    return tuple(gr.view(b, -1, gr.shape[2], d) for gr in grads), DTYPE_NAMES[ref_dtype]


def attention_grads(attn, case: dict, inputs: tuple, cache: dict):
    """(dq, dk, dv) of attn(q, k, v) for the case's mode: "fwd+bwd" runs the forward and the
    backward; "bwd" only the backward, of a forward made once per input set (kept in `cache`,
    which the caller empties when the case changes: grad_provider)."""
    q, k, v, dout = inputs
    if case["mode"] == "bwd":
        key = (id(q), id(attn))
        hit = cache.get(key)
        if hit is None or hit[0] is not q:  # (an id can be reused once its tensor is freed)
            leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
            hit = cache[key] = (q, leaves, attn(*leaves))
        _, leaves, out = hit
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(attn(*leaves), leaves, dout)


def _attention_grad_work(c) -> float:
    fwd = 4 * c["B"] * c["H"] * c["N"] ** 2 * c["D"] / (2 if c["causal"] else 1)
    return fwd * (2.5 if c["mode"] == "bwd" else 3.5)


ATTENTION_BACKWARD = Op(
    name="attention_backward", unit="TFLOP/s", ceiling="matmul_tflops",
    # q, k, v, dO; k and v with Hkv heads where the case names them (GQA), else H
    make_inputs=lambda c, dev, g: tuple(_randn((c["B"], c["H"] if i in (0, 3) else c.get("Hkv", c["H"]),
                                                c["N"], c["D"]), c, dev, g) for i in range(4)),
    reference=lambda c, inp: attention_grad_reference(*inp, c["causal"]),
    torch_output=lambda c, inp: attention_grads(lambda q, k, v: _sdpa_default(q, k, v, c["causal"]),
                                                dict(c, mode="fwd+bwd"), inp, {}),
    work=_attention_grad_work,
    label=lambda c: f"{c['mode']} D={c['D']} N={c['N']} B={c['B']} H={c['H']}"
                    f"{'/' + str(c['Hkv']) if 'Hkv' in c else ''}{' causal' if c['causal'] else ''} {c['dtype']}",
    convention="FLOPs = the forward's 4·B·H·N²·D (halved for causal) × 2.5 for the backward, × 3.5 "
               "for forward + backward (FlashAttention's count: the backward's 5 matmuls); "
               "% of the measured dense matmul rate",
)


DECODE = Op(
    name="decode", unit="GB/s", ceiling="copy_gbps",
    make_inputs=lambda c, dev, g: (_randn((c["B"], c["Hq"], 1, c["D"]), c, dev, g),
                                   _randn((c["B"], c["Hkv"], c["Nk"], c["D"]), c, dev, g),
                                   _randn((c["B"], c["Hkv"], c["Nk"], c["D"]), c, dev, g)),
    reference=lambda c, inp: attention_reference(*inp, False),
    torch_output=lambda c, inp: _sdpa_default(*inp, False),
    work=lambda c: 2 * c["B"] * c["Hkv"] * c["Nk"] * c["D"] * _esize(c),
    label=lambda c: f"B={c['B']} Nk={c['Nk']} Hq={c['Hq']} Hkv={c['Hkv']} D={c['D']} {c['dtype']}",
    convention="bytes = the K/V read once (2·B·Hkv·Nk·D·elem); the % compares these read bytes/s "
               "with the copy's (read + write) bytes/s",
)


# ----------------------------------------------------------------------------------------------
# varlen (issue 15): packed ragged sequences, flash_attn_varlen_func's layout
# ----------------------------------------------------------------------------------------------
VARLEN_SEED = 15  # the lengths of a varlen case are fixed by (T, lo, hi) and this seed


def ragged_lengths(total: int, lo: int, hi: int, seed: int = VARLEN_SEED) -> tuple[int, ...]:
    """Sequence lengths in [lo, hi] summing to `total`, each drawn uniformly (random.Random(seed))
    among those that leave a remainder still splittable into such lengths. lo == hi: total // lo
    equal sequences."""
    def splittable(r):  # r is a sum of k >= 0 lengths in [lo, hi]
        return r == 0 or -(-r // hi) <= r // lo

    if not 0 < lo <= hi or total <= 0 or not splittable(total):
        raise ValueError(f"no lengths in [{lo}, {hi}] sum to {total}")
    rng, lens, left = random.Random(seed), [], total
    while left > hi:
        n = rng.choice([n for n in range(lo, hi + 1) if splittable(left - n)])
        lens.append(n)
        left -= n
    lens.append(left)
    return tuple(lens)


def varlen_lengths(c: dict) -> tuple[int, ...]:
    return ragged_lengths(c["T"], c["lo"], c["hi"])


def varlen_pairs(c: dict) -> int:
    """Valid (query, key) pairs of one head: sum over sequences of L² (L(L+1)/2 causal)."""
    return sum(n * (n + 1) // 2 if c["causal"] else n * n for n in varlen_lengths(c))


class VarlenInputs(NamedTuple):
    """One input set of a varlen case, in every provider's layout (made once, never timed)."""
    q: torch.Tensor       # packed (T, Hq, D)
    k: torch.Tensor       # packed (T, Hkv, D)
    v: torch.Tensor
    cu: torch.Tensor      # int32 (B + 1,): cu_seqlens, the same for q and k
    max_len: int
    qp: torch.Tensor      # right-padded (B, Hq, M, D) contiguous, zeros past each length, M = max_len
    kp: torch.Tensor      # (B, Hkv, M, D)
    vp: torch.Tensor
    valid: torch.Tensor   # (B, M) bool: the rows of each sequence in the padded batch
    kr: torch.Tensor      # kp / vp repeated to Hq heads: SDPA with a mask has no GQA but in math
    vr: torch.Tensor
    mask: torch.Tensor    # (B, 1, M, M) bool, SDPA's attn_mask: valid keys (and j <= i if causal)
    doc: torch.Tensor     # (T,) int32: each packed row's sequence, FlexAttention's document mask


def _varlen_inputs(c, dev, g) -> VarlenInputs:
    lens = varlen_lengths(c)
    b, m, t = len(lens), max(lens), sum(lens)
    q, k, v = (_randn((t, h, c["D"]), c, dev, g) for h in (c["Hq"], c["Hkv"], c["Hkv"]))
    ends = [0]
    for n in lens:
        ends.append(ends[-1] + n)
    cu = torch.tensor(ends, dtype=torch.int32, device=dev)
    lens_t = torch.tensor(lens, device=dev)
    valid = torch.arange(m, device=dev)[None, :] < lens_t[:, None]

    def pad(x):  # (T, H, D) -> (B, H, M, D)
        out = x.new_zeros(b, m, x.shape[1], x.shape[2])
        out[valid] = x
        return out.transpose(1, 2).contiguous()
    qp, kp, vp = pad(q), pad(k), pad(v)
    group = c["Hq"] // c["Hkv"]
    mask = valid[:, None, None, :].expand(b, 1, m, m)
    if c["causal"]:
        mask = mask & torch.ones(m, m, dtype=torch.bool, device=dev).tril()
    doc = torch.repeat_interleave(torch.arange(b, dtype=torch.int32, device=dev), lens_t)
    return VarlenInputs(q, k, v, cu, m, qp, kp, vp, valid, kp.repeat_interleave(group, 1),
                        vp.repeat_interleave(group, 1), mask.contiguous(), doc)


def _per_sequence(c, inp, attn) -> list[tuple[int, int, Any]]:
    """attn(q, k, v) on each sequence's (1, H, L, D) views of the packed tensors."""
    out, start = [], 0
    for n in varlen_lengths(c):
        if n:
            views = (x[start:start + n].transpose(0, 1).unsqueeze(0) for x in (inp.q, inp.k, inp.v))
            out.append((start, start + n, attn(*views)))
        start += n
    return out


def varlen_reference(c, inp) -> tuple[torch.Tensor, str]:
    """attention_reference per sequence (float64; float32 for a sequence above
    REF_FLOAT64_MAX_SCORES score elements), packed (T, Hq, D)."""
    out = torch.zeros(inp.q.shape, dtype=torch.float64, device=inp.q.device)
    names = {"fp64"}
    for s, e, (r, name) in _per_sequence(c, inp, lambda q, k, v: attention_reference(q, k, v, c["causal"])):
        out[s:e] = r[0].transpose(0, 1)
        names.add(name)
    return out, "fp32" if "fp32" in names else "fp64"


def _varlen_torch(c, inp) -> torch.Tensor:
    """torch's own op in the input dtype: SDPA on each sequence alone (no mask needed)."""
    out = torch.empty_like(inp.q)
    for s, e, o in _per_sequence(c, inp, lambda q, k, v: _sdpa_default(q, k, v, c["causal"])):
        out[s:e] = o[0].transpose(0, 1)
    return out


def _varlen_label(c) -> str:
    lens = varlen_lengths(c)
    seqs = f"{len(lens)}x{lens[0]}" if len(set(lens)) == 1 else \
        f"{len(lens)} seqs {min(lens)}..{max(lens)}"
    return (f"T={c['T']} {seqs} Hq={c['Hq']} Hkv={c['Hkv']} D={c['D']}"
            f"{' causal' if c['causal'] else ''} {c['dtype']}")


VARLEN = Op(
    name="varlen", unit="TFLOP/s", ceiling="matmul_tflops",
    make_inputs=_varlen_inputs,
    reference=varlen_reference,
    torch_output=_varlen_torch,
    work=lambda c: 4 * c["D"] * c["Hq"] * varlen_pairs(c),
    label=_varlen_label,
    convention="FLOPs = 4·D·Hq·(valid (query, key) pairs): Σ_b L_b² (L_b(L_b+1)/2 causal) over "
               "the packed sequences, for every provider, so padded work counts as waste; % of "
               "the measured dense matmul rate",
    read_bytes=lambda c: c["T"] * (c["Hq"] + 2 * c["Hkv"]) * c["D"] * _esize(c),
)


# ----------------------------------------------------------------------------------------------
# kvcache (issue 15): decode against a KV cache, contiguous and paged
# ----------------------------------------------------------------------------------------------
KVCACHE_PAGE_SIZES = (16, 64, 256)  # every input set holds the cache paged at each of these


class KVCacheInputs(NamedTuple):
    q: torch.Tensor          # (B, Hq, Nq, D)
    k_cache: torch.Tensor    # (B, Nk, Hkv, D): full, every row Nk keys long
    v_cache: torch.Tensor
    seqlens: torch.Tensor    # (B,) int32, = Nk
    pages: dict              # page size -> (k pages, v pages (B·Nk/page, page, Hkv, D), block table)


def _kvcache_inputs(c, dev, g) -> KVCacheInputs:
    b, nk, hkv, d = c["B"], c["Nk"], c["Hkv"], c["D"]
    q = _randn((b, c["Hq"], c["Nq"], d), c, dev, g)
    kc, vc = (_randn((b, nk, hkv, d), c, dev, g) for _ in range(2))
    pages = {}
    for size in KVCACHE_PAGE_SIZES:
        if nk % size:
            raise ValueError(f"Nk = {nk} is not a multiple of the page size {size}")
        per = nk // size
        # shuffled: row b's page i is anywhere in the pool
        table = torch.randperm(b * per, generator=g, device=dev).view(b, per)
        kp, vp = (torch.empty(b * per, size, hkv, d, dtype=kc.dtype, device=dev) for _ in range(2))
        kp[table] = kc.view(b, per, size, hkv, d)
        vp[table] = vc.view(b, per, size, hkv, d)
        pages[size] = (kp, vp, table.to(torch.int32))
    return KVCacheInputs(q, kc, vc, torch.full((b,), nk, dtype=torch.int32, device=dev), pages)


def sdpa_bottom_right(q, k, v, causal: bool = True):
    """SDPA with the queries as the last Nq positions (flash-attn's / ta's causal alignment):
    torch.nn.attention.bias.causal_lower_right, GQA through enable_gqa."""
    kw = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    if not causal or q.shape[2] == 1:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    from torch.nn.attention.bias import causal_lower_right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]), **kw)


def _kv_bytes(c) -> int:
    return (2 * c["B"] * c["Nk"] * c["Hkv"] * c["D"] + 2 * c["B"] * c["Hq"] * c["Nq"] * c["D"]) * _esize(c)


KVCACHE = Op(
    name="kvcache", unit="GB/s", ceiling="copy_gbps",
    make_inputs=_kvcache_inputs,
    reference=lambda c, inp: attention_reference(inp.q, inp.k_cache.transpose(1, 2),
                                                 inp.v_cache.transpose(1, 2), True),
    torch_output=lambda c, inp: sdpa_bottom_right(inp.q, inp.k_cache.transpose(1, 2),
                                                  inp.v_cache.transpose(1, 2)),
    work=_kv_bytes,
    label=lambda c: f"B={c['B']} Nq={c['Nq']} Nk={c['Nk']} Hq={c['Hq']} Hkv={c['Hkv']} D={c['D']} {c['dtype']}",
    convention="bytes = the valid K/V read once (2·B·Nk·Hkv·D·elem) + q read + out written "
               "(2·B·Hq·Nq·D·elem), causal with the Nq queries as the last positions; the % "
               "compares these bytes/s with the copy's (read + write) bytes/s",
    read_bytes=_kv_bytes,
)


# ----------------------------------------------------------------------------------------------
# Providers
# ----------------------------------------------------------------------------------------------
def backend_unavailable(backend: str, device: torch.device) -> str | None:
    """Why `backend` cannot run on `device` in this process, or None (tests/helpers' rule)."""
    if backend == "torch":
        return None
    if backend == "triton":
        if device.type == "cuda":
            return None
        if _checks.triton_interpret():
            return None
        return "the Triton backend needs a CUDA device (or TRITON_INTERPRET=1 on the CPU)"
    if backend == "cuda":
        if device.type != "cuda":
            return "the CUDA backend needs a CUDA device"
        from tiled_attn import cuda
        return None if cuda.is_available() else "the CUDA extension is not available (not built)"
    raise ValueError(f"unknown backend {backend!r}")


def _call_quietly(fn):
    """Warnings (SDPA's "kernel not used because ...") are reported via the exception instead."""
    def wrapped(case, inputs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(case, inputs)
    return wrapped


def ours_softmax(backend: str, *, auto: bool = True,
                 supports: dict[str, Callable[[dict], str | None]] | None = None,
                 kernels: Sequence[str] | None = None) -> Expand:
    """ta.softmax with backend pinned: the dispatcher's choice (`auto`, named after the backend)
    and every kernel of ta.softmax_kernels(backend) (or only `kernels`), each as its own line.
    `supports` maps a kernel name ("*": all) to a rule that declines cases (e.g. a per-column loop
    on big rows)."""
    rules = supports or {}

    def make(device):
        reason = backend_unavailable(backend, device)
        if reason:
            return [Provider(backend, None, available=lambda d: reason)]
        names = ([None] if auto else []) + list(ta.softmax_kernels(backend) if kernels is None
                                                 else kernels)
        return [Provider(backend if k is None else f"{backend}:{k}",
                         (lambda c, inp, k=k: ta.softmax(inp[0], -1, backend=backend, kernel=k)),
                         supports=rules.get(k, rules.get("*")))
                for k in names]
    return Expand(f"{backend}:*", make)


def default_softmax() -> Provider:
    """ta.softmax with backend=None: what a user gets."""
    return Provider("default", lambda c, inp: ta.softmax(inp[0], -1))


def torch_softmax() -> Provider:
    return Provider("torch.softmax", lambda c, inp: torch.softmax(inp[0], -1), role="baseline")


def _raise_recompile_limits() -> None:
    # One compiled function sees every shape of a suite (dynamic=False): the default limit of 8
    # recompiles would silently fall back to eager for the rest.
    import torch._dynamo.config as dc
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(dc, name):
            setattr(dc, name, max(getattr(dc, name), 512))


def _softmax_last(x):
    return torch.softmax(x, -1)


def compiled_softmax() -> Provider:
    """torch.compile(torch.softmax), static shapes: one Inductor kernel per (shape, dtype)."""
    state = {}

    def fn(case, inputs):
        if "f" not in state:
            _raise_recompile_limits()
            state["f"] = torch.compile(_softmax_last, dynamic=False)
        return state["f"](inputs[0])

    return Provider("torch.compile", fn, role="baseline",
                    available=lambda d: None if d.type == "cuda" else "GPU suites only")


def ours_softmax_backward(backend: str) -> Provider:
    """The backward op ta.softmax's autograd calls, on fixed (y, dy)."""
    return Provider(backend, lambda c, inp: torch.ops.tiled_attn.softmax_backward(
        inp[0], inp[1], -1, backend), available=lambda d: backend_unavailable(backend, d))


def default_softmax_backward() -> Provider:
    """The backward ta.softmax's autograd runs with backend=None (its eager path: the plan, no
    op dispatch)."""
    from tiled_attn import softmax as softmax_mod

    def fn(case, inputs):
        y, dy = inputs[0], inputs[1]
        # the backend of backend=None's forward plan (a cached lookup), as autograd would run
        backend = softmax_mod._plan_for(y, y.dim() - 1, None, None).backend
        return softmax_mod._backward(y, dy, y.dim() - 1, backend)
    return Provider("default", fn)


def torch_softmax_backward() -> Provider:
    """What autograd of torch.softmax runs: aten._softmax_backward_data(dy, y, dim, dtype)."""
    return Provider("torch.autograd", lambda c, inp: torch._softmax_backward_data(
        inp[1], inp[0], -1, inp[0].dtype), role="baseline")


def _attention_available(backend: str):
    def available(device):
        reason = backend_unavailable(backend, device)
        if reason or backend != "triton":
            return reason
        try:
            import tiled_attn.triton.attention  # noqa: F401
        except Exception as err:
            return f"tiled_attn.triton.attention not importable ({_describe(err)})"
        return None
    return available


def ours_attention(backend: str, supports: Callable[[dict], str | None] | None = None) -> Provider:
    return Provider(backend, lambda c, inp: ta.attention(*inp, causal=c.get("causal", False),
                                                         backend=backend),
                    available=_attention_available(backend), supports=supports)


def default_attention() -> Provider:
    """ta.attention with backend=None: what a user gets."""
    return Provider("default", lambda c, inp: ta.attention(*inp, causal=c.get("causal", False)))


def cuda_attention_kernel(kernel: str) -> Provider:
    """backend="cuda" with one forward kernel forced ("wgmma" / "wgmma_ws": the sm_90a warpgroup-MMA
    kernels of csrc/attention/sm90/, cp.async and warp-specialized TMA, not the default until
    measured), named "cuda-<kernel>"; unavailable off an sm_90 device, "unsup." for a head dim it
    does not instantiate."""
    def available(device):
        reason = backend_unavailable("cuda", device)
        if reason or not kernel.startswith("wgmma"):
            return reason
        return None if torch.cuda.get_device_capability(device) == (9, 0) else \
            "the wgmma kernel needs an sm_90 (Hopper) device"

    def supports(case):
        from tiled_attn.cuda import attention as cuda_attention
        dims = cuda_attention.sm90_head_dims(kernel) if kernel.startswith("wgmma") else cuda_attention.HEAD_DIMS
        return None if case["D"] in dims else f"the {kernel} kernel has no head dim {case['D']}"

    def fn(case, inputs):
        from tiled_attn.cuda import attention as cuda_attention
        with cuda_attention.forced_kernel(kernel):
            return ta.attention(*inputs, causal=case.get("causal", False), backend="cuda")

    return Provider(f"cuda-{kernel}", fn, available=available, supports=supports)


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def sdpa(backend: str | None = None) -> Provider:
    """torch SDPA pinned to one backend with torch.nn.attention.sdpa_kernel (None: torch's own
    choice). GQA through enable_gqa=True; a backend that cannot run the case raises (recorded
    unsupported)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(case, inputs):
        q, k, v = inputs
        causal = case.get("causal", False)
        if backend is None:
            return _sdpa_default(q, k, v, causal)
        with sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])]):
            return _sdpa_default(q, k, v, causal)

    return Provider("sdpa" if backend is None else f"sdpa-{backend}", _call_quietly(fn),
                    role="baseline")


def grad_provider(name: str, attn_of_case, role: str = "ours", available=None, supports=None,
                  context=None) -> Provider:
    """Gradients of an attention function for the attention_backward suite: `attn_of_case(case)`
    returns attn(q, k, v), asked once per case (the same function for every call of the case, so
    "bwd" finds its retained forwards: one per input set, however many sets rotate; dropped when
    the case changes). `context(case)`, if given, is entered around each call, forward and
    backward. Not CUDA-graph captured (autograd's graph is made per call; the eager time is the
    headline anyway)."""
    state: dict = {"case": None, "attn": None, "cache": {}}

    def fn(case, inputs):
        key = tuple(sorted(case.items()))
        if state["case"] != key:
            state.update(case=key, attn=None, cache={})  # (the old forwards go first)
            state["attn"] = attn_of_case(case)
        with context(case) if context else contextlib.nullcontext():
            return attention_grads(state["attn"], case, inputs, state["cache"])
    return Provider(name, _call_quietly(fn), role=role, available=available, supports=supports,
                    graphable=False)


def ours_attention_grad(backend: str | None) -> Provider:
    """ta.attention forward + backward (backend None: "default", what a user gets)."""
    fns: dict = {}

    def attn_of_case(case):
        causal = case["causal"]
        if causal not in fns:
            fns[causal] = lambda q, k, v: ta.attention(q, k, v, causal=causal, backend=backend)
        return fns[causal]
    return grad_provider(backend or "default", attn_of_case,
                         available=None if backend is None else _attention_available(backend))


def sdpa_grad(backend: str | None = None) -> Provider:
    """torch SDPA's forward + backward, pinned to one backend like sdpa() (None: torch's choice)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attn_of_case(case):
        causal = case["causal"]
        if backend is None:
            return lambda q, k, v: _sdpa_default(q, k, v, causal)

        def attn(q, k, v):
            with sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])]):
                return _sdpa_default(q, k, v, causal)
        return attn
    return grad_provider("sdpa" if backend is None else f"sdpa-{backend}", attn_of_case, role="baseline")


def _no_donated_buffers(case):
    """"bwd" runs a compiled backward again on one retained graph, which AOTAutograd refuses for
    a backward compiled with donated buffers (it may overwrite what it saved): off for the
    compile and for each backward of that mode."""
    if case["mode"] != "bwd":
        return contextlib.nullcontext()
    import torch._functorch.config as functorch_config
    return functorch_config.patch(donated_buffer=False)


def flex_attention_grad() -> Provider:
    """FlexAttention forward + backward under torch.compile (compiled in the checked first call).
    "fwd+bwd" runs torch.compile(flex_attention) as a user would; "bwd" a compile of its own
    without donated buffers (_no_donated_buffers)."""
    state: dict = {}

    def attn_of_case(case):
        from torch.nn.attention.flex_attention import create_block_mask
        from torch.nn.attention.flex_attention import flex_attention as flex
        if "f" not in state:
            _raise_recompile_limits()
            state["f"] = torch.compile(flex, dynamic=False)

            def retained(q, k, v, block_mask, enable_gqa):  # its own code object, so its own compiles
                return flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
            state["f_retained"] = torch.compile(retained, dynamic=False)
        causal, bwd = bool(case["causal"]), case["mode"] == "bwd"
        key = (case["N"], causal, bwd)
        if key not in state:
            mask = (create_block_mask(_causal_mod, None, None, case["N"], case["N"], device="cuda")
                    if causal else None)
            f = state["f_retained" if bwd else "f"]
            state[key] = lambda q, k, v: f(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
        return state[key]
    return grad_provider("flex", attn_of_case, role="baseline", context=_no_donated_buffers,
                         available=lambda d: None if d.type == "cuda" else "GPU suites only")


def _causal_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def flex_attention() -> Provider:
    """FlexAttention under torch.compile(dynamic=False): compiled once per (shapes, dtype,
    causal), causal through a block mask built once per shape. The compile (seconds each) happens
    in the checked first call, never inside the timing."""
    state: dict = {}

    def fn(case, inputs):
        from torch.nn.attention.flex_attention import create_block_mask
        from torch.nn.attention.flex_attention import flex_attention as flex
        q, k, v = inputs
        causal = bool(case.get("causal", False))
        if "f" not in state:
            _raise_recompile_limits()
            state["f"] = torch.compile(flex, dynamic=False)
        key = (tuple(q.shape), tuple(k.shape), q.dtype, causal)
        if key not in state:
            if q.shape[2] != k.shape[2] and causal:
                raise NotImplementedError("the flex provider's causal mask assumes Nq == Nk")
            state[key] = (create_block_mask(_causal_mod, None, None, q.shape[2], k.shape[2],
                                            device=q.device) if causal else None)
        kw = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
        return state["f"](q, k, v, block_mask=state[key], **kw)

    return Provider("flex", fn, role="baseline",
                    available=lambda d: None if d.type == "cuda" else "GPU suites only")


def tiny(max_elems: int, what: str = "the Triton interpreter") -> Callable[[dict], str | None]:
    """A `supports` rule for slow providers (the interpreter, per-column loops): tiny cases only."""
    def supports(case):
        size = math.prod(v for k, v in case.items() if k in ("M", "N", "B", "H", "Hq", "Nk", "D"))
        return None if size <= max_elems else f"{what}: cases of <= {max_elems} elements only"
    return supports


def max_cols(limit: int, why: str) -> Callable[[dict], str | None]:
    """A `supports` rule declining rows longer than `limit` (e.g. one thread per row, where a
    33M-column row is one thread's serial loop: seconds per call)."""
    def supports(case):
        return None if case["N"] <= limit else f"{why}: rows of <= {limit} columns only"
    return supports


# ----------------------------------------------------------------------------------------------
# varlen and kvcache providers (issue 15)
# ----------------------------------------------------------------------------------------------
def _unpad(case, inputs, out):
    """A padded (B, H, M, D) output's valid rows, packed (T, H, D): for the check only."""
    return out.transpose(1, 2)[inputs.valid]


def varlen_attention(backend: str | None = None) -> Provider:
    """ta.attention_varlen on the packed tensors (backend None: "default", what a user gets)."""
    def fn(c, inp):
        return ta.attention_varlen(inp.q, inp.k, inp.v, inp.cu, inp.cu, inp.max_len, inp.max_len,
                                   causal=c["causal"], backend=backend)
    return Provider(backend or "default", fn, host_syncs=True,
                    available=None if backend is None else _attention_available(backend))


def varlen_dense() -> Provider:
    """ta.attention (the dense kernel, no mask) on the right-padded (B, Hq, M, D) batch: exact
    where every sequence has the same length (no padding: the 0.95x bar's denominator) and for
    causal (a valid query sees only keys before it); the padded rows are computed and dropped."""
    def supports(c):
        if c["causal"] or len(set(varlen_lengths(c))) == 1:
            return None
        return "the dense kernel has no key mask: padded keys would be attended (see dense-masked)"
    return Provider("dense", lambda c, inp: ta.attention(inp.qp, inp.kp, inp.vp, causal=c["causal"]),
                    supports=supports, output=_unpad)


def varlen_dense_masked() -> Provider:
    """Our kernel with a key-padding mask (tiled_attn.attention.masked_attention: what
    ta.scaled_dot_product_attention and transformers' padded batches run) on the padded batch."""
    def fn(c, inp):
        from tiled_attn.attention import masked_attention
        return masked_attention(inp.qp, inp.kp, inp.vp, inp.valid, causal=c["causal"])
    return Provider("dense-masked", fn, output=_unpad)


def varlen_sdpa(backend: str | None = None) -> Provider:
    """F.scaled_dot_product_attention on the padded batch with the equivalent boolean (B, 1, M, M)
    mask, K/V repeated to Hq heads beforehand (untimed: with a mask SDPA's GQA runs only its math
    backend); one backend pinned as in sdpa()."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(c, inp):
        ctx = (contextlib.nullcontext() if backend is None
               else sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])]))
        with ctx:
            return F.scaled_dot_product_attention(inp.qp, inp.kr, inp.vr, attn_mask=inp.mask)
    return Provider("sdpa" if backend is None else f"sdpa-{backend}", _call_quietly(fn),
                    role="baseline", output=_unpad)


def _document_mod(doc: torch.Tensor, causal: bool):
    def same_document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    def causal_document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)
    return causal_document if causal else same_document


def varlen_flex() -> Provider:
    """FlexAttention on the packed sequence as one (1, H, T, D) batch with the document block mask
    (and causal), torch.compile(dynamic=False), GQA through enable_gqa: the block mask is made once
    per case, the compile happens in the checked first call (never timed)."""
    state: dict = {}

    def fn(c, inp):
        from torch.nn.attention.flex_attention import create_block_mask
        from torch.nn.attention.flex_attention import flex_attention as flex
        if "f" not in state:
            _raise_recompile_limits()
            state["f"] = torch.compile(flex, dynamic=False)
        key = tuple(sorted(c.items()))
        if state.get("key") != key:
            state.pop("mask", None)
            t = inp.q.shape[0]
            state["mask"] = create_block_mask(_document_mod(inp.doc, c["causal"]), None, None, t, t,
                                              device=inp.q.device)
            state["key"] = key
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (inp.q, inp.k, inp.v))
        return state["f"](q, k, v, block_mask=state["mask"], enable_gqa=q.shape[1] != k.shape[1])
    return Provider("flex", fn, role="baseline", output=lambda c, inp, out: out[0].transpose(0, 1),
                    available=lambda d: None if d.type == "cuda" else "GPU suites only")


def kvcache_attention(page: int | None = None, backend: str | None = None) -> Provider:
    """ta.attention_kvcache on the contiguous (B, Nk, Hkv, D) cache ("contiguous"), or with a
    shuffled block table on the cache paged at `page` ("paged-<page>"); causal, no append."""
    if page is not None and page not in KVCACHE_PAGE_SIZES:
        raise ValueError(f"page size {page} is not one of KVCACHE_PAGE_SIZES {KVCACHE_PAGE_SIZES}")

    def fn(c, inp):
        if page is None:
            return ta.attention_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.seqlens, causal=True,
                                        backend=backend)
        kp, vp, table = inp.pages[page]
        return ta.attention_kvcache(inp.q, kp, vp, inp.seqlens, block_table=table, causal=True,
                                    backend=backend)
    name = "contiguous" if page is None else f"paged-{page}"
    return Provider(name if backend is None else f"{name}:{backend}", fn, host_syncs=True,
                    available=None if backend is None else _attention_available(backend))


def kvcache_dense() -> Provider:
    """ta.attention (our plain decode kernel, no cache API) on the contiguous cache's (B, Hkv, Nk,
    D) view: what the cache API costs over it."""
    return Provider("dense", lambda c, inp: ta.attention(inp.q, inp.k_cache.transpose(1, 2),
                                                         inp.v_cache.transpose(1, 2), causal=True))


def kvcache_sdpa() -> Provider:
    """F.scaled_dot_product_attention on the contiguous cache's valid keys ((B, Hkv, Nk, D) view),
    enable_gqa, bottom-right causal for Nq > 1 (sdpa_bottom_right)."""
    return Provider("sdpa", _call_quietly(lambda c, inp: sdpa_bottom_right(
        inp.q, inp.k_cache.transpose(1, 2), inp.v_cache.transpose(1, 2))), role="baseline")
