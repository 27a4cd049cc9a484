"""Every redistribution agrees with torch.distributed.tensor (DTensor) on 2 and 4 gloo ranks.

One ``dist.run`` per world size on the warm pool of worker processes runs every case of
:data:`chainrule.course.placement_dtensor.CASES` both ways; no process group is made or destroyed.
"""

import pytest
from chainrule import dist
from chainrule.course.placement_dtensor import CASES, compare_with_dtensor
from chainrule.parallel.placement import Partial, Replicate, Shard

pytestmark = pytest.mark.skipif(not dist.is_available("gloo"), reason="needs gloo")


def test_the_cases_are_every_pair_and_every_fan_out():
    sources = {Replicate(), Shard(0), Shard(1), Partial()}
    pairs = {(c.source, c.target) for c in CASES if not c.fan_out}
    assert pairs == {(s, t) for s in sources for t in sources - {Partial()}}
    assert {c.source for c in CASES if c.fan_out} == sources
    assert len(CASES) == 16


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_every_redistribution_matches_dtensor(world_size):
    agreements = compare_with_dtensor(world_size)
    assert [a.case for a in agreements] == list(CASES)
    for agreement in agreements:
        assert agreement.output_error < 1e-12, agreement
        assert agreement.gradient_error < 1e-12, agreement
