"""tiled_attn/softmax_select.py (backend=None's measured choice, issue 16) and its tuning script
benchmarks/sweep_softmax_random.py, on the CPU: the selection is pure and deterministic, is today's
choice without a table, follows a table's dtype/layout/pool/N/M boundaries, never names a kernel that
cannot take the row; the shape sets meet the issue; the fit, --dry-run, a miniature run and --apply."""
import importlib.util
import itertools
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks import harness as h
from benchmarks import suite_softmax_random
from benchmarks import sweep_softmax_random as sw
from helpers import HAS_CUDA, INTERPRET
from tiled_attn import configs, softmax_select

ROOT = Path(__file__).resolve().parents[1]
INF = float("inf")
ALL = [(b, k) for b in ("triton", "cuda") for k in (None, *sw.ta.softmax_kernels(b))]


@pytest.fixture
def table(monkeypatch):
    """configs.SOFTMAX_SELECT replaced for one test (restored after; plans are cleared both ways),
    its rows applying at every size (the tests' tables speak for small shapes too)."""
    monkeypatch.setattr(configs, "SOFTMAX_SELECT_MIN_ELEMS", 0)
    saved = dict(configs.SOFTMAX_SELECT)

    def put(rows: dict):
        configs.SOFTMAX_SELECT.clear()
        configs.SOFTMAX_SELECT.update(rows)
    put({})
    yield put
    put(saved)


def _grid():
    return itertools.product((1, 7, 4096, 1 << 20), (1, 31, 1024, 32769, 1 << 22, (1 << 31) + 17),
                             (torch.float32, torch.bfloat16, torch.float16), (True, False),
                             ("sm90", "sm80"), (True, False), (False, True))


# ------------------------------------------------------------------------------------------------
# the selection
# ------------------------------------------------------------------------------------------------
def test_empty_table_is_todays_choice(table, monkeypatch):
    for default in ("triton", "cuda"):
        monkeypatch.setitem(configs.DEFAULT_BACKEND, ("softmax", "cuda"), default)
        for m, n, dtype, contig, arch, cuda_ok, log in _grid():
            want = ("cuda" if default == "cuda" and cuda_ok and not log else "triton", None)
            assert softmax_select.select(m, n, dtype, contig, arch, cuda_ok, log) == want


def test_a_models_rows_come_before_its_archs(table):
    h200, sm90 = ((1 << 30, 1, "triton", "row"),), ((1 << 30, 1, "cuda", "warp_row"),)
    table({("sm90:h200", "fp32", "contig", "all"): h200, ("sm90", "fp32", "contig", "all"): sm90,
           ("sm90", "bf16", "contig", "all"): sm90})
    sel = softmax_select.select
    assert sel(8, 100, torch.float32, True, "sm90:h200", True) == ("triton", "row")
    assert sel(8, 100, torch.float32, True, "sm90:h100", True) == ("cuda", "warp_row")  # no rows: its arch's
    assert sel(8, 100, torch.float32, True, "sm90", True) == ("cuda", "warp_row")
    assert sel(8, 100, torch.bfloat16, True, "sm90:h200", True) == ("cuda", "warp_row")  # a key it lacks
    assert softmax_select.max_n("triton", "row", "sm90:h200", "fp32") == softmax_select.max_n("triton", "row", "sm90", "fp32")


def test_model_key_and_arch():
    assert configs.model_key("NVIDIA H100 80GB HBM3") == "h100"
    assert configs.model_key("NVIDIA H200") == "h200"
    assert configs.model_key("NVIDIA GeForce RTX 4090") == "4090"
    assert configs.base_arch("sm90:h200") == configs.base_arch("sm90") == "sm90"
    assert configs.model_arch(torch.device("cpu")) == "cpu"


def test_the_shipped_table_only_names_usable_kernels():
    # Whatever --apply wrote: every row's kernel takes every N up to its n_max, "triton" pools hold
    # Triton rows only, rows are sorted by n_max.
    for (arch, dt, layout, pool), rows in configs.SOFTMAX_SELECT.items():
        assert layout in ("contig", "strided") and pool in ("all", "triton") and dt in ("fp32", "bf16", "fp16")
        assert [r[0] for r in rows] == sorted(r[0] for r in rows)
        for n_max, m_min, backend, kernel in rows:
            assert (backend, kernel) in ALL and m_min >= 1
            assert pool == "all" or backend == "triton"
            assert n_max <= softmax_select.max_n(backend, kernel, arch, dt)


def test_pure_and_deterministic(table, monkeypatch):
    table({("sm90", "fp32", "contig", "all"): ((1024, 1, "cuda", "warp_row"), (1 << 25, 1, "triton", "split"))})

    def no_device(*a, **k):
        raise AssertionError("select() read the device")
    for name in ("get_device_properties", "get_device_capability", "current_device", "is_available"):
        monkeypatch.setattr(torch.cuda, name, no_device)
    answers = [softmax_select.select(*args) for args in _grid()]
    assert answers == [softmax_select.select(*args) for args in _grid()]
    assert softmax_select.select(8, 1000, torch.float32, True, "sm90", True) == ("cuda", "warp_row")
    assert softmax_select.select(8, 1000, "fp32", True, "sm90", True) == ("cuda", "warp_row")


def test_boundaries_of_a_table(table):
    table({
        ("sm90", "fp32", "contig", "all"): ((1024, 1, "cuda", "warp_row"),
                                            (65536, 300, "triton", "online"), (65536, 1, "triton", "split"),
                                            (1 << 25, 1, "cuda", "split_row")),
        ("sm90", "fp32", "contig", "triton"): ((32768, 1, "triton", "row"), (1 << 25, 1, "triton", "split")),
        ("sm90", "bf16", "strided", "all"): ((4096, 1, "cuda", "tile2d"),),
    })
    sel = softmax_select.select
    assert sel(5, 1024, torch.float32, True, "sm90", True) == ("cuda", "warp_row")
    assert sel(5, 1025, torch.float32, True, "sm90", True) == ("triton", "split")     # M < 300
    assert sel(300, 1025, torch.float32, True, "sm90", True) == ("triton", "online")  # M >= 300
    assert sel(299, 65536, torch.float32, True, "sm90", True) == ("triton", "split")
    assert sel(1, 65537, torch.float32, True, "sm90", True) == ("cuda", "split_row")
    assert sel(1, (1 << 25) + 1, torch.float32, True, "sm90", True) == ("triton", None)  # past the rows
    # no CUDA extension, or log_softmax: the "triton" pool
    assert sel(5, 1000, torch.float32, True, "sm90", False) == ("triton", "row")
    assert sel(5, 1000, torch.float32, True, "sm90", True, True) == ("triton", "row")
    assert sel(5, 40000, torch.float32, True, "sm90", False) == ("triton", "split")
    # dtype, layout and arch are keys of their own
    assert sel(5, 1000, torch.bfloat16, True, "sm90", True) == ("triton", None)
    assert sel(5, 1000, torch.float32, False, "sm90", True) == ("triton", None)
    assert sel(5, 1000, torch.float32, True, "sm80", True) == ("triton", None)
    assert sel(5, 4096, torch.bfloat16, False, "sm90", True) == ("cuda", "tile2d")
    assert sel(5, 4097, torch.bfloat16, False, "sm90", True) == ("triton", None)
    assert sel(5, 4096, torch.bfloat16, False, "sm90", False) == ("triton", None)  # no triton rows
    assert sel(0, 1000, torch.float32, True, "sm90", True) == ("triton", None)   # an empty tensor


def _header_constants():
    text = (ROOT / "csrc" / "softmax" / "softmax.h").read_text() + \
        (ROOT / "csrc" / "softmax" / "block_row_smem.cu").read_text()
    return {k: int(v) for k, v in re.findall(r"constexpr int (k\w+) = (\d+);", text)}


def test_kernel_limits_are_the_codes():
    c = _header_constants()
    assert softmax_select.max_n("cuda", "block_row_reg", "sm90", "bf16") == \
        c["kMaxThreads"] * c["kBlockRowRegMaxColsPerThreadScalar"]
    per_cta = (227 * 1024 - c["kStaticSmemReserve"]) // 16 * 16  # sm_90's opt-in shared memory
    for dt, size in (("fp32", 4), ("bf16", 2), ("fp16", 2)):
        assert softmax_select.max_n("cuda", "block_row_smem", "sm90", dt) == per_cta // size * c["kMaxCluster"]
        assert softmax_select.max_n("cuda", "block_row_smem", "sm80", dt) == 0  # not known offline
        for arch in ("sm90", "any", "cpu"):
            top = softmax_select.max_n("triton", "row", arch, dt)
            configs.triton_softmax_config("row", arch, dt, int(top))  # takes its limit
            with pytest.raises(KeyError):
                configs.triton_softmax_config("row", arch, dt, int(top) + 1)
    assert softmax_select.max_n("cuda", "flat_rows", "sm90", "fp32") == c["kFlatRowsMaxCols"]
    for b, k in ALL:
        if (b, k) not in (("triton", "row"), ("cuda", "block_row_reg"), ("cuda", "block_row_smem"),
                          ("cuda", "flat_rows")):
            assert softmax_select.max_n(b, k, "sm90", "fp32") == INF


def test_never_a_kernel_past_its_limit(table):
    # Every kernel as the answer for every N up to 2^40, in every pool: the row kernels beyond their
    # limits hand the row to their backend's own rule.
    for b, k in ALL:
        table({(a, dt, lay, pool): ((1 << 40, 1, b, k),) for a in ("sm90", "sm80") for dt in ("fp32", "bf16")
               for lay in ("contig", "strided") for pool in ("all", "triton")})
        for m, n, dtype, contig, arch, cuda_ok, log in _grid():
            got_b, got_k = softmax_select.select(m, n, dtype, contig, arch, cuda_ok, log)
            assert got_b == "triton" or (cuda_ok and not log)
            if got_k is not None:
                assert n <= softmax_select.max_n(got_b, got_k, arch, dtype)


def test_flat_rows_rows_apply_to_misaligned_rows_only(table):
    """An aligned row (N·size a multiple of 16 bytes) passes a flat_rows row of the table to the
    next one; any other row takes it."""
    table({("sm90", dt, "contig", "all"): ((100, 1, "cuda", "flat_rows"), (1 << 20, 1, "triton", "row"))
           for dt in ("fp32", "bf16")})
    for dtype, aligned, odd in ((torch.float32, (4, 32, 100), (3, 23, 62)), (torch.bfloat16, (8, 32, 96), (4, 23, 62))):
        for n in aligned:
            assert softmax_select.select(1000, n, dtype, True, "sm90", True) == ("triton", "row"), (dtype, n)
        for n in odd:
            assert softmax_select.select(1000, n, dtype, True, "sm90", True) == ("cuda", "flat_rows"), (dtype, n)
            # rows with gaps between them (a slice of wider rows): flat_rows would copy them element-wise
            assert softmax_select.select(1000, n, dtype, True, "sm90", True, packed=False) == ("triton", "row")


def test_for_tensor_reads_shape_layout_and_device(table, monkeypatch):
    monkeypatch.setattr(softmax_select, "select", lambda *a: a)
    x = torch.empty(3, 5, 7)
    m, n, dtype, contig, arch, cuda_ok, log, packed = softmax_select.for_tensor(x, 1)
    assert (m, n, dtype, contig, arch, log, packed) == (21, 5, torch.float32, False, "cpu", False, False)
    got = softmax_select.for_tensor(x, 2, True)  # cuda_ok (got[5]) is the machine's
    assert got[:5] + got[6:] == (15, 7, torch.float32, True, "cpu", True, True)
    assert softmax_select.for_tensor(x, 1, contiguous=True)[3::4] == (True, True)  # copied into order
    assert softmax_select.for_tensor(x[:, :, :6], 2)[3::4] == (True, False)  # rows with a gap


# ------------------------------------------------------------------------------------------------
# the shape sets (issue 16, must show 1)
# ------------------------------------------------------------------------------------------------
def test_random_shape_sets_meet_the_issue():
    sweep, held = h.random_softmax_sets()
    assert (sweep, held) == h.random_softmax_sets()  # fixed seeds
    lo, hi = h.RANDOM_SOFTMAX["elems"]
    for shapes, least in ((sweep, 60), (held, 30)):
        ns = [s["N"] for s in shapes]
        assert len(set(ns)) == len(ns) >= least
        assert sum(n & (n - 1) != 0 for n in ns) >= len(ns) / 2
        assert all(1 <= s["N"] <= 1 << 25 and s["M"] >= 1 and lo <= s["M"] * s["N"] <= hi for s in shapes)
        # log-uniform: every quarter of [0, 25] in log2 N holds some lengths
        assert {min(3, int(math.log2(n) / 6.25)) for n in ns} == {0, 1, 2, 3}
    assert not {s["N"] for s in sweep} & {s["N"] for s in held}
    sizes = [math.log2(s["M"] * s["N"]) for s in sweep]
    assert min(sizes) < 22 and max(sizes) > 26  # M·N spans the range
    assert suite_softmax_random.SHAPES == held and set(map(str, suite_softmax_random.QUICK)) <= set(map(str, held))
    assert suite_softmax_random.SUITE.dtypes == ("fp32", "bf16")


# ------------------------------------------------------------------------------------------------
# the fit
# ------------------------------------------------------------------------------------------------
def _points(fn, ns, ms=None):
    return [dict(n=n, m=(ms or {}).get(n, 100), times=fn(n, (ms or {}).get(n, 100)), torch=1.0)
            for n in ns]


def _limit(c):
    return 32768 if c == "triton:row" else INF


def test_fit_finds_a_boundary_at_a_power_of_two():
    ns = [3, 40, 300, 900, 1300, 5000, 70000, 10 ** 6]
    pts = _points(lambda n, m: {"cuda:warp_row": 0.5 if n <= 1000 else 2.0, "triton:split": 1.0}, ns)
    rows, chosen = sw.fit_rows(pts, ["cuda:warp_row", "triton:split"], _limit, top=1 << 25)
    assert rows == [(1024, 1, "cuda:warp_row"), (1 << 25, 1, "triton:split")]
    assert chosen == ["cuda:warp_row"] * 4 + ["triton:split"] * 4


def test_fit_splits_on_rows_where_it_pays():
    ns = [1000 + 7 * i for i in range(10)]
    ms = {n: (10 if i % 2 else 5000) for i, n in enumerate(ns)}
    pts = _points(lambda n, m: {"triton:split": 1.0 if m < 100 else 3.0, "triton:online": 2.0 if m < 100 else 1.0},
                  ns, ms)
    rows, chosen = sw.fit_rows(pts, ["triton:online", "triton:split"], _limit, top=1 << 25)
    assert rows == [(1 << 25, 223, "triton:online"), (1 << 25, 1, "triton:split")]  # 223 = isqrt(10·5000)
    assert all(c == ("triton:online" if ms[n] > 100 else "triton:split") for n, c in zip(ns, chosen))


def test_fit_respects_kernel_limits_and_missing_times():
    # row is fastest everywhere but takes rows up to 32768: past that, or where it was not timed
    # (unsupported), something else; the last row may stop at row's limit when the data does.
    ns = [100, 2000, 30000, 40000, 10 ** 6]
    pts = _points(lambda n, m: {"triton:row": 0.5, "triton:online": 1.0} if n != 2000 else {"triton:online": 1.0}, ns)
    rows, chosen = sw.fit_rows(pts, ["triton:online", "triton:row"], _limit, top=1 << 25)
    assert chosen[1] == "triton:online" and chosen[3:] == ["triton:online"] * 2
    for (n_max, _, c), prev in zip(rows, [(0,)] + rows):
        assert n_max <= _limit(c)
    pts = _points(lambda n, m: {"triton:row": 0.5, "triton:online": 1.0}, [100, 2000, 30000])
    rows, _ = sw.fit_rows(pts, ["triton:online", "triton:row"], _limit, top=1 << 25)
    assert rows == [(32768, 1, "triton:row")]  # N past 32768: unmeasured, the old choice


def test_fit_prefers_a_backends_own_rule_to_its_twin():
    # "cuda" (its own rule) runs block_row_smem here: within noise of it, the rule is kept (it
    # carries the few-rows switch to shapes the sweep did not draw); 3% faster pinned wins.
    ns = [9000, 20000, 50000, 100000]
    for pinned, want in ((0.995, "cuda"), (0.97, "cuda:block_row_smem")):
        pts = _points(lambda n, m: {"cuda": 1.0, "cuda:block_row_smem": pinned, "triton": 1.5}, ns)
        rows, _ = sw.fit_rows(pts, ["cuda", "cuda:block_row_smem", "triton"], lambda c: INF, top=1 << 25,
                              prior=lambda c: sw.PINNED if ":" in c else 0.0)
        assert rows == [(1 << 25, 1, want)]
    assert sw.parse_cand("cuda") == ("cuda", None) and sw.parse_cand("triton:row") == ("triton", "row")
    assert sw.cand_name("cuda", None) == "cuda"


def test_fit_is_deterministic_and_noise_does_not_split():
    import random
    rng = random.Random(5)
    ns = sorted(rng.sample(range(1, 1 << 20), 40))
    noisy = {n: {"a:x": 1.0 + rng.uniform(-0.02, 0.02), "b:y": 1.0 + rng.uniform(-0.02, 0.02)} for n in ns}
    pts = _points(lambda n, m: noisy[n], ns)
    one = sw.fit_rows(pts, ["a:x", "b:y"], lambda c: INF, top=1 << 25)
    assert one == sw.fit_rows(pts, ["a:x", "b:y"], lambda c: INF, top=1 << 25)
    assert len(one[0]) == 1


# ------------------------------------------------------------------------------------------------
# the script: --dry-run, a CPU miniature, --apply
# ------------------------------------------------------------------------------------------------
def test_dry_run_prints_plan_and_estimate(capsys):
    assert sw.main(["--dry-run", "--jobs", "12", "--no-ladder"]) == 0
    assert "sweep: 64 shapes" in capsys.readouterr().out
    assert sw.main(["--dry-run", "--jobs", "12"]) == 0
    out = capsys.readouterr().out
    # the 64 random shapes and the benchmark ladder's 9 (none of them among the random ones)
    assert "sweep: 73 shapes" in out and "held-out: 32 shapes" in out
    est = re.search(r"~(\d+) Triton compiles .* ~(\d+) s in all", out)
    assert est and 100 < int(est[1]) < 2000 and int(est[2]) < 400
    every = set(sw.all_kernels())
    assert every == {b if k is None else f"{b}:{k}" for b, k in ALL} and all(k in out for k in every)
    assert sw.pick_kernels("triton:*,cuda:warp_row") == ["triton:row", "triton:online", "triton:split",
                                                         "cuda:warp_row"]


def test_compile_count_follows_the_specializations():
    jobs = [("fp32", 10, 1000, "contig", ("row", "online")), ("fp32", 10, 1001, "contig", ("row", "online")),
            ("fp32", 10, 1008, "contig", ("row", "online")), ("bf16", 10, 1000, "contig", ("row", "split"))]
    # row: 1024 masked x {1000, 1001: not /16; 1008: /16} -> 2 in fp32, 1 in bf16; online: 2 (fp32
    # aligned or not); split: 1.5
    assert sw.compile_count(jobs) == 2 + 1 + 2 + 1.5


def test_block_lines_are_the_table_as_python():
    table = {("sm90", "bf16", "contig", "all"): ((1024, 1, "cuda", "warp_row"), (8192, 5000, "triton", None),
                                                 (8192, 1, "cuda", None), (1 << 25, 1, "triton", "split"))}
    doc = dict(meta=dict(date="d", device="x", copy_gbps=3000.0, points=64, dtypes=["bf16"]),
               table=sw.table_to_json(table), fit_report=[])
    lines = sw.block_lines(doc)
    assert lines[0].startswith(sw.BEGIN) and lines[-1] == sw.END
    assert eval("{\n" + "\n".join(lines) + "\n}") == table
    assert sw.table_from_json(json.loads(json.dumps(doc["table"]))) == table


def test_apply_writes_a_models_block_before_its_archs(tmp_path):
    """A GPU model's fit ("sm90:h200") gets its own block, ahead of the arch's, which stays: the
    rows measured on the arch's other models keep serving them."""
    root = tmp_path / "repo"
    (root / "tiled_attn").mkdir(parents=True)
    shutil.copy(ROOT / "tiled_attn" / "configs.py", root / "tiled_attn" / "configs.py")
    # a model the shipped table has no block for (an H200's would be replaced, not added)
    table = {("sm90:x100", "bf16", "contig", "all"): ((1024, 1, "triton", "row"), (1 << 25, 1, "cuda", None))}
    doc = dict(meta=dict(date="d", device="NVIDIA X100", arch="sm90", key="sm90:x100", copy_gbps=4000.0,
                         points=64, dtypes=["bf16"]), table=sw.table_to_json(table), fit_report=[])
    (tmp_path / "sweep.json").write_text(json.dumps(doc))
    lines = sw.apply(tmp_path / "sweep.json", root)
    begin, end = sw.markers("sm90:x100")
    assert lines[0].startswith(begin) and lines[-1] == end and begin != sw.BEGIN
    first = (root / "tiled_attn" / "configs.py").read_text()
    sw.apply(tmp_path / "sweep.json", root)
    assert (root / "tiled_attn" / "configs.py").read_text() == first  # replaced, not added again
    assert first.count(begin) == 1 and first.count(sw.BEGIN) == 1 and first.index(begin) < first.index(sw.BEGIN)
    mod = _load_configs(root / "tiled_attn" / "configs.py")
    assert dict(mod.SOFTMAX_SELECT) == {**configs.SOFTMAX_SELECT, **table}


def _load_configs(path: Path):
    spec = importlib.util.spec_from_file_location("_select_target_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The smoke run and the dispatcher test below run Triton kernels on CPU tensors: the interpreter
# only. On a GPU machine (no TRITON_INTERPRET) their launches have no device to run on (seen on the
# H200, 2026-11-26: nothing measured, and a launch that retried forever); the GPU runs the real sweep.
CPU_ONLY = pytest.mark.skipif(HAS_CUDA and not INTERPRET, reason="Triton kernels on CPU tensors: the interpreter only")


@CPU_ONLY
def test_smoke_run_fit_heldout_and_apply(tmp_path, table, capsys):
    saved = dict(configs.SOFTMAX_SELECT)
    out = tmp_path / "out"
    assert sw.main(["--smoke", "--out", str(out), "--dtypes", "fp32", "--kernels", "triton*"]) == 0
    assert dict(configs.SOFTMAX_SELECT) == saved  # the run's table was in place only while it ran
    doc = json.loads((out / "sweep.json").read_text())
    held = json.loads((out / "heldout.json").read_text())
    assert {s["N"] for s in doc["shapes"]["sweep"]}.isdisjoint({s["N"] for s in doc["shapes"]["heldout"]})
    provs = {r["provider"] for r in doc["records"]}
    assert {"triton", "triton:row", "triton:online", "triton:split", "default", "torch.softmax"} <= provs
    assert all(r["status"] == h.OK for r in doc["records"])
    fitted = sw.table_from_json(doc["table"])
    assert list(fitted) == [("cpu", "fp32", "contig", "triton")]
    assert {r["provider"] for r in held["records"]} >= {"selected", "default", "torch.softmax"}
    assert held["summary"]["cases"] == 2 and (out / "summary.md").is_file()
    # --apply into a copy of configs.py: the rows land between the markers, once, and load
    root = tmp_path / "repo"
    (root / "tiled_attn").mkdir(parents=True)
    shutil.copy(ROOT / "tiled_attn" / "configs.py", root / "tiled_attn" / "configs.py")
    with pytest.raises(SystemExit):
        sw.apply(out / "sweep.json", root)  # measured on the CPU, not the H100
    sw.apply(out / "sweep.json", root, allow_any_arch=True)
    first = (root / "tiled_attn" / "configs.py").read_text()
    sw.apply(out / "sweep.json", root, allow_any_arch=True)
    assert (root / "tiled_attn" / "configs.py").read_text() == first
    assert first.count(sw.BEGIN) == 1
    mod = _load_configs(root / "tiled_attn" / "configs.py")
    # the arch's block replaced; the GPU models' blocks ("sm90:h200") stay
    assert {k: v for k, v in mod.SOFTMAX_SELECT.items() if ":" not in k[0]} == fitted
    # and select() answers from it as the run's 'selected' provider did
    table(fitted)
    for r in held["records"]:
        if r["provider"] == "selected":
            c = r["case"]
            b, k = softmax_select.select(c["M"], c["N"], "fp32", True, "cpu", False)
            assert b == "triton" and (k is None or k in ("row", "online", "split"))


# ------------------------------------------------------------------------------------------------
# backend=None through the selection (tiled_attn/softmax.py's _pick), on the CPU: the dispatcher
# is made to take its CUDA branch (the Triton interpreter runs the kernels)
# ------------------------------------------------------------------------------------------------
SM = importlib.import_module("tiled_attn.softmax")  # the module (tiled_attn.softmax is the function)


@CPU_ONLY
def test_backend_none_follows_the_selection(table, monkeypatch):
    sm = SM
    real = sm._resolve

    def resolve(x, dim, backend, kernel, log=False):
        d, b = real(x, dim, backend, kernel, log)
        return d, "triton" if b == sm.NATIVE else b
    monkeypatch.setattr(sm, "_resolve", resolve)
    table({("cpu", "fp32", "contig", "triton"): ((64, 1, "triton", "online"),),
           ("cpu", "fp32", "strided", "triton"): ((64, 1, "triton", "split"),)})
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    for log, ref in ((False, torch.softmax), (True, torch.log_softmax)):
        plan = sm._plan_for(x, 1, None, None, log)
        assert (plan.backend, plan.kernel) == ("triton", "online")
        fn = sw.ta.log_softmax if log else sw.ta.softmax
        torch.testing.assert_close(fn(x), ref(x, -1))
        xg = x.clone().requires_grad_()  # autograd runs the plan's kernel, its backward the backend's
        fn(xg).sum().backward()
        want = x.clone().requires_grad_()
        ref(want, -1).sum().backward()
        torch.testing.assert_close(xg.grad, want.grad)
    assert sm._plan_for(torch.randn(3, 100), 1, None, None).kernel is None       # past the rows
    assert sm._plan_for(torch.randn(40, 3).t(), 1, None, None).kernel == "split"  # strided rows
    assert sm._plan_for(torch.randn(3, 5, 7), 1, None, None).kernel == "online"  # rows copied first
    assert sm._plan_for(x, 1, "triton", None).kernel is None                   # a pinned backend


def test_selection_traces_as_a_constant():
    """torch.compile(fullgraph) traces backend=None's kernel choice (on CUDA, softmax._pick calls it
    while tracing): the extension check and device properties it reads are not traceable, so the
    choice is a constant of the graph, the same as the eager one (5 compile tests failed on the
    H200 before, 2026-11-26)."""
    x = torch.randn(2, 64, 11).permute(0, 2, 1)
    torch._dynamo.reset()
    try:
        traced = torch.compile(lambda t: softmax_select.for_tensor(t, 1), fullgraph=True, backend="eager")
        assert traced(x) == softmax_select.for_tensor(x, 1)
    finally:
        torch._dynamo.reset()


def test_no_row_below_the_measured_sizes(table):
    """Below configs.SOFTMAX_SELECT_MIN_ELEMS (the sweep's smallest M·N) the rows do not apply: the
    old choice stands (host-bound calls, where Triton's launch is the cheaper)."""
    table({("sm90", "fp32", "contig", "all"): ((1024, 1, "cuda", "warp_row"),)})
    configs.SOFTMAX_SELECT_MIN_ELEMS = 1 << 20  # the fixture's monkeypatch restores it
    sel = softmax_select.select
    assert sel(1023, 1024, torch.float32, True, "sm90", True) == softmax_select.today(True)
    assert sel(1024, 1024, torch.float32, True, "sm90", True) == ("cuda", "warp_row")
