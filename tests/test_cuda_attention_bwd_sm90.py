"""The wgmma attention backward (csrc/attention/sm90/flash_bwd_sm90_kernel.cuh, sm_90a) on a machine
without a GPU: the kernel, unchanged, runs in tests/emulation/flash_bwd_sm90_emulator.cpp (every CUDA
thread a CPU fiber; wgmma with MN-major A and N = 32, mbarrier phases, TMA boxes and reduce-adds, named
barriers (bar.sync / bar.arrive: the dQ writer warp's hand-off), setmaxnreg's register pool, and the
shared-memory race / proxy checks emulated from the PTX ISA: sm90_emu.h,
emu_common.h) through its entry attention_bwd_sm90, against a float64 reference of dq (from the
dq_accum it adds to), dk and dv on ragged sizes, causal offsets (rows with no key), GQA / MQA and a
negative scale; every dk / dv element written, nothing written outside them. A few seconds per head dim.
The shipped kernel (the dQ writer warp) and its A/B variant without it (TILED_ATTN_BWD_DQ_WRITER=0).
The emulator's own test: planted synchronization bugs fail it.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess

import pytest

from helpers import build_attention_emulator, fresh_seed, reproduce_hint, run_attention_emulator

SM90 = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "attention" / "sm90"
HEAD_DIMS = (64, 128)  # the emulator's cases (flash_bwd_sm90_emulator.cpp main)


def test_emulated_head_dims_are_the_instantiated_ones():
    """A head dim added to the entry (BwdHeadDims, flash_bwd_sm90_hdim*.cu) needs cases in the emulator."""
    m = re.search(r"BwdHeadDims = flash_fwd::HeadDims<([\d, ]+)>", (SM90 / "flash_bwd_sm90.cu").read_text())
    assert m, "BwdHeadDims's definition changed: update this test"
    assert tuple(int(d) for d in m.group(1).split(",")) == HEAD_DIMS
    files = sorted(int(p.stem.removeprefix("flash_bwd_sm90_hdim")) for p in SM90.glob("flash_bwd_sm90_hdim*.cu"))
    assert tuple(files) == HEAD_DIMS


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> pathlib.Path:
    return build_attention_emulator("flash_bwd_sm90_emulator", tmp_path_factory.mktemp("emu_bwd"))


@pytest.fixture(scope="module")
def emulator_no_writer(tmp_path_factory) -> pathlib.Path:
    return build_attention_emulator("flash_bwd_sm90_emulator", tmp_path_factory.mktemp("emu_bwd_nw"),
                                    defines=("TILED_ATTN_BWD_DQ_WRITER=0",))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_backward_kernel_in_the_emulator(emulator, head_dim):
    """Eight cases per tile: block_m 64, and at D = 64 also 128; two more with float32 dK / dV
    (BwdParams::dkv_f32, the shipped tile), and two with the GQA group split among CTAs (kv_split:
    float32 partials, summed by the emulator); those four with the CTAs in key-tile-major order
    (longest_first, "lf")."""
    out = run_attention_emulator(emulator, head_dim, timeout=1200)
    runs = (16 if head_dim == 64 else 8) + 4
    assert re.search(rf"^0 of {runs} cases failed$", out, re.M), out[-3000:]
    assert len(re.findall(rf"^ok   D=\s*{head_dim} bm=", out, re.M)) == runs, out[-3000:]
    assert len(re.findall(rf"^ok   D=\s*{head_dim} bm=\s*\d+ (?:bf16|fp16) dkv=f32 lf B", out, re.M)) == 2, out[-3000:]
    assert len(re.findall(rf"^ok   D=\s*{head_dim} bm=\s*\d+ (?:bf16|fp16) dkv=f32 kv_split=[23] lf ", out, re.M)) == 2, \
        out[-3000:]
    if head_dim == 64:
        assert len(re.findall(r"^ok   D=\s*64 bm=128 ", out, re.M)) == 12, out[-3000:]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_backward_kernel_without_the_dq_writer_in_the_emulator(emulator_no_writer, head_dim):
    """The A/B variant kept beside the shipped kernel (BwdTraits::kDqWriter false: each consumer
    issues its own reduce-adds), on the same cases."""
    out = run_attention_emulator(emulator_no_writer, head_dim, timeout=1200)
    runs = (16 if head_dim == 64 else 8) + 4
    assert re.search(rf"^0 of {runs} cases failed$", out, re.M), out[-3000:]


# A planted bug and what the emulator must report for it. short_count: the slot-release mbarriers count
# one consumer warpgroup (128 arrivals) too few, so the producer refills a Q / dO slot the lagging
# consumer's wgmmas still read. short_named: the named barrier releases one consumer alone, whose dQ
# wgmma then reads dS rows the other has not stored. no_bulk_wait: cp.async.bulk.wait_group.read
# returns at once, so the writer hands a dQ buffer back while its reduce-add may still read it.
# drop_arrive: every bar.arrive is lost (the dQ hand-off never reaches the writer warp, nor the
# buffer's release the consumer). greedy_inc: every setmaxnreg.inc asks for 8 registers past the
# launch's allocation (a hang on the GPU).
MUTATIONS = {
    "short_count": r"deadlock|before .* waited|overwrites|lands on",
    "short_named": r"never written|no __syncthreads|overwrites|changed while",
    "no_bulk_wait": r"overwrites the source of a bulk reduce-add|exited with a bulk reduce-add",
    "drop_arrive": r"deadlock",
    "greedy_inc": r"deadlock",
}


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("mutate", sorted(MUTATIONS))
def test_emulator_catches_a_planted_synchronization_bug(emulator, head_dim, mutate):
    """With consumer warpgroup 1 lagging (TILED_ATTN_EMU_LAG: the others run as far ahead as the
    kernel's barriers let them) the kernel as written passes and the mutated synchronization fails a
    hazard check (not merely the numerics)."""
    seed = str(fresh_seed())
    base = {**os.environ, "TILED_ATTN_EMU_LAG": "1"}
    ran = {}
    for m in ("", mutate):
        r = subprocess.run([str(emulator), str(head_dim), seed], capture_output=True, text=True, timeout=600,
                           env={**base, "TILED_ATTN_EMU_MUTATE": m})
        ran[m] = (r.returncode, r.stdout)
    (rc_ok, out_ok), (rc_bad, out_bad) = ran[""], ran[mutate]
    tag = f"[seed={seed}; {reproduce_hint()}]"
    assert rc_ok == 0 and re.search(r"^0 of \d+ cases failed$", out_ok, re.M), (tag, out_ok[-3000:])
    assert rc_bad == 1 and re.search(rf"^FAIL D=.*: .*({MUTATIONS[mutate]})", out_bad, re.M), (tag, out_bad[-3000:])


# (B, Hkv, group, N, D, block_m, causal) -> the planned (kv_split, longest_first) on 132 SMs.
SCHEDULES = [
    ((1, 8, 4, 2048, 64, 128, True), (2, True)),    # the Llama-3.2-1B training step: 128 CTAs, causal
    ((1, 8, 4, 2048, 128, 64, True), (2, True)),
    ((1, 8, 4, 1024, 64, 128, True), (4, True)),
    ((2, 8, 4, 2048, 64, 128, True), (1, True)),    # two waves: the order alone (measured 31% faster)
    ((1, 8, 4, 2048, 64, 128, False), (1, False)),  # equal CTAs: nothing to gain
    ((4, 8, 4, 2048, 64, 128, True), (1, True)),    # four waves: no split; the order (18%)
    ((1, 32, 1, 4096, 64, 128, True), (1, True)),   # MHA, 8 waves (measured 8% faster)
    ((1, 8, 4, 8192, 64, 128, True), (1, True)),    # 3.9 waves: the order alone (measured 18% faster)
    ((1, 8, 4, 8192, 128, 64, True), (1, True)),
    ((4, 16, 1, 4096, 128, 64, True), (1, False)),  # 15.5 waves: the model's gain under min_gain
    ((4, 32, 1, 4096, 64, 128, True), (1, False)),  # 31 waves: past order_waves
]


@pytest.mark.parametrize("shape,expected", SCHEDULES, ids=[str(s) for s, _ in SCHEDULES])
def test_schedule_model(shape, expected):
    """The planner's schedule (tiled_attn/cuda/attention_backward.py): a split group and key-tile-major
    order where the grid is about one CTA per SM under a causal mask, the plain launch elsewhere."""
    from tiled_attn.cuda.attention_backward import schedule
    b, hkv, group, n, d, block_m, causal = shape
    assert schedule(b, hkv, group, n, n, block_m, causal, 0, 132, 3.5, 2, d) == expected


def test_makespan_model():
    """The block-scheduler simulation: CTAs start in order on the first free SM."""
    from tiled_attn.cuda.attention_backward import _makespan
    assert _makespan([4, 1, 1, 1, 1], 2) == 4
    assert _makespan([1, 1, 1, 1, 4], 2) == 6
    assert _makespan([3, 3, 3], 5) == 3
