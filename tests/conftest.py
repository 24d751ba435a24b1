"""Test-wide settings: outputs are NaN-poisoned, seeds are fixed per test unless TILED_ATTN_SEED says
otherwise (helpers.fresh_seed), hypothesis runs a CI-sized profile, and on a machine without CUDA the
Triton kernels run in Triton's CPU interpreter."""
import os

import torch

# Must be set before any @triton.jit kernel module is imported (tiled_attn imports them lazily), so
# `python -m pytest` is the one test command on a GPU machine and on a CPU-only one alike.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import helpers  # noqa: E402
from helpers import fresh_seed  # noqa: E402
from tiled_attn import _checks  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    import numpy as np  # noqa: E402
    from triton.runtime import interpreter as _interpreter  # noqa: E402

    _unfused_fma = _interpreter.InterpreterBuilder.create_fma

    def _fused_fma(self, x, y, z):
        # Triton 3.6's interpreter rounds x·y before adding z (create_fma is x * y + z in the
        # operands' dtype); the GPU's fma.rn.f32 rounds once, and online.exp_natural relies on that
        # (fma(d, c, -d·c) is the product's exact rounding error). For float32 operands the float64
        # product is exact and the sum rounds to float32 once more: the hardware's result but for a
        # double rounding, off by an ulp in about 2^-29 of cases.
        if z.data.dtype == np.float32:
            out = x.data.astype(np.float64) * y.data.astype(np.float64) + z.data.astype(np.float64)
            return _interpreter.TensorHandle(out.astype(np.float32), z.dtype.scalar)
        return _unfused_fma(self, x, y, z)

    _interpreter.InterpreterBuilder.create_fma = _fused_fma

# Hypothesis follows TILED_ATTN_SEED too: unset, each test's examples are a fixed function of the test
# (derandomize) and no stored example from an earlier local run is replayed (database=None); an
# integer seeds every test's examples with it (pytest_configure); "random" is randomized (seeded
# with this process's random base, which the failure hint prints) and keeps the local database.
_SEED_MODE = helpers.seed_mode()
_HYPOTHESIS_SEEDING = (dict(derandomize=True, database=None) if _SEED_MODE == "fixed" else
                       dict(derandomize=False, database=None) if _SEED_MODE == "int" else
                       dict(derandomize=False))
settings.register_profile("ci", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                          **_HYPOTHESIS_SEEDING)
settings.register_profile("gpu", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                          **_HYPOTHESIS_SEEDING)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    if _SEED_MODE != "fixed" and config.getoption("hypothesis_seed", None) is None:
        from hypothesis import core
        core.global_force_seed = helpers.seed_base()


def pytest_report_header(config):
    value = os.environ.get(helpers.SEED_ENV, "") or "(unset)"
    base = "" if _SEED_MODE == "fixed" else f", base {helpers.seed_base()}"
    return f"seeds: {helpers.SEED_ENV}={value} ({_SEED_MODE}{base})"


@pytest.fixture(autouse=True)
def _poison_outputs(monkeypatch):
    # Every output a backend fills starts NaN: an unwritten element fails the numerics rule.
    monkeypatch.setattr(_checks, "POISON_OUTPUTS", True)


@pytest.fixture(autouse=True)
def _test_seeds(request):
    # Every test's seeds (and the global torch/random/numpy RNGs) are a function of its node id and
    # TILED_ATTN_SEED, never of what ran before it.
    helpers.begin_test(request.node.nodeid)
    yield
    helpers.end_test()


@pytest.fixture
def seed(_test_seeds):
    # The test's first seed (helpers.fresh_seed); helpers.assert_rule prints it in every failure message.
    return fresh_seed()


@pytest.fixture
def kernel_calls(monkeypatch):
    """The backend of every call that ran one of our attention plans, in order ("native" is
    backend=None's torch SDPA on the CPU); a call routed to torch's own SDPA is not one."""
    from tiled_attn.attention import AttentionPlan
    calls, forward, infer = [], AttentionPlan.forward, AttentionPlan.infer
    inside = []  # infer may run forward: one call, counted once

    def counting(self, q, k, v, *extras):
        if not inside:
            calls.append(self.backend)
        return forward(self, q, k, v, *extras)

    def counting_infer(self, q, k, v):
        calls.append(self.backend)
        inside.append(True)
        try:
            return infer(self, q, k, v)
        finally:
            inside.pop()

    monkeypatch.setattr(AttentionPlan, "forward", counting)
    monkeypatch.setattr(AttentionPlan, "infer", counting_infer)
    return calls


@pytest.fixture
def backward_calls(monkeypatch):
    """The backend of every attention backward that ran one of our plans, in order ("torch" is the
    pure-PyTorch tiled backward; "triton"/"cuda" name the forward's backend, both run the Triton
    backward kernels); a gradient computed by torch's own SDPA is not one."""
    from tiled_attn.attention import AttentionBackwardPlan
    calls, backward = [], AttentionBackwardPlan.backward

    def counting(self, *args):
        calls.append(self.backend)
        return backward(self, *args)

    monkeypatch.setattr(AttentionBackwardPlan, "backward", counting)
    return calls


@pytest.fixture(autouse=True)
def _fresh_plans():
    # Tests monkeypatch config tables, configs.arch and module constants that plans are made from:
    # every test starts with no cached plan (tiled_attn/_plan.py).
    from tiled_attn import _plan
    _plan.clear_all()
    yield
    _plan.clear_all()


def _rerun_hint(nodeid: str) -> str:
    env = f"{helpers.SEED_ENV}={helpers.seed_base()} " if _SEED_MODE != "fixed" else ""
    return f"{env}python -m pytest '{nodeid}'"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    # Every failure, not only assert_rule's, says how to rerun it with the same seeds.
    report = yield
    if report.failed:
        report.sections.append(("seeds", f"reproduce: {_rerun_hint(item.nodeid)}"))
    return report


def pytest_runtest_logreport(report):
    # On the GPU job (.ci/gpu.sh) each failure's traceback is appended to a file the moment it
    # happens, so a run cut off by the device's time limit still says why each test failed.
    path = os.environ.get("TILED_ATTN_FAILLOG")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when}; reproduce: {_rerun_hint(report.nodeid)})\n"
                    f"{report.longreprtext}\n\n")
    # ... and every test's duration, for sizing the GPU job's stages.
    path = os.environ.get("TILED_ATTN_TIMELOG")
    if path and report.when == "call":
        with open(path, "a") as f:
            f.write(f"{report.duration:.3f} {report.outcome} {report.nodeid}\n")


def pytest_collection_modifyitems(config, items):
    """TILED_ATTN_SHARD="i/n" keeps the i-th of n parts (1-based) of the collected tests, so the
    H100 job (.ci/gpu.sh) can spread a run over device calls of at most 10 minutes. Tests of one
    xdist group (the attention cases that compile the same kernels) stay in one part."""
    shard = os.environ.get("TILED_ATTN_SHARD")
    if not shard:
        return
    import zlib
    i, n = (int(v) for v in shard.split("/"))
    keep, drop = [], []
    for item in items:
        group = item.get_closest_marker("xdist_group")
        key = group.args[0] if group is not None and group.args else item.nodeid
        (keep if zlib.crc32(key.encode()) % n == i - 1 else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
