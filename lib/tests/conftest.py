"""Shared test settings for the library: hypothesis kept cheap, float64 torch, a seeded rng."""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "chainrule",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=False,
)
settings.load_profile("chainrule")


@pytest.fixture
def rng():
    """A numpy generator with a fixed seed, fresh for each test."""
    return np.random.default_rng(12345)
