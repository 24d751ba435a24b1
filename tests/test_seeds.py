"""DESIGN §4's seeds: fixed per test by default, fresh with TILED_ATTN_SEED=random, an integer
TILED_ATTN_SEED reproduces (helpers.fresh_seed and conftest's `seed` fixture)."""
import random

import torch
from hypothesis import settings

import helpers
from helpers import SEED_ENV, fresh_seed, seed_for

A, B = "tests/test_x.py::test_a[float32]", "tests/test_x.py::test_a[float16]"


def _draws(test_id, n=3):
    helpers.begin_test(test_id)
    try:
        return [fresh_seed() for _ in range(n)]
    finally:
        helpers.end_test()


def test_fixed_by_default(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    assert seed_for(A) == seed_for(A) and seed_for(A, 1) == seed_for(A, 1)
    assert seed_for(A) != seed_for(B)
    assert seed_for(A, 0) != seed_for(A, 1)
    first = _draws(A)
    assert len(set(first)) == 3 and first[0] == seed_for(A)   # several draws in one test differ ...
    assert _draws(A) == first                                  # ... and are the same in every run
    assert _draws(B) != first
    assert all(0 <= s < 2**31 for s in first)
    monkeypatch.setenv(SEED_ENV, "")
    assert _draws(A) == first


def test_integer_base_changes_seeds_deterministically(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    fixed = _draws(A)
    monkeypatch.setenv(SEED_ENV, "0")
    assert _draws(A) == fixed  # unset is base 0
    monkeypatch.setenv(SEED_ENV, "12345")
    with_base = _draws(A)
    assert with_base != fixed and _draws(A) == with_base
    assert "TILED_ATTN_SEED=12345" in helpers.reproduce_hint()
    monkeypatch.setenv(SEED_ENV, "12346")
    assert _draws(A) != with_base


def test_random_gives_fresh_seeds_and_names_its_base(monkeypatch):
    monkeypatch.setenv(SEED_ENV, "random")
    runs = []
    for _ in range(4):
        monkeypatch.setattr(helpers, "_random_base", None)  # a new process, a new run
        runs.append((helpers.seed_base(), _draws(A)))
    assert len({tuple(d) for _, d in runs}) == 4
    base, draws = runs[-1]
    assert _draws(A) == draws  # one base per process: the printed base reproduces ...
    monkeypatch.setenv(SEED_ENV, str(base))
    assert _draws(A) == draws  # ... as TILED_ATTN_SEED=<base>


def test_seed_fixture_is_the_tests_first_draw(request, seed):
    assert seed == seed_for(request.node.nodeid, 0)
    assert fresh_seed() == seed_for(request.node.nodeid, 1)


def test_global_rngs_are_seeded_per_test(request):
    # An unseeded torch.randn / random.random in a test is a function of the test too.
    helpers.begin_test(request.node.nodeid)
    a = (torch.randn(3), random.random())
    helpers.begin_test(request.node.nodeid)
    b = (torch.randn(3), random.random())
    assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_hypothesis_is_derandomized_without_a_seed_env():
    if helpers.seed_mode() == "fixed":
        assert settings.default.derandomize and settings.default.database is None
    else:
        assert not settings.default.derandomize
