"""benchmarks/sweep_triton_softmax.py on the CPU: candidates, the check that gates timing, --apply.

The timing itself needs CUDA; here the candidate lists are checked against the ladder, the check is
shown to reject wrong and NaN outputs (interpreter), a --dry-run runs end to end (~10 s), and
--apply is run on a copy of configs.py, imported, looked up and re-applied (idempotent).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import harness as h
from benchmarks import sweep_triton_softmax as sw
from benchmarks.suite_softmax import SHAPES
from tiled_attn import configs

from helpers import INTERPRET

ROOT = Path(__file__).resolve().parents[1]
# The optional fields configs.py documents for TRITON_SOFTMAX rows (its long comment).
FIELDS = {"BLOCK_M", "BLOCK_N", "BLOCK_N_STRIDED", "num_warps", "num_stages", "PROGRAMS_PER_SM",
          "MIN_TILES", "STAGES", "EVICT", "WAVES", "maxnreg", "SINGLE_PASS", "CHUNK_TILES",
          "PREFETCH", "MAX_SPIN"}


def test_candidates_on_the_ladder():
    """The H100 rule picks row / online / split as the last benchmark did; every candidate is a
    documented row of 16-64 elements per thread (short rows from 4 fp32 / 8 bf16: EPT_ROW); the
    whole sweep stays within ~560 timings."""
    defaults, total = [], 0
    for s in SHAPES:
        for dt in ("fp32", "bf16"):
            default, kernels = sw.kernels_for(s["M"], s["N"], dt, "sm90", 132)
            defaults.append(default)
            for k in kernels:
                base = sw.base_row(k, dt, s["N"])
                tiles = sw.tiles(k, dt, s["N"], base)
                assert tiles and base not in tiles
                for c in tiles + sw.switched(k, tiles[:2]):
                    assert set(c) <= FIELDS, c
                    field = "BLOCK_M" if k == "row" else "BLOCK_N"
                    width = 2 ** math.ceil(math.log2(s["N"])) if k == "row" else c.get("BLOCK_M", 1)
                    lo, hi = (sw.EPT_ROW if k == "row" and s["N"] <= sw.SHORT_ROW else sw.EPT)[dt]
                    assert lo <= c[field] * width / (32 * c["num_warps"]) <= hi, c
                total += 1 + len(tiles) + 2 * len(sw.SWITCHES[k])
    assert defaults == ["row"] * 10 + ["online"] * 2 + ["split"] * 6
    assert total <= 560  # ~500 before the short rows' small tiles (EPT_ROW) added ~30


@pytest.fixture
def table():
    saved = dict(configs.TRITON_SOFTMAX)
    yield
    sw.install({}, "cpu")
    configs.TRITON_SOFTMAX.update(saved)


@pytest.mark.skipif(not INTERPRET, reason="runs the kernels in the Triton interpreter")
def test_check_gates_timing(table, monkeypatch):
    """A candidate whose output is off or NaN is recorded FAILED and not timed."""
    timer = h.CpuTimer(0, 1, 1)
    s = sw.Shape("fp32", 4, 40, torch.device("cpu"), "cpu", timer, {"copy_gbps": 1.0}, seed=7)
    s.time_torch()
    base = sw.base_row("row", "fp32", 40)
    good = s.measure("row", base, 0)
    assert good["status"] == "ok" and good["ms"] > 0
    assert good["e_ours"] <= 2 * good["e_torch"] + torch.finfo(torch.float32).eps
    assert configs.TRITON_SOFTMAX[("row", "cpu", "fp32", 40)] == base
    real = sw.ta.softmax
    for wrong in (lambda y: y * 1.01, lambda y: y.masked_fill(y > 0.05, float("nan"))):
        monkeypatch.setattr(sw.ta, "softmax", lambda x, *a, _w=wrong, **k: _w(real(x, *a, **k)))
        bad = s.measure("row", dict(base, num_warps=2), 1)
        assert bad["status"] == "FAILED" and "ms" not in bad, bad


def _doc(records, shapes, arch="sm90"):
    return {"meta": {"date": "2026-11-23", "device": "NVIDIA H100 80GB HBM3", "arch": arch,
                     "copy_gbps": 3000.0, "seconds": 1.0, "command": "test"},
            "records": records, "shapes": shapes}


def _rec(kernel, dt, m, n, ms, cfg, phase=1, **kw):
    return dict(dtype=dt, M=m, N=n, kernel=kernel, phase=phase, any=phase == 0, cfg=cfg,
                status="ok", ms=ms, gbps=1.0, pct_copy=1.0, vs_torch=1.0, **kw)


def _load(path):
    spec = importlib.util.spec_from_file_location("_applied_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_apply(tmp_path):
    any_row = lambda k, dt, n: configs.triton_softmax_config(k, "any", dt, n)  # noqa: E731
    row1k = dict(any_row("row", "bf16", 1024), BLOCK_M=8, num_warps=8, STAGES=2)
    sync = dict(any_row("split_sync", "bf16", 1 << 20), BLOCK_N=4096, maxnreg=0, PREFETCH=True)
    split_any = {k: v for k, v in any_row("split", "bf16", 1 << 20).items() if k != "SINGLE_PASS"}
    single = dict(split_any, SINGLE_PASS=True)
    records = [
        _rec("row", "bf16", 32768, 1024, 1.00, any_row("row", "bf16", 1024), phase=0),
        _rec("row", "bf16", 32768, 1024, 0.90, row1k),                       # 11% faster: applied
        _rec("row", "fp32", 32768, 1024, 1.00, any_row("row", "fp32", 1024), phase=0),
        _rec("row", "fp32", 32768, 1024, 0.98, dict(any_row("row", "fp32", 1024), EVICT=True)),
        _rec("split", "bf16", 64, 1 << 20, 1.00, split_any, phase=0),
        _rec("split", "bf16", 64, 1 << 20, 0.95, dict(split_any, PROGRAMS_PER_SM=8)),
        _rec("split1", "bf16", 64, 1 << 20, 0.70, sync, split_row=single),
        _rec("split", "bf16", 512, 1 << 17, 1.00, split_any, phase=0),
        _rec("online", "bf16", 512, 1 << 17, 1.00, any_row("online", "bf16", 1 << 17), phase=0),
        _rec("split1", "bf16", 512, 1 << 17, 0.99, sync, split_row=single),
    ]
    shapes = [dict(dtype=dt, M=m, N=n, default_kernel=d, torch_ms=1.0, torch_gbps=1.0)
              for dt, m, n, d in [("bf16", 32768, 1024, "row"), ("fp32", 32768, 1024, "row"),
                                  ("bf16", 64, 1 << 20, "split"), ("bf16", 512, 1 << 17, "online")]]
    (tmp_path / "tiled_attn").mkdir()
    target = tmp_path / "tiled_attn" / "configs.py"
    shutil.copy(ROOT / "tiled_attn" / "configs.py", target)
    before = target.read_text()
    doc = tmp_path / "sweep.json"
    doc.write_text(json.dumps(_doc(records, shapes)))
    sw.apply(doc, tmp_path)
    once = target.read_text()
    sw.apply(doc, tmp_path)
    assert target.read_text() == once  # idempotent
    mod = _load(target)
    get = mod.triton_softmax_config
    assert get("row", "sm90", "bf16", 1024) == row1k == get("row", "sm90", "fp16", 1000)
    # below the largest applied class the "any" rows still answer; above it the "any" table does
    for n in (32, 128, 512, 2048, 32768):
        assert get("row", "sm90", "bf16", n) == any_row("row", "bf16", n)
    assert get("row", "sm90", "fp32", 1024) == any_row("row", "fp32", 1024)  # 2%: not applied
    split = get("split", "sm90", "bf16", 1 << 20)
    assert split == dict(split_any, PROGRAMS_PER_SM=8, SINGLE_PASS=True)
    assert "maxnreg" not in get("split_sync", "sm90", "bf16", 1 << 20)
    assert get("split_sync", "sm90", "fp16", 1 << 20)["PREFETCH"]
    assert not get("split", "sm90", "bf16", 1 << 17).get("SINGLE_PASS")  # 1% only: the "any" row
    # nothing else in the file moved: the old block and the hand-written sm90 rows whose keys the
    # new block redefines go; other hand rows (the open-ended ones) stay and still answer
    block = once[once.index(sw.BEGIN):once.index(sw.END) + len(sw.END) + 1]
    old_block = re.compile(re.escape(sw.BEGIN) + r".*?" + re.escape(sw.END) + r"\n", re.S)
    loose = re.compile(r'(?m)^ *(\("(row|online|split|split_sync)", "sm90", "\w+", \w+\)).*\n')
    redefined = {m[1] for m in loose.finditer(block)}
    expected = loose.sub(lambda m: "" if m[1] in redefined else m[0], old_block.sub("", before))
    assert once.replace(block, "") == expected and "2026-11-23" in block and ">= 3%" in block
    kept = [m[1] for m in loose.finditer(expected)]
    assert all(k not in redefined for k in kept)
    # above the block's largest class: the kept hand rows where there are any, else the "any" table
    (tmp_path / "expected.py").write_text(expected)
    hand = _load(tmp_path / "expected.py").triton_softmax_config
    for dt in ("bf16", "fp32"):
        assert get("split", "sm90", dt, 1 << 22) == hand("split", "sm90", dt, 1 << 22)
    assert hand("split", "any", "bf16", 1 << 22) == any_row("split", "bf16", 1 << 22)
    # a sweep without winners leaves an empty block; a non-sm90 sweep is refused
    doc.write_text(json.dumps(_doc(records[:1], shapes[:1])))
    sw.apply(doc, tmp_path)
    assert ("row", "sm90", "bf16", 1024) not in _load(target).TRITON_SOFTMAX
    doc.write_text(json.dumps(_doc(records, shapes, arch="sm80")))
    with pytest.raises(SystemExit, match="sm80"):
        sw.apply(doc, tmp_path)


def test_dry_run_end_to_end(tmp_path):
    """--dry-run (interpreter, tiny shapes: row, online, split) checks and 'times' every kernel's
    candidates through ta.softmax and writes sweep.json / sweep.md that --apply accepts."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep_triton_softmax.py"),
                           "--dry-run", "--out", str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    doc = json.loads((tmp_path / "out" / "sweep.json").read_text())
    ok = {(r["kernel"], r["phase"]) for r in doc["records"] if r["status"] == "ok"}
    assert {(k, p) for k in ("row", "online", "split", "split1") for p in (0, 1, 2)} <= ok
    assert "| shape |" in (tmp_path / "out" / "sweep.md").read_text()
    (tmp_path / "tiled_attn").mkdir()
    shutil.copy(ROOT / "tiled_attn" / "configs.py", tmp_path / "tiled_attn")
    lines = sw.apply(tmp_path / "out" / "sweep.json", tmp_path, allow_any_arch=True)
    assert lines[0].startswith(sw.BEGIN)
    _load(tmp_path / "tiled_attn" / "configs.py")
