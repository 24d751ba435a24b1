"""The benchmark harness (benchmarks/): check before timing, statuses, writers, the CPU suite.

Everything here runs on the CPU; the one `gpu` test exercises the CUDA-graph timer and its
fallback to per-call events.
"""
from __future__ import annotations

import ast
import json
import math
import time
from pathlib import Path

import pytest
import torch

from benchmarks import __main__ as cli
from benchmarks import harness as h
from benchmarks import report
from tiled_attn import reference

from helpers import HAS_CUDA, assert_rule, fresh_seed

BENCH_DIR = Path(h.__file__).resolve().parent
SUITE_FILES = sorted(BENCH_DIR.glob("suite_*.py"))
CPU = torch.device("cpu")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class FakeTimer:
    """Records every measure() call; returns a fixed 1 ms."""

    def __init__(self):
        self.calls = 0

    def measure(self, call, n_sets=1, graphable=True, **kw):
        self.calls += 1
        self.kw = kw
        call(0)
        return h.Timing(1.0, 1, "fake", None)


def counted(fn):
    def wrapped(case, inputs):
        wrapped.calls += 1
        return fn(case, inputs)
    wrapped.calls = 0
    return wrapped


def _softmax(case, inputs):
    return torch.softmax(inputs[0], -1)


def _tiny_suite(providers, baselines=("torch.softmax",), plot=h.Plot("lines", x="N", cols="dtype")):
    return h.Suite(name="t", title="test suite", op=h.SOFTMAX, device="cpu",
                   shapes=[dict(M=8, N=64), dict(M=4, N=256)], dtypes=("fp32",),
                   providers=providers, baselines=baselines, plot=plot)


def _cfg(timer, **kw):
    return h.RunConfig(device=CPU, timer=timer, ceilings={"copy_gbps": 10.0, "matmul_tflops": 1.0},
                       seed=fresh_seed(), **kw)


def _by_provider(result):
    out: dict = {}
    for r in result["records"]:
        out.setdefault(r["provider"], []).append(r)
    return out


# ----------------------------------------------------------------------------------------------
# Check before timing; statuses
# ----------------------------------------------------------------------------------------------
def test_wrong_provider_is_failed_and_never_timed():
    wrong = counted(lambda c, inp: torch.softmax(inp[0], -1) * 1.01)
    nan_out = counted(lambda c, inp: torch.full_like(inp[0], float("nan")))
    right = counted(_softmax)
    timer = FakeTimer()
    suite = _tiny_suite([h.Provider("wrong", wrong), h.Provider("nan", nan_out),
                         h.Provider("right", right), h.torch_softmax()])
    result = h.run_suite(suite, _cfg(timer))
    recs = _by_provider(result)
    for name, fn in (("wrong", wrong), ("nan", nan_out)):
        assert [r["status"] for r in recs[name]] == [h.FAILED, h.FAILED]
        assert all(r["ms"] is None and r["value"] is None for r in recs[name])
        assert fn.calls == 2  # the one checked call per case, nothing timed
    assert all(r["e_ours"] > r["tol"] for r in recs["wrong"])
    assert "NaN" in recs["nan"][0]["error"]
    assert [r["status"] for r in recs["right"]] == [h.OK, h.OK]
    # measured: right and torch.softmax, for each of the two cases; never the failing ones
    assert timer.calls == 4
    assert right.calls == 2 + 2  # checked + the fake timer's one call, per case
    assert recs["right"][0]["ratios"] == {"torch.softmax": 1.0}


def test_raising_provider_is_unsupported_or_error_and_unavailable_is_not_called():
    def refuses(case, inputs):
        raise NotImplementedError("no kernel for this N")

    def crashes(case, inputs):
        raise KeyError("bug")

    never = counted(_softmax)
    timer = FakeTimer()
    suite = _tiny_suite([h.Provider("refuses", refuses), h.Provider("crashes", crashes),
                         h.Provider("absent", never, available=lambda d: "not built"),
                         h.Provider("declines", never, supports=lambda c: "too big"),
                         h.torch_softmax()])
    recs = _by_provider(h.run_suite(suite, _cfg(timer)))
    assert {r["status"] for r in recs["refuses"]} == {h.UNSUPPORTED}
    assert "NotImplementedError: no kernel for this N" in recs["refuses"][0]["error"]
    assert {r["status"] for r in recs["crashes"]} == {h.ERROR}
    assert {r["status"] for r in recs["absent"]} == {h.UNAVAILABLE}
    assert recs["absent"][0]["error"] == "not built"
    assert {r["status"] for r in recs["declines"]} == {h.UNSUPPORTED}
    assert never.calls == 0
    assert timer.calls == 2  # torch.softmax only


def test_expand_that_raises_is_one_unavailable_row():
    def make(device):
        raise ImportError("tiled_attn.triton.softmax missing")

    suite = _tiny_suite([h.Expand("triton:*", make), h.torch_softmax()])
    recs = _by_provider(h.run_suite(suite, _cfg(FakeTimer())))
    assert {r["status"] for r in recs["triton:*"]} == {h.UNAVAILABLE}
    assert "missing" in recs["triton:*"][0]["error"]


def test_time_cap_skips_remaining_cases():
    def slow(case, inputs):
        time.sleep(0.05)
        return torch.softmax(inputs[0], -1)

    suite = _tiny_suite([h.Provider("slow", slow)], baselines=())
    result = h.run_suite(suite, _cfg(FakeTimer(), time_cap_s=0.01))
    assert [r["status"] for r in result["records"]] == [h.OK, h.SKIPPED]
    assert result["capped"]


def test_provider_filter():
    suite = _tiny_suite([h.Provider("a", _softmax), h.Provider("b", _softmax), h.torch_softmax()])
    result = h.run_suite(suite, _cfg(FakeTimer(), provider_filter=lambda n: n.startswith("torch")))
    assert {r["provider"] for r in result["records"]} == {"torch.softmax"}


# ----------------------------------------------------------------------------------------------
# The rule on the device agrees with tests/helpers.assert_rule; the chunked attention reference
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("perturb", [0.0, 1e-6, 1e-3, 3e-2])
def test_check_rule_matches_helpers(dtype, perturb):
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 300, generator=gen).to(dtype)
    ref = reference.safe_softmax(x.double(), -1)
    torch_out = torch.softmax(x, -1)
    ours = (ref * (1 + perturb * torch.randn(ref.shape, generator=gen, dtype=torch.float64))).to(dtype)
    ours[0, 0] = ref[0, 0]  # keep dtype rounding everywhere else
    check = h.check_rule(ours, ref, h.max_err(torch_out, ref), dtype)
    try:
        assert_rule(ours, ref, torch_out, dtype=dtype, seed=seed)
        helpers_ok = True
    except AssertionError:
        helpers_ok = False
    assert check.ok == helpers_ok, (seed, check)


def test_check_rule_nonfinite_and_shape():
    ref = torch.tensor([[0.5, 0.5], [float("nan"), float("nan")]], dtype=torch.float64)
    good = ref.float()
    assert h.check_rule(good, ref, 0.0, torch.float32).ok
    bad = good.clone()
    bad[0, 0] = float("inf")
    assert not h.check_rule(bad, ref, 0.0, torch.float32).ok
    assert not h.check_rule(good[:1], ref, 0.0, torch.float32).ok
    assert not h.check_rule(torch.zeros(2, 2), ref, 0.0, torch.float32).ok  # NaN rows missing
    assert not h.check_rule(None, ref, 0.0, torch.float32).ok


@pytest.mark.parametrize("causal", [False, True])
def test_attention_reference_chunks_agree(monkeypatch, causal):
    gen = torch.Generator().manual_seed(fresh_seed())
    q = torch.randn(2, 6, 5, 8, generator=gen)
    k = torch.randn(2, 3, 7, 8, generator=gen)
    v = torch.randn(2, 3, 7, 8, generator=gen)
    whole = reference.attention(q.double(), k.double(), v.double(), causal=causal)
    monkeypatch.setattr(h, "REF_CHUNK_ELEMS", 2 * 5 * 7)  # one (batch, kv-head) row per chunk
    chunked, dtype = h.attention_reference(q, k, v, causal)
    assert dtype == "fp64"
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-12)
    monkeypatch.setattr(h, "REF_FLOAT64_MAX_SCORES", 10)
    assert h.attention_reference(q, k, v, causal)[1] == "fp32"


def test_rotation_sets_exceed_l2(monkeypatch):
    l2 = 50 << 20
    monkeypatch.setattr(h, "l2_bytes", lambda device: l2)
    for set_bytes in (1 << 20, 16 << 20, 40 << 20, 60 << 20, 99 << 20, 100 << 20, 400 << 20):
        n = h.rotation_sets(set_bytes, CPU)
        # between two uses of a set, the others (or the set itself, when alone) exceed L2
        assert (n - 1) * set_bytes >= l2 or set_bytes >= 2 * l2 or n == 64, (set_bytes, n)
    assert h.rotation_sets(400 << 20, CPU) == 1


# ----------------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------------
def _run_dict(suites):
    return {"meta": {"date": "2026-01-01", "device_name": "test", "capability": "cpu",
                     "torch": torch.__version__, "triton": "x", "cuda": "n/a", "python": "3",
                     "command": "python -m benchmarks --quick", "seed": 1, "quick": True,
                     "timing": "fake"},
            "ceilings": {"cpu": {"copy_gbps": 10.0, "copy_note": "c", "matmul_tflops": 1.0,
                                 "matmul_note": "m", "l2_bytes": 0}},
            "suites": suites}


@pytest.mark.parametrize("kind", ["lines", "bars"])
def test_writers_json_markdown_png(tmp_path, kind):
    wrong = lambda c, inp: torch.zeros_like(inp[0])  # noqa: E731
    suite = _tiny_suite([h.Provider("ours", _softmax), h.Provider("wrong", wrong),
                         h.torch_softmax()], plot=h.Plot(kind, x="N", cols="dtype"))
    result = h.run_suite(suite, _cfg(FakeTimer()))
    result["records"][0]["e_ours"] = math.inf  # non-finite floats must still give strict JSON
    run = _run_dict([result])

    path = report.write_json(run, tmp_path / "r.json")
    loaded = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert loaded == report._jsonable(run)
    assert loaded["suites"][0]["records"][0]["e_ours"] == "inf"

    png = report.plot_suite(result, run["ceilings"]["cpu"], tmp_path / "p.png")
    assert png.read_bytes()[:8] == PNG_MAGIC
    import matplotlib.image
    assert matplotlib.image.imread(png).ndim == 3

    md = report.write_markdown(run, tmp_path / "r.md", {"t": png.name}).read_text()
    lines = md.splitlines()
    assert "`python -m benchmarks --quick`" in md
    header = next(i for i, l in enumerate(lines) if l.startswith("| case | ours |"))
    assert lines[header + 1].startswith("|---|")
    width = lines[header].count("|")
    body = lines[header + 2:header + 4]
    assert len(body) == 2 and all(l.count("|") == width for l in body)
    assert "FAILED" in lines[header + 2]
    assert "Speed-up over `torch.softmax`" in md and f"]({png.name})" in md


def test_plot_with_nothing_measured_is_none(tmp_path):
    suite = _tiny_suite([h.Provider("absent", _softmax, available=lambda d: "no")], baselines=())
    result = h.run_suite(suite, _cfg(FakeTimer()))
    assert report.plot_suite(result, {}, tmp_path / "p.png") is None


# ----------------------------------------------------------------------------------------------
# Suite files declare; the harness does the rest
# ----------------------------------------------------------------------------------------------
MACHINERY = {"Event", "synchronize", "perf_counter", "do_bench", "measure", "check_rule",
             "max_err", "run_suite", "run_case", "elapsed_time", "json", "matplotlib", "print",
             "CUDAGraph", "autograd"}


@pytest.mark.parametrize("path", SUITE_FILES, ids=lambda p: p.name)
def test_suite_files_only_declare(path):
    src = path.read_text()
    assert len(src.splitlines()) <= 70, f"{path.name} should be a short declaration"
    tree = ast.parse(src)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & MACHINERY, f"{path.name} uses harness machinery {names & MACHINERY}"
    imports = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
               for a in n.names}
    # harness, or the runner module of a suite with its own tables (overhead.py, end_to_end.py,
    # context_parallel.py)
    assert imports <= {"harness", "QUICK", "SHAPES", "overhead", "end_to_end", "context_parallel"}, imports
    for node in tree.body:  # module level: constants, small shape helpers and the Suite objects
        assert isinstance(node, (ast.Expr, ast.ImportFrom, ast.Assign, ast.FunctionDef)), node


def test_suites_are_well_formed():
    suites = cli._load_suites(list(cli.GPU_SUITES) + ["cpu"])
    assert {s.name for s in suites} >= set(cli.GPU_SUITES)
    for s in suites:
        if hasattr(s, "run"):  # a runner of its own (overhead, e2e): describes itself
            assert s.name in cli.GPU_SUITES and s.describe(False)
            continue
        assert isinstance(s, h.Suite)
        cases = s.cases()
        assert cases and all(c["dtype"] in h.DTYPES for c in cases)
        assert len({s.op.label(c) for c in cases}) == len(cases)
        assert 0 < len(s.cases(quick=True)) <= len(cases)
        assert all(isinstance(p, (h.Provider, h.Expand)) for p in s.providers)
        declared = {p.name for p in s.providers if isinstance(p, h.Provider)}
        assert set(s.baselines) <= declared
        for c in cases:
            assert s.op.work(c) > 0


def test_gpu_grid_matches_the_issue():
    from benchmarks import suite_attention, suite_decode, suite_softmax
    att = suite_attention.SUITE.cases()
    # H = 2048 // D: H·D = 2048 exactly but at D = 96 (2016) and 192 (1920)
    assert len(att) == 60 and all(c["B"] * c["N"] == 32768 and c["H"] == 2048 // c["D"] for c in att)
    assert {c["D"] for c in att} == {64, 96, 128, 192, 256}
    assert {c["N"] for c in att} == {512, 1024, 2048, 4096, 8192, 16384}
    assert all(c["dtype"] == "bf16" for c in att)
    sm = suite_softmax.SUITE.cases()
    assert len(sm) == 18 and {c["M"] * c["N"] for c in sm} <= {1 << 23, 1 << 25, 1 << 26}
    dec = suite_decode.SUITE.cases()
    assert {(c["B"], c["Nk"]) for c in dec} == {(b, n) for b in (1, 4, 16, 64) for n in (2048, 8192, 32768, 131072)}
    c = dict(B=16, Hq=32, Hkv=8, Nk=131072, D=128, dtype="bf16")
    assert h.DECODE.work(c) == 2 * 16 * 8 * 131072 * 128 * 2
    c = dict(B=2, H=16, N=16384, D=128, causal=True, dtype="bf16")
    assert h.ATTENTION.work(c) == 2 * 2 * 16 * 16384 ** 2 * 128


# ----------------------------------------------------------------------------------------------
# attention_backward (issue 13): the grid, the FLOP count, "bwd" without its forward, a CPU run
# ----------------------------------------------------------------------------------------------
def test_attention_backward_grid_matches_the_issue():
    from benchmarks import suite_attention_backward as sab
    s = sab.SUITE
    cases = [c for c in s.cases() if "Hkv" not in c]
    assert {(c["mode"], c["N"], c["D"], c["causal"]) for c in cases} == {
        (m, n, d, c) for m in ("fwd+bwd", "bwd") for n in (1024, 4096, 16384) for d in (64, 128)
        for c in (False, True)} and len(cases) == 24
    assert all(c["B"] * c["N"] == 16384 and c["H"] * c["D"] == 2048 and c["dtype"] == "bf16"
               for c in cases)
    gqa = [c for c in s.cases() if "Hkv" in c]  # the Llama-3.2-1B layer
    assert {(c["mode"], c["N"]) for c in gqa} == {(m, n) for m in ("fwd+bwd", "bwd") for n in (2048, 8192)}
    assert all((c["B"], c["H"], c["Hkv"], c["D"], c["causal"]) == (1, 32, 8, 64, True) for c in gqa)
    cases = s.cases()
    quick = s.cases(quick=True)
    assert quick and all(c in cases for c in quick) and len(quick) < len(cases)
    names = [p.name for p in s.providers]
    assert names == ["default", "triton", "cuda", "sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex"]
    assert {"sdpa", "sdpa-flash", "sdpa-cudnn", "flex"} <= set(s.baselines)
    assert all(not p.graphable for p in s.providers)  # eager: autograd is not captured
    assert s.device == "cuda" and s.op is h.ATTENTION_BACKWARD
    # by hand: forward 4·B·H·N²·D, halved for causal; backward 2.5x that; fwd+bwd 3.5x
    c = dict(B=1, H=16, N=16384, D=128, causal=True, mode="fwd+bwd", dtype="bf16")
    assert h.ATTENTION_BACKWARD.work(c) == 3.5 * 4 * 16 * 16384 ** 2 * 128 / 2 == 3848290697216
    c = dict(B=4, H=32, N=4096, D=64, causal=False, mode="bwd", dtype="bf16")
    assert h.ATTENTION_BACKWARD.work(c) == 2.5 * 2 ** 39 == 1374389534720


class CyclingTimer:
    """Calls the provider `n` times, cycling the input sets like CudaTimer; a fixed 1 ms."""

    def __init__(self, n):
        self.n = n

    def measure(self, call, n_sets=1, graphable=True, **kw):
        for i in range(self.n):
            call(i % n_sets)
        return h.Timing(1.0, self.n, "fake", None)


def _counting_sdpa(counts):
    class Count(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            counts["fwd"] += 1
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            counts["bwd"] += 1
            return g
    return lambda q, k, v: Count.apply(h.F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
def test_attention_backward_bwd_mode_excludes_the_forward(monkeypatch, mode):
    sets, calls = 10, 25  # more sets than the old 8-entry forward cache held
    monkeypatch.setattr(h, "rotation_sets", lambda set_bytes, device: sets)
    counts = {"fwd": 0, "bwd": 0}
    sdpa_calls, ours_calls = [0], [0]
    real_sdpa, real_attention = h._sdpa_default, h.ta.attention

    def sdpa_counted(*a, **kw):
        sdpa_calls[0] += 1
        return real_sdpa(*a, **kw)

    def attention_counted(*a, **kw):
        ours_calls[0] += 1
        return real_attention(*a, **kw)
    monkeypatch.setattr(h, "_sdpa_default", sdpa_counted)
    monkeypatch.setattr(h.ta, "attention", attention_counted)
    suite = h.Suite(name="t", title="t", op=h.ATTENTION_BACKWARD, device="cpu", dtypes=("fp32",),
                    shapes=[dict(B=1, H=2, N=16, D=8, causal=True, mode=mode)],
                    providers=[h.grad_provider("counted", lambda c: _counting_sdpa(counts)),
                               h.sdpa_grad(), h.ours_attention_grad("torch")],
                    baselines=("sdpa",))
    recs = _by_provider(h.run_suite(suite, _cfg(CyclingTimer(calls))))
    assert {r["status"] for rs in recs.values() for r in rs} == {h.OK}
    backwards = 1 + calls  # the checked call, then the timer's
    # "bwd": one forward per input set, made before the first backward of that set
    forwards = sets if mode == "bwd" else backwards
    assert counts == {"fwd": forwards, "bwd": backwards}
    assert sdpa_calls[0] == 1 + forwards  # + torch's own gradients for the rule
    assert ours_calls[0] == forwards
    assert recs["counted"][0]["n_sets"] == sets


def test_attention_backward_forwards_dropped_with_the_case():
    counts = {"fwd": 0, "bwd": 0}
    p = h.grad_provider("counted", lambda c: _counting_sdpa(counts))
    gen = torch.Generator().manual_seed(fresh_seed())
    inputs = tuple(torch.randn(1, 2, 16, 8, generator=gen) for _ in range(4))
    a = dict(B=1, H=2, N=16, D=8, causal=True, mode="bwd", dtype="fp32")
    for case in (a, a, dict(a, D=9, N=16), a):  # a new case (even a key of its own) forwards again
        p.fn(case, inputs)
    assert counts == {"fwd": 3, "bwd": 4}


def test_check_rule_per_gradient():
    gen = torch.Generator().manual_seed(fresh_seed())
    refs = tuple(torch.randn(4, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    e_torch = (1e-3, 1e-3, 1e-3)
    outs = [r.float() for r in refs]
    assert h.check_rule(tuple(outs), refs, e_torch, torch.float32).ok
    outs[1] = outs[1] + 0.1  # dk wrong
    check = h.check_rule(tuple(outs), refs, e_torch, torch.float32)
    assert not check.ok and check.message.startswith("output 1:")
    assert not h.check_rule(outs[0], refs, e_torch, torch.float32).ok  # one tensor for three


@pytest.mark.parametrize("causal", [False, True])
def test_attention_grad_reference_chunks_agree(monkeypatch, causal):
    gen = torch.Generator().manual_seed(fresh_seed())
    q, do = (torch.randn(2, 3, 5, 8, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, 3, 7, 8, generator=gen) for _ in range(2))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    whole = torch.autograd.grad(reference.attention(*leaves, causal=causal), leaves, do.double())
    monkeypatch.setattr(h, "REF_CHUNK_ELEMS", 5 * 7)  # one (batch, head) pair per chunk
    grads, dtype = h.attention_grad_reference(q, k, v, do, causal)
    assert dtype == "fp64"
    for g, w in zip(grads, whole):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    monkeypatch.setattr(h, "REF_FLOAT64_MAX_SCORES", 10)
    grads, dtype = h.attention_grad_reference(q, k, v, do, causal)
    assert dtype == "fp32"
    for g, w in zip(grads, whole):
        torch.testing.assert_close(g.double(), w, rtol=0, atol=1e-5)


def test_attention_backward_suite_end_to_end_on_cpu(tmp_path):
    """The suite's own op, providers, baselines and plot on tiny CPU shapes (the Triton backward
    in the interpreter), with one wrong provider; then the JSON, markdown and PNG writers."""
    import dataclasses

    from benchmarks import suite_attention_backward as sab
    wrong = h.grad_provider("wrong", lambda c: lambda q, k, v: 1.25 * h._sdpa_default(q, k, v, c["causal"]))
    shapes = [dict(B=2, H=2, N=n, D=16, causal=c, mode=m) for m in ("fwd+bwd", "bwd")
              for c in (False, True) for n in (32, 48)]
    shapes += [dict(B=1, H=4, Hkv=2, N=40, D=16, causal=True, mode=m) for m in ("fwd+bwd", "bwd")]  # GQA
    suite = dataclasses.replace(sab.SUITE, device="cpu", shapes=shapes, quick_shapes=None,
                                providers=list(sab.SUITE.providers) + [h.sdpa_grad("math"), wrong])
    result = h.run_suite(suite, _cfg(FakeTimer()))
    recs = _by_provider(result)
    status = {name: {r["status"] for r in rs} for name, rs in recs.items()}
    assert status == {"default": {h.OK}, "triton": {h.OK}, "cuda": {h.UNAVAILABLE}, "sdpa": {h.OK},
                      "sdpa-flash": {h.OK},
                      "sdpa-cudnn": {h.UNSUPPORTED}, "sdpa-efficient": {h.UNSUPPORTED},
                      "flex": {h.UNAVAILABLE}, "sdpa-math": {h.OK}, "wrong": {h.FAILED}}
    assert all(r["error"].startswith("output ") for r in recs["wrong"])
    for r in recs["default"]:
        assert r["ref_dtype"] == "fp64" and r["e_ours"] <= r["tol"]
        assert set(r["ratios"]) == {"sdpa", "sdpa-flash"}  # the baselines that ran here
        assert r["value"] == pytest.approx(h.ATTENTION_BACKWARD.work(r["case"]) / 1e-3 / 1e12)
    run = _run_dict([result])
    loaded = json.loads(report.write_json(run, tmp_path / "r.json").read_text())
    assert {r["case"]["mode"] for r in loaded["suites"][0]["records"]} == {"fwd+bwd", "bwd"}
    png = report.plot_suite(result, run["ceilings"]["cpu"], tmp_path / "p.png")
    assert png.read_bytes()[:8] == PNG_MAGIC
    md = report.write_markdown(run, tmp_path / "r.md", {suite.name: png.name}).read_text()
    assert "| case | default |" in md and "bwd D=16 N=48 B=2 H=2 causal bf16" in md
    assert "fwd+bwd D=16 N=40 B=1 H=4/2 causal bf16" in md


@pytest.mark.skipif(HAS_CUDA, reason="checks the message a CPU-only machine gives")
def test_attention_backward_is_a_gpu_suite(capsys):
    assert "attention_backward" in cli.GPU_SUITES
    assert "attention_backward" in cli._suite_names(cli.parse_args(["--suite", "gpu"]), True)
    assert cli.main(["--suite", "attention-backward", "--quick"]) == 2
    out = capsys.readouterr().out
    assert "attention_backward" in out and "need a CUDA GPU" in out


# ----------------------------------------------------------------------------------------------
# varlen and kvcache (issue 15): grids, counts, the harness hooks they use, CPU runs
# ----------------------------------------------------------------------------------------------
def test_varlen_and_kvcache_are_gpu_suites_before_attention():
    order = list(cli.GPU_SUITES)
    assert order.index("varlen") < order.index("attention")
    assert order.index("kvcache") < order.index("attention")
    assert "varlen" in cli._suite_names(cli.parse_args(["--suite", "gpu"]), True)
    suites = {s.name: s for s in cli._load_suites(["varlen", "kvcache"])}
    assert set(suites) == {"varlen", "kvcache"}
    assert all(s.device == "cuda" and s.dtypes == ("bf16",) for s in suites.values())


@pytest.mark.parametrize("total,lo,hi", [(16384, 128, 4096), (16384, 2048, 2048), (100, 8, 40),
                                         (1000, 100, 150), (7, 7, 7)])
def test_ragged_lengths(total, lo, hi):
    lens = h.ragged_lengths(total, lo, hi)
    assert sum(lens) == total and all(lo <= n <= hi for n in lens)
    assert lens == h.ragged_lengths(total, lo, hi)  # a fixed seed: the same list every time
    if lo == hi:
        assert lens == (lo,) * (total // lo)
    with pytest.raises(ValueError):
        h.ragged_lengths(lo - 1, lo, hi)


def test_varlen_grid_matches_the_issue():
    from benchmarks import suite_varlen as sv
    s = sv.SUITE
    cases = s.cases()
    assert len(cases) == 8 and s.op is h.VARLEN and s.plot.kind == "bars"
    assert {(c["D"], c["causal"]) for c in cases} == {(d, c) for d in (64, 128) for c in (False, True)}
    assert all(c["T"] == 16384 and c["Hq"] == 32 and c["Hkv"] == 8 for c in cases)
    ragged = [c for c in cases if c["lo"] != c["hi"]]
    uniform = [c for c in cases if c["lo"] == c["hi"]]
    assert len(ragged) == len(uniform) == 4
    lens = h.varlen_lengths(ragged[0])
    assert sum(lens) == 16384 and min(lens) >= 128 and max(lens) <= 4096 and len(set(lens)) > 2
    assert h.varlen_lengths(uniform[0]) == (2048,) * 8
    quick = s.cases(quick=True)
    assert quick and all(c in cases for c in quick) and len(quick) < len(cases)
    names = [p.name for p in s.providers]
    assert names == ["default", "dense", "dense-masked", "sdpa", "sdpa-efficient", "sdpa-cudnn", "flex"]
    assert {"dense", "sdpa", "flex"} <= set(s.baselines) and "default" not in s.baselines
    assert str(lens) in s.notes  # the exact lengths are written down
    # FLOPs on valid pairs only, by hand: 4·D·Hq·Σ L² (L(L+1)/2 causal)
    c = dict(T=100, lo=8, hi=40, Hq=4, Hkv=2, D=16, causal=False, dtype="bf16")
    ls = h.varlen_lengths(c)
    assert h.VARLEN.work(c) == 4 * 16 * 4 * sum(n * n for n in ls)
    assert h.VARLEN.work(dict(c, causal=True)) == 4 * 16 * 4 * sum(n * (n + 1) // 2 for n in ls)
    assert h.VARLEN.work(dict(cases[0], lo=2048, hi=2048, D=128, causal=False)) == 4 * 128 * 32 * 8 * 2048 ** 2
    assert h.VARLEN.read_bytes(c) == 100 * (4 + 2 + 2) * 16 * 2
    # the dense kernel (no mask) only where it is exact
    dense = next(p for p in s.providers if p.name == "dense")
    assert dense.supports(dict(c, causal=False)) and dense.supports(dict(c, causal=True)) is None
    assert dense.supports(dict(c, lo=20, hi=20, T=100)) is None


def test_varlen_inputs_are_one_batch_in_every_layout():
    c = dict(T=90, lo=8, hi=40, Hq=4, Hkv=2, D=8, causal=True, dtype="fp32")
    inp = h.VARLEN.make_inputs(c, CPU, torch.Generator().manual_seed(fresh_seed()))
    lens = h.varlen_lengths(c)
    b, m = len(lens), max(lens)
    assert inp.cu.dtype == torch.int32 and inp.cu.tolist()[-1] == 90 and inp.max_len == m
    assert inp.qp.shape == (b, 4, m, 8) and inp.kp.shape == (b, 2, m, 8) and inp.kr.shape == (b, 4, m, 8)
    assert inp.mask.shape == (b, 1, m, m) and inp.valid.shape == (b, m) and inp.doc.shape == (90,)
    start = 0
    for i, n in enumerate(lens):
        torch.testing.assert_close(inp.qp[i, :, :n], inp.q[start:start + n].transpose(0, 1), rtol=0, atol=0)
        assert not inp.qp[i, :, n:].any() and int(inp.valid[i].sum()) == n
        assert (inp.doc[start:start + n] == i).all()
        assert inp.mask[i, 0, n - 1, :n].all() and not inp.mask[i, 0, 0, 1:].any()  # causal
        start += n
    torch.testing.assert_close(h._unpad(c, inp, inp.qp), inp.q, rtol=0, atol=0)
    torch.testing.assert_close(inp.kr[:, 1], inp.kp[:, 0], rtol=0, atol=0)  # GQA repeat, group 2


def test_kvcache_grid_matches_the_issue():
    from benchmarks import suite_kvcache as sk
    s = sk.SUITE
    cases = s.cases()
    assert {(c["Nq"], c["B"], c["Nk"]) for c in cases} == {
        (nq, b, nk) for nq in (1, 4) for b in (1, 8, 32) for nk in (4096, 32768)} and len(cases) == 12
    assert all(c["Hq"] == 32 and c["Hkv"] == 8 and c["D"] == 128 and c["dtype"] == "bf16" for c in cases)
    quick = s.cases(quick=True)
    assert quick and all(c in cases for c in quick) and len(quick) < len(cases)
    names = [p.name for p in s.providers]
    assert names == ["contiguous", "paged-16", "paged-64", "paged-256", "dense", "sdpa"]
    assert set(s.baselines) == {"contiguous", "sdpa"} and h.KVCACHE_PAGE_SIZES == (16, 64, 256)
    assert all(c["Nk"] % max(h.KVCACHE_PAGE_SIZES) == 0 for c in cases)
    # bytes by hand: K and V (valid keys) once, q read and out written
    c = dict(B=32, Nq=4, Nk=32768, Hq=32, Hkv=8, D=128, dtype="bf16")
    assert h.KVCACHE.work(c) == 2 * (2 * 32 * 32768 * 8 * 128 + 2 * 32 * 32 * 4 * 128) == 4297064448
    assert h.KVCACHE.read_bytes(c) == h.KVCACHE.work(c)
    with pytest.raises(ValueError):
        h.kvcache_attention(32)


def test_kvcache_pages_hold_the_cache():
    c = dict(B=3, Nq=2, Nk=512, Hq=4, Hkv=2, D=8, dtype="fp32")
    inp = h.KVCACHE.make_inputs(c, CPU, torch.Generator().manual_seed(fresh_seed()))
    assert inp.seqlens.dtype == torch.int32 and inp.seqlens.tolist() == [512] * 3
    for size, (kp, vp, table) in inp.pages.items():
        assert table.dtype == torch.int32 and table.shape == (3, 512 // size)
        assert sorted(table.flatten().tolist()) == list(range(3 * 512 // size))  # each page once
        assert table.flatten().tolist() != sorted(table.flatten().tolist())  # shuffled
        j = torch.arange(512)
        for b in range(3):
            rows = table[b].long()[j // size]
            torch.testing.assert_close(kp[rows, j % size], inp.k_cache[b], rtol=0, atol=0)
            torch.testing.assert_close(vp[rows, j % size], inp.v_cache[b], rtol=0, atol=0)


@pytest.mark.parametrize("nq", [1, 3])
def test_sdpa_bottom_right_is_the_reference_alignment(nq):
    gen = torch.Generator().manual_seed(fresh_seed())
    q = torch.randn(2, 4, nq, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 11, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(h.sdpa_bottom_right(q, k, v), reference.attention(q, k, v, causal=True))


def test_provider_output_hook_checks_but_is_not_timed():
    """Provider.output maps the timed call's own layout for the check only; Provider.host_syncs
    reaches the timer; Op.read_bytes sizes the rotation."""
    timed = []

    def transposed(case, inputs):  # its own layout: the softmax's transpose
        out = torch.softmax(inputs[0], -1).t()
        timed.append(out.shape)
        return out
    back = lambda c, inp, out: out.t()  # noqa: E731
    timer = FakeTimer()
    suite = _tiny_suite([h.Provider("t", transposed, output=back, host_syncs=True),
                         h.Provider("t-unmapped", transposed)], baselines=())
    recs = _by_provider(h.run_suite(suite, _cfg(timer)))
    assert [r["status"] for r in recs["t"]] == [h.OK, h.OK]
    assert [r["status"] for r in recs["t-unmapped"]] == [h.FAILED, h.FAILED]
    assert "shape" in recs["t-unmapped"][0]["error"]
    # per case: "t" checked and timed, "t-unmapped" checked; every call gave its own (N, M) layout
    assert len(timed) == 3 * len(suite.shapes) and all(n > m for n, m in timed)
    assert timer.kw == {"host_syncs": True}


def test_read_bytes_sizes_the_rotation(monkeypatch):
    import dataclasses
    monkeypatch.setattr(h, "l2_bytes", lambda device: 1 << 20)
    seen = []
    op = dataclasses.replace(h.SOFTMAX, read_bytes=lambda c: seen.append(c["N"]) or (1 << 19))
    suite = dataclasses.replace(_tiny_suite([h.Provider("ours", _softmax)], baselines=()), op=op)
    recs = h.run_suite(suite, _cfg(FakeTimer()))["records"]
    assert seen and all(r["n_sets"] == h.rotation_sets(1 << 19, CPU) == 4 for r in recs)


def test_varlen_suite_end_to_end_on_cpu(tmp_path):
    """The suite's own providers on tiny CPU cases (ta.attention_varlen's Triton kernel in the
    interpreter beside the default), a wrong provider FAILED; then the writers."""
    import dataclasses

    from benchmarks import suite_varlen as sv
    wrong = h.Provider("wrong", lambda c, inp: 1.25 * inp.q)
    shapes = [dict(T=96, lo=lo, hi=hi, Hq=4, Hkv=2, D=16, causal=c) for c in (False, True)
              for lo, hi in ((8, 40), (24, 24))]
    suite = dataclasses.replace(sv.SUITE, device="cpu", shapes=shapes, quick_shapes=None,
                                providers=list(sv.SUITE.providers) + [h.varlen_attention("triton"), wrong])
    result = h.run_suite(suite, _cfg(FakeTimer()))
    recs = _by_provider(result)
    status = {name: [r["status"] for r in rs] for name, rs in recs.items()}
    ragged_nc = [r["case"]["lo"] != r["case"]["hi"] and not r["case"]["causal"] for r in recs["dense"]]
    assert status["dense"] == [h.UNSUPPORTED if x else h.OK for x in ragged_nc]
    for name in ("default", "triton", "dense-masked", "sdpa"):
        assert set(status[name]) == {h.OK}, (name, [r["error"] for r in recs[name]])
    assert set(status["flex"]) == {h.UNAVAILABLE} and set(status["wrong"]) == {h.FAILED}
    for r in recs["default"]:
        assert r["ref_dtype"] == "fp64" and r["e_ours"] <= r["tol"]
        assert r["value"] == pytest.approx(h.VARLEN.work(r["case"]) / 1e-3 / 1e12)
        assert "dense-masked" in r["ratios"] and "sdpa" in r["ratios"]
    run = _run_dict([result])
    json.loads(report.write_json(run, tmp_path / "r.json").read_text())
    png = report.plot_suite(result, run["ceilings"]["cpu"], tmp_path / "p.png")
    assert png.read_bytes()[:8] == PNG_MAGIC
    md = report.write_markdown(run, tmp_path / "r.md", {suite.name: png.name}).read_text()
    assert "| case | default |" in md and "T=96 4x24 Hq=4 Hkv=2 D=16 causal bf16" in md


def test_kvcache_suite_end_to_end_on_cpu():
    """The suite's providers on tiny CPU caches (Nk a multiple of every page size), the Triton
    kernels in the interpreter for the contiguous and one paged cache."""
    import dataclasses

    from benchmarks import suite_kvcache as sk
    shapes = [dict(B=2, Nq=nq, Nk=256, Hq=4, Hkv=2, D=16) for nq in (1, 4)]
    extra = [h.kvcache_attention(None, "triton"), h.kvcache_attention(64, "triton")]
    suite = dataclasses.replace(sk.SUITE, device="cpu", shapes=shapes, quick_shapes=None,
                                providers=list(sk.SUITE.providers) + extra)
    timer = FakeTimer()
    recs = _by_provider(h.run_suite(suite, _cfg(timer)))
    for name, rs in recs.items():
        assert {r["status"] for r in rs} == {h.OK}, (name, [r["error"] for r in rs])
    for r in recs["paged-64"]:
        assert r["value"] == pytest.approx(h.KVCACHE.work(r["case"]) / 1e-3 / 1e9)
        assert set(r["ratios"]) == {"contiguous", "sdpa"}


def test_e2e_declares_the_padded_prefill(monkeypatch):
    from benchmarks import end_to_end, suite_e2e
    s = suite_e2e.SUITE
    assert s.padded == (512, 1024, 1536, 2048) and s.pad_side == "left"
    assert "left-padded prefill" in s.describe(False)
    # the proof recognizes the kernels a masked call runs (the ext kernels), not only the dense ones
    ours, theirs = end_to_end._which(["attention_fwd_ext_kernel", "attention_decode_ext_kernel",
                                      "pytorch_flash::flash_fwd_kernel", "fmha_cutlassF_bf16"])
    assert ours == ["attention_fwd_ext_kernel", "attention_decode_ext_kernel"] and len(theirs) == 2


def test_e2e_padded_prefill_records_and_proof(monkeypatch):
    """_padded_prefill on a tiny Llama on the CPU: the mask it builds, its records, and a proof that
    fails when our kernels did not run (as on the CPU, where no Triton kernel launches)."""
    pytest.importorskip("transformers")
    from benchmarks import end_to_end
    masks = []

    class Model:
        def __init__(self, name):
            self.name = name

        def __call__(self, input_ids, attention_mask, use_cache, logits_to_keep):
            masks.append(attention_mask)
            return input_ids

    traces = {"ours": ["attention_fwd_ext_kernel", "gemm"], "theirs": ["fmha_cutlassF_bf16", "gemm"]}
    calls = []

    def kernels(fn, device):
        calls.append(fn)
        return traces["ours" if len(calls) % 2 else "theirs"]
    monkeypatch.setattr(end_to_end, "_kernels", kernels)
    suite = end_to_end.E2ESuite({}, padded=(3, 5, 8), pad_side="left")
    gen = torch.Generator().manual_seed(0)
    recs = suite._padded_prefill("m", Model("ours"), Model("theirs"), 100, (3, 5, 8), gen, 1, CPU)
    assert [r["provider"] for r in recs] == ["sdpa", "tiled_attn"] and all(r["status"] == h.OK for r in recs)
    assert recs[1]["ours_ran"] and recs[1]["ours_kernels"] == ["attention_fwd_ext_kernel"]
    assert recs[1]["label"] == "m prefill batch 3 of 3..8 left-padded to 8 (ms)"
    assert recs[1]["ratios"]["sdpa"] > 0
    assert masks[0].tolist() == [[0] * 5 + [1] * 3, [0] * 3 + [1] * 5, [1] * 8]
    traces["ours"] = ["gemm", "fmha_cutlassF_bf16"]  # torch's kernel in the tiled_attn model
    calls.clear()
    recs = suite._padded_prefill("m", Model("ours"), Model("theirs"), 100, (3, 5, 8), gen, 1, CPU)
    assert recs[0]["status"] == h.FAILED and "proof" in recs[0]["label"] and not recs[-1]["ours_ran"]


# ----------------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------------
def test_cpu_suite_end_to_end_quick(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    t0 = time.perf_counter()
    rc = cli.main(["--suite", "cpu", "--quick", "--out", str(tmp_path), "--seed", str(fresh_seed())])
    elapsed = time.perf_counter() - t0
    assert elapsed < 60, f"the quick CPU suite took {elapsed:.0f} s"
    (js,) = tmp_path.glob("*.json")
    run = json.loads(js.read_text())
    assert [s["name"] for s in run["suites"]] == ["cpu_softmax", "cpu_softmax_backward",
                                                  "cpu_attention", "cpu_decode"]
    statuses = {(s["name"], r["provider"]): r["status"] for s in run["suites"] for r in s["records"]}
    for key in [("cpu_softmax", "torch"), ("cpu_softmax", "torch.softmax"),
                ("cpu_softmax_backward", "torch"), ("cpu_attention", "torch"),
                ("cpu_attention", "sdpa"), ("cpu_decode", "torch"), ("cpu_decode", "sdpa")]:
        assert statuses[key] == h.OK, (key, statuses[key])
    # exit status 1 exactly when some provider (e.g. an interpreted Triton kernel) was wrong
    assert rc == (1 if h.FAILED in statuses.values() else 0)
    assert len(list(tmp_path.glob("*.png"))) == 4
    assert (js.with_suffix(".md")).read_text().count("| case |") >= 4


@pytest.mark.skipif(HAS_CUDA, reason="checks the message a CPU-only machine gives")
def test_gpu_suites_on_cpu_say_so(capsys):
    assert cli.main(["--suite", "attention"]) == 2
    assert "need a CUDA GPU" in capsys.readouterr().out


def test_list_runs_nothing(capsys):
    assert cli.main(["--list", "--suite", "cpu,attention", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "cpu_softmax" in out


# ----------------------------------------------------------------------------------------------
# GPU: the CUDA-graph timer, and its fallback for a provider that cannot be captured
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_timer_graph_and_fallback():
    def host_sync(case, inputs):  # .item() cannot be captured in a CUDA graph
        y = torch.softmax(inputs[0], -1)
        y.sum().item()
        return y

    suite = h.Suite(name="g", title="gpu", op=h.SOFTMAX, device="cuda",
                    shapes=[dict(M=4096, N=1024)], dtypes=("bf16",),
                    providers=[h.torch_softmax(), h.Provider("sync", host_sync)],
                    baselines=("torch.softmax",))
    cfg = h.RunConfig(device=torch.device("cuda"), timer=h.CudaTimer(1.0, 5.0),
                      ceilings={"copy_gbps": 1000.0}, seed=fresh_seed())
    recs = _by_provider(h.run_suite(suite, cfg))
    (t,), (s,) = recs["torch.softmax"], recs["sync"]
    assert t["status"] == s["status"] == h.OK
    assert t["timing"] == "cuda-graph" and s["timing"].startswith("events (graph capture failed")
    assert t["n_sets"] > 1 and t["peak_mb"] > 0 and t["value"] > 0
    # eager first (DESIGN §6): per-call events as the headline, the graph replay as a second column
    cfg.timer = h.CudaTimer(1.0, 5.0, eager_first=True)
    recs = _by_provider(h.run_suite(suite, cfg))
    (t,), (s,) = recs["torch.softmax"], recs["sync"]
    assert t["timing"] == "events" and t["graph_ms"] > 0 and t["graph_value"] > 0
    assert s["timing"].startswith("events") and not s.get("graph_ms")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_timer_host_syncs_outside_capture():
    """A provider that syncs the host in eager calls only (tiled_attn's cu_seqlens / block_table
    checks, skipped under capture) gets the graph column when it says so (Provider.host_syncs)."""
    def checks_on_host(case, inputs):
        if not torch.cuda.is_current_stream_capturing():
            assert inputs[0].isfinite().all().item()
        return torch.softmax(inputs[0], -1)

    suite = h.Suite(name="g", title="gpu", op=h.SOFTMAX, device="cuda",
                    shapes=[dict(M=4096, N=1024)], dtypes=("bf16",),
                    providers=[h.Provider("strict", checks_on_host),
                               h.Provider("syncs", checks_on_host, host_syncs=True)])
    cfg = h.RunConfig(device=torch.device("cuda"), timer=h.CudaTimer(1.0, 5.0, eager_first=True),
                      ceilings={"copy_gbps": 1000.0}, seed=fresh_seed())
    recs = _by_provider(h.run_suite(suite, cfg))
    (strict,), (syncs,) = recs["strict"], recs["syncs"]
    assert strict["status"] == syncs["status"] == h.OK
    assert not strict.get("graph_ms") and "no graph column" in strict["timing"]
    assert syncs["timing"] == "events" and syncs["graph_ms"] > 0


# ----------------------------------------------------------------------------------------------
# context parallelism (issue 17): a multi-process suite; what it plans, its records, its skip
# ----------------------------------------------------------------------------------------------
def test_context_parallel_suite_plans_and_skips_without_two_gpus():
    from benchmarks import context_parallel as cp
    from benchmarks import suite_context_parallel as scp
    assert "context_parallel" in cli.GPU_SUITES and cli._suite_names(cli.parse_args(["--suite", "cp"]), True) == [
        "context_parallel"]
    s = scp.SUITE
    assert min(scp.SEQ_LENS) <= 32768 and max(scp.SEQ_LENS) == 1 << 20 and "fwd and fwd+bwd" in s.describe(False)
    assert cp.plan_cases(scp.SEQ_LENS, s.worlds, 8) == [(w, n) for w in (1, 2, 4, 8) for n in scp.SEQ_LENS]
    assert {w for w, _ in cp.plan_cases(scp.SEQ_LENS, s.worlds, 2)} == {1, 2}
    assert cp.providers(1) == (cp.ONE_GPU, cp.SDPA) and cp.TORCH_CP in cp.providers(4)
    if torch.cuda.device_count() < 2:
        result = s.run(_cfg(FakeTimer()))
        (rec,) = result["records"]
        assert rec["status"] == h.SKIPPED and "needs >= 2 GPUs" in rec["error"] and not result["capped"]
    # scaling efficiency against one GPU × W, speed-up over torch's CP at the same W
    rows = [dict(world=1, n=65536, provider=cp.ONE_GPU, pass_="fwd", status=h.OK, ms=8.0),
            dict(world=4, n=65536, provider=cp.RING, pass_="fwd", status=h.OK, ms=2.5),
            dict(world=4, n=65536, provider=cp.TORCH_CP, pass_="fwd", status=h.OK, ms=5.0),
            dict(world=4, n=65536, provider=cp.ALLGATHER, pass_="fwd", status=h.SKIPPED, error=cp.CAPPED)]
    recs = cp._records("context_parallel", rows)
    ring = recs[1]
    assert ring["value"] == pytest.approx(65536 / 2.5e-3 / 1e6) and ring["role"] == "ours"
    assert ring["ratios"] == pytest.approx({"1 GPU × W": 0.8, cp.TORCH_CP: 2.0})
    assert cp.TORCH_CP not in recs[2]["ratios"]
    md = "\n".join(cp._markdown(recs))
    assert "| N=64k W=4 fwd | tiled_attn ring | 26.21 | 80% | 2.00× |" in md and "skipped" in md


class RoundsTimer:
    """measure() gives each provider's first round; again() the next ones, in the order called."""

    def __init__(self, rounds, ms):
        self.rounds, self.ms, self.order = rounds, ms, []

    def measure(self, call, n_sets=1, graphable=True, **kw):
        call(0)
        return h.Timing(self.ms.pop(0), 10, "events", None)

    def again(self, call, n_sets, first):
        call(0)
        self.order.append(first.ms)
        return self.ms.pop(0)


def test_eager_rounds_interleave_providers_and_take_the_median():
    """rounds − 1 more rounds per point, every provider in turn, every other round reversed (AB,
    then BA, AB, ...), the headline their median (value and ratios from it), every round kept."""
    suite = h.Suite(name="t", title="t", op=h.SOFTMAX, device="cpu", shapes=[dict(M=8, N=64)],
                    dtypes=("fp32",), providers=[h.Provider("ours", _softmax), h.torch_softmax()],
                    baselines=("torch.softmax",))
    # first rounds: ours 4, torch 1; then (torch, ours) (2, 1) and (ours, torch) (2, 3)
    timer = RoundsTimer(3, [4.0, 1.0, 2.0, 1.0, 2.0, 3.0])
    recs = _by_provider(h.run_suite(suite, _cfg(timer)))
    assert timer.order == [1.0, 4.0, 4.0, 1.0]  # torch, ours, ours, torch
    ours, torch_ = recs["ours"][0], recs["torch.softmax"][0]
    assert ours["eager_rounds_ms"] == [4.0, 1.0, 2.0] and ours["ms"] == 2.0
    assert torch_["eager_rounds_ms"] == [1.0, 2.0, 3.0] and torch_["ms"] == 2.0
    assert ours["ratios"] == {"torch.softmax": 1.0}
    assert ours["value"] == pytest.approx(2 * 8 * 64 * 4 / 2e-3 / 1e9)


def test_ws_schedule_model_backs_the_traits_comment():
    """benchmarks/model_ws_schedule.py, the model csrc/attention/sm90/flash_fwd_sm90_ws_traits.cuh cites
    for keeping long causal launches off the persistent grid: its order is WsSchedule::tile's (sections
    of pairs, query tiles last to first), and its figures are the comment's."""
    from benchmarks import model_ws_schedule as m
    assert m.persistent_order(3, 5, 2) == [2, 2, 1, 1, 0, 0] * 2 + [2, 1, 0]
    # Full launches: equal tiles, every dealing within one tile of even.
    full = m.makespans(128, 8192, 64, False)
    assert full["static"] == pytest.approx(full["one_cta_per_tile"], rel=1e-9)
    # The suite's D = 192 causal 16k point (B·H = 20): 1.23x static, 1.00x with a counter (the model's
    # D = 192 tile is the 64-key one; the 112-key tile the launch ran gives the same 1.23x).
    r = m.makespans(192, 16384, 20, True)
    assert r["section"] == 2 and r["static"] == pytest.approx(1.23, abs=0.01) and r["counter"] < 1.01
    # Up to ws_causal_persistent_m_blocks (8) query tiles a head: within 1.07x of one CTA per tile.
    for d in (64, 96, 128):
        for n in (512, 1024):
            for bh in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
                r = m.makespans(d, n, bh, True)
                assert r["m_blocks"] <= 8 and r["static"] / r["one_cta_per_tile"] <= 1.07, (d, n, bh, r)
    assert m.main([]) == 0
