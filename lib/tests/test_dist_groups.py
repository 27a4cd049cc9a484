"""Groups of ranks: collectives that meet only a group's ranks, on the simulated world and on
gloo, the dp × tp grid, and misuse named with the group."""

from __future__ import annotations

import numpy as np
import pytest
from chainrule import dist


def _every_collective_on_groups():
    g = dist.grid(2, 2)
    r = float(dist.rank())
    return {
        "place": (g.dp_rank, g.tp_rank, dist.rank(g.tp_group), dist.world_size(g.dp_group)),
        "row_sum": dist.all_reduce(np.array([r]), group=g.tp_group).tolist(),
        "column_mean": dist.all_reduce(np.array([r]), op="avg", group=g.dp_group).tolist(),
        "gather": dist.all_gather(np.array([r]), group=g.dp_group).tolist(),
        "broadcast": dist.broadcast(np.array([r]), src=1, group=g.dp_group).tolist(),
        "reduce_scatter": dist.reduce_scatter(np.arange(4.0) + r, group=g.tp_group).tolist(),
        "all_to_all": dist.all_to_all(np.arange(4.0) + 10 * r, group=g.tp_group).tolist(),
        "scatter": dist.scatter(np.arange(2.0) + r, src=0, group=g.tp_group).tolist(),
    }


def _expected(rank: int) -> dict:
    dp_rank, tp_rank = divmod(rank, 2)
    row = [2 * dp_rank, 2 * dp_rank + 1]
    column = [tp_rank, tp_rank + 2]
    chunk = np.split(sum(np.arange(4.0) + q for q in row), 2)[tp_rank]
    return {
        "place": [dp_rank, tp_rank, tp_rank, 2],
        "row_sum": [float(sum(row))],
        "column_mean": [sum(column) / 2],
        "gather": [float(q) for q in column],
        "broadcast": [float(column[1])],
        "reduce_scatter": chunk.tolist(),
        "all_to_all": [
            v for q in row for v in np.split(np.arange(4.0) + 10 * q, 2)[tp_rank].tolist()
        ],
        "scatter": [float(row[0]) + tp_rank],
    }


@pytest.mark.parametrize("backend", ["sim", "gloo"])
def test_every_collective_meets_only_its_group(backend):
    results = dist.run(_every_collective_on_groups, 4, backend=backend, timeout=60)
    for rank, result in enumerate(results):
        assert {k: list(v) for k, v in result.items()} == _expected(rank), rank


def test_the_grid_numbers_rows_as_tensor_parallel_and_columns_as_data_parallel():
    def places():
        g = dist.grid(2, 3)
        return g.dp_rank, g.tp_rank, g.tp_group.ranks, g.dp_group.ranks

    assert dist.run(places, 6) == [
        (0, 0, (0, 1, 2), (0, 3)),
        (0, 1, (0, 1, 2), (1, 4)),
        (0, 2, (0, 1, 2), (2, 5)),
        (1, 0, (3, 4, 5), (0, 3)),
        (1, 1, (3, 4, 5), (1, 4)),
        (1, 2, (3, 4, 5), (2, 5)),
    ]
    with pytest.raises(dist.RankError, match="2 × 3 grid needs 6 ranks"):
        dist.run(lambda: dist.grid(2, 3), 4)


@pytest.mark.parametrize("backend", ["sim", "gloo"])
def test_a_trace_records_each_groups_collectives_once_with_their_world_ranks(backend):
    def step():
        g = dist.grid(2, 2)
        dist.all_reduce(np.ones(3), group=g.tp_group)
        dist.all_reduce(np.ones(5), group=g.dp_group)

    trace = dist.Trace()
    dist.run(step, 4, backend=backend, trace=trace, timeout=60)
    seen = sorted((e.op, e.ranks, e.shapes[0]) for e in trace)
    assert seen == [
        ("all_reduce", (0, 1), (3,)),
        ("all_reduce", (0, 2), (5,)),
        ("all_reduce", (1, 3), (5,)),
        ("all_reduce", (2, 3), (3,)),
    ]
    assert all(e.world_size == 2 for e in trace)


@pytest.mark.parametrize("backend", ["sim", "gloo"])
def test_a_mismatch_in_a_group_is_named_with_the_group(backend):
    def step():
        g = dist.grid(2, 2)
        dist.all_reduce(np.ones(1 + dist.rank()), group=g.tp_group)

    with pytest.raises(dist.CollectiveError, match=r"shapes differ.*group \(0, 1\)"):
        dist.run(step, 4, backend=backend, timeout=30)


def test_ranks_waiting_in_different_groups_are_named_not_left_hanging():
    def step():  # a cycle: 0 waits for 1 in a, 1 for 2 in b, 2 for 0 in c
        a, b, c = dist.new_group([0, 1]), dist.new_group([1, 2]), dist.new_group([0, 2])
        first, second = [(a, c), (b, a), (c, b)][dist.rank()]
        dist.all_reduce(np.ones(1), group=first)
        dist.all_reduce(np.ones(1), group=second)

    with pytest.raises(dist.CollectiveError, match="must call its collectives in the same order"):
        dist.run(step, 3)


def test_a_rank_outside_the_group_and_a_bad_group_are_refused():
    def outside():
        g = dist.new_group([0, 1])
        return dist.all_reduce(np.ones(1), group=g)

    with pytest.raises(dist.RankError, match="rank 2 is not in the group"):
        dist.run(outside, 3)
    with pytest.raises(dist.RankError, match="not ranks of a world of size 2"):
        dist.run(lambda: dist.new_group([0, 5]), 2)
    with pytest.raises(ValueError, match="each rank once"):
        dist.Group((1, 1))
