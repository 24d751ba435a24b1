"""Test-wide settings: outputs are NaN-poisoned, hypothesis runs a CI-sized profile."""
import os

import pytest
from hypothesis import HealthCheck, settings

from tiled_attn import _checks

settings.register_profile("ci", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("gpu", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _poison_outputs(monkeypatch):
    # Every output a backend fills starts NaN: an unwritten element fails the numerics rule.
    monkeypatch.setattr(_checks, "POISON_OUTPUTS", True)
