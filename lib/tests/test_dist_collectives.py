"""One specification per collective: both backends compute every one, and calls of any size
(long shapes, every rank's counts) are agreed on."""

import numpy as np
import pytest
from chainrule import dist
from chainrule.dist import simulated, torch_backend
from chainrule.dist.collectives import COLLECTIVES


def test_both_backends_compute_every_collective_and_nothing_else():
    """A point-to-point row (a send and its recv) is met by two ranks, not computed for all."""
    met_by_all = {name for name, spec in COLLECTIVES.items() if not spec.point_to_point}
    assert set(simulated.COMPUTE) == met_by_all
    assert set(torch_backend.COLLECTIVES) == met_by_all
    assert {name for name in COLLECTIVES if name not in met_by_all} == {"send"}


def long_calls():
    r = dist.rank()
    big = dist.all_reduce(np.ones((1,) * 30) * r)  # a call longer than the first gather holds
    counts = [[3, 1000], [0, 2]][r]
    rows = dist.all_to_all(np.ones((sum(counts), 1)) * r, send_counts=counts)
    return big.item(), rows.ravel().tolist()


@pytest.mark.parametrize("backend", ["sim", "gloo"])
def test_long_calls_are_agreed(backend):
    counts = [[3, 1000], [0, 2]]
    results = dist.run(long_calls, 2, backend=backend)
    for r, (big, rows) in enumerate(results):
        assert big == 1.0  # 0 + 1
        assert rows == [0.0] * counts[0][r] + [1.0] * counts[1][r]
