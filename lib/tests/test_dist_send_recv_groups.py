"""Point to point inside groups: ``dist.send(x, dst, group=g)`` / ``group_dst=`` and
``dist.recv(src, group=g)`` / ``group_src=``, torch.distributed's arguments (``dst`` and ``src``
ranks of the world, ``group_dst`` and ``group_src`` ranks of the group), on the simulated world
and on gloo (torch.distributed's send and recv in the group's process group). A message in a
group meets only a recv of that group, and the misuses of the world's messages (a deadlock, a
peer that returned, mismatched shapes or dtypes) end in the same words on both backends,
naming the group."""

from __future__ import annotations

import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.parallel import duality
from test_dist_misuse import BACKENDS, _other_fixtures_processes_left_out, fails  # noqa: F401
from test_dist_send_recv import DEADLOCK_ADVICE


def columns():
    """A world of 4 as two groups, (0, 2) and (1, 3), made on every rank in the same order."""
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    return groups[dist.rank() % 2]


def down_each_column(x):
    """In each column, group rank 0 sends x + its world rank to group rank 1 twice: once named
    by its group rank, once by its world rank; the receiver names the source both ways too."""
    g = columns()
    if dist.rank(g) == 0:
        dist.send(x + dist.rank(), group=g, group_dst=1)
        dist.send(x + 10 * dist.rank(), g.ranks[1], group=g)
        return None
    by_group_rank = dist.recv(group=g, group_src=0)
    by_world_rank = dist.recv(g.ranks[0], group=g, shape=x.shape, dtype=x.dtype)
    return by_group_rank, by_world_rank


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_message_in_a_group_names_its_peer_by_world_or_group_rank(backend):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    trace = dist.Trace()
    out = dist.run(down_each_column, 4, backend=backend, args=(x,), trace=trace)
    assert out[0] is None and out[1] is None
    for rank, source in ((2, 0), (3, 1)):
        np.testing.assert_array_equal(out[rank][0], x + source)
        np.testing.assert_array_equal(out[rank][1], x + 10 * source)
        assert out[rank][0].dtype == np.float32
    events = sorted((e.kwargs["src"], e.kwargs["dst"], e.kwargs["group"], e.seq) for e in trace)
    assert events == [(0, 2, (0, 2), 0), (0, 2, (0, 2), 1), (1, 3, (1, 3), 0), (1, 3, (1, 3), 1)]
    assert {e.nbytes for e in trace} == {x.nbytes} and {e.ranks for e in trace} == {(0, 2), (1, 3)}


def world_and_group_apart():
    """Ranks 0 and 1 exchange two messages, one in the world and one in a group of both:
    each channel counts its own messages (both are #0), and a recv meets its own channel's."""
    pair = dist.new_group([0, 1])
    if dist.rank() == 0:
        dist.send(np.array([1.0]), 1, group=pair)
        dist.send(np.array([2.0]), 1)
        return None
    return float(dist.recv(0, group=pair)[0]), float(dist.recv(0)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_messages_in_the_world_and_in_a_group_are_counted_apart(backend):
    trace = dist.Trace()
    assert dist.run(world_and_group_apart, 2, backend=backend, trace=trace)[1] == (1.0, 2.0)
    assert sorted((e.seq, "group" in e.kwargs) for e in trace) == [(0, False), (0, True)]


def chain_in_rows(x):
    """Two rows of two ranks, (0, 1) and (2, 3): pass_to_next along each row, while the
    columns all-reduce: point to point in one group, collectives in another, both rows."""
    rows = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    column = [dist.new_group([0, 2]), dist.new_group([1, 3])][dist.rank() % 2]
    row = rows[dist.rank() // 2]
    y = duality.pass_to_next(Tensor(x * (dist.rank() + 1), requires_grad=True), row)
    total = duality.reduce_from_ranks(y, column)
    (total * total).sum().backward()
    return y.data, total.data


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_duality_rows_pass_values_along_a_group_beside_another_groups_collectives(backend):
    x = np.ones(3)
    out = dist.run(chain_in_rows, 4, backend=backend, args=(x,))
    # y on the second rank of each row is the first rank's value: x·1 on rank 1, x·3 on rank 3
    np.testing.assert_array_equal(out[1][0], x * 1)
    np.testing.assert_array_equal(out[3][0], x * 3)
    np.testing.assert_array_equal(out[0][0], x * 0)
    np.testing.assert_array_equal(out[1][1], x * 4)  # the column (1, 3) adds 1 + 3


# -- the arguments ------------------------------------------------------------------------------


def sends(**kwargs):
    g = dist.new_group([0, 2])
    if dist.rank() == 0:
        dist.send(np.ones(2), **{"group": g, **kwargs})


def receives_outside():
    g = dist.new_group([0, 2])
    if dist.rank() == 1:
        dist.recv(0, group=g)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"dst": 2, "group_dst": 1}, ValueError, "send: pass dst (a rank of the world) or "
         "group_dst (a rank of the group), not both"),
        ({}, ValueError, "send: pass dst (a rank of the world) or group_dst (a rank of the "
         "group), not neither"),
        ({"dst": 1}, ValueError, "send: dst=1 is not a rank of the group of ranks (0, 2) (a rank "
         "of the world, as in torch.distributed; group_dst counts in the group)"),
        ({"group_dst": 2}, ValueError, "send: group_dst=2 is not a rank of the group of ranks "
         "(0, 2), of size 2"),
        ({"group_dst": 0}, ValueError, "send: group_dst=0 is this rank: a rank cannot send to "
         "itself"),
        ({"group_dst": 1.0}, TypeError, "send: group_dst must be an int rank, got 1.0"),
        ({"dst": 7}, ValueError, "send: dst=7 is not a rank of a world of size 4"),
    ],
)  # fmt: skip
def test_the_peer_is_one_rank_of_the_group_named_once(kwargs, error, message):
    with pytest.raises(dist.RankError) as info:
        dist.run(sends, 4, kwargs=kwargs)
    assert (info.value.exc_type, info.value.original_message) == (error.__name__, message)


def test_only_members_of_a_group_send_and_receive_in_it():
    with pytest.raises(dist.RankError) as info:
        dist.run(receives_outside, 4)
    assert info.value.original_message == (
        "recv: rank 1 is not in the group of ranks (0, 2): only its members send and receive in it"
    )


# -- misuse: the same words on both backends, naming the group ----------------------------------


def pipeline_receives_first():
    """The column (0, 2) passes around its ring, every rank receiving first (the other column
    returns)."""
    g = columns()
    if g.ranks != (0, 2):
        return
    r, P = dist.rank(g), dist.world_size(g)
    x = dist.recv(group=g, group_src=(r - 1) % P)
    dist.send(x, group=g, group_dst=(r + 1) % P)


def sent_in_a_group_received_in_the_world():
    pair = dist.new_group([0, 1])
    if dist.rank() == 0:
        dist.send(np.ones(2), 1, group=pair)
        return None
    return dist.recv(0)


def group_never_sends():
    g = dist.new_group([0, 1])
    if dist.rank() == 1:
        return dist.recv(group=g, group_src=0)
    return None


def group_other_shape():
    g = dist.new_group([1, 0])  # group rank 0 is world rank 1
    if dist.rank() == 1:
        dist.send(np.ones((2, 3)), group=g, group_dst=1)
        return None
    return dist.recv(group=g, group_src=0, shape=(3, 2))


def group_other_dtype():
    g = dist.new_group([0, 1])
    if dist.rank() == 0:
        dist.send(np.ones(2, np.float32), 1, group=g)
        return None
    return dist.recv(0, group=g, dtype=np.float64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_deadlock_in_groups_is_named_with_the_groups(backend):
    assert fails(pipeline_receives_first, 4, backend) == (
        "deadlock: rank 0 waits in recv #0 from rank 2 in the group of ranks (0, 2), "
        "rank 2 waits in recv #0 from rank 0 in the group of ranks (0, 2)" + DEADLOCK_ADVICE
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_send_in_a_group_does_not_meet_a_recv_in_the_world(backend):
    assert fails(sent_in_a_group_received_in_the_world, 2, backend) == (
        "deadlock: rank 0 waits in send #0 to rank 1 in the group of ranks (0, 1), "
        "rank 1 waits in recv #0 from rank 0" + DEADLOCK_ADVICE
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_unmatched_and_mismatched_messages_in_a_group(backend):
    assert fails(group_never_sends, 2, backend) == (
        "rank 1 is waiting in recv #0 from rank 0 in the group of ranks (0, 1) but rank 0 has "
        "already returned: every send needs a recv on its destination, and every recv a send on "
        "its source"
    )
    assert fails(group_other_shape, 2, backend) == (
        "send #0 from rank 1 to rank 0 in the group of ranks (1, 0): the shapes differ: rank 1 "
        "sends (2, 3) but rank 0 receives (3, 2)"
    )
    assert fails(group_other_dtype, 2, backend) == (
        "send #0 from rank 0 to rank 1 in the group of ranks (0, 1): the dtypes differ: rank 0 "
        "sends float32 but rank 1 receives float64"
    )


def stages_against_tensor_groups():
    """Two stages of two tensor-parallel ranks: (0, 1) → (2, 3), pipeline pairs (0, 2) and
    (1, 3). Rank 0 sends before its tensor group's all-reduce and rank 1 after it; rank 3
    receives before its all-reduce and rank 2 after it: each waits for the next, in a circle
    through both kinds of group."""
    first, second = dist.new_group([0, 1]), dist.new_group([2, 3])
    pair = [dist.new_group([0, 2]), dist.new_group([1, 3])][dist.rank() % 2]
    r, x = dist.rank(), np.ones(2)
    if r == 0:
        dist.send(x, group=pair, group_dst=1)
        dist.all_reduce(x, group=first)
    elif r == 1:
        dist.all_reduce(x, group=first)
        dist.send(x, group=pair, group_dst=1)
    elif r == 2:
        dist.all_reduce(x, group=second)
        dist.recv(group=pair, group_src=0)
    else:
        dist.recv(group=pair, group_src=0)
        dist.all_reduce(x, group=second)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_deadlock_through_a_pipeline_group_and_tensor_groups_is_named(backend):
    """On gloo a rank waiting in an all-reduce of a group that the detecting rank is not in
    waits for the members its status file shows elsewhere."""
    assert fails(stages_against_tensor_groups, 4, backend) == (
        "deadlock: rank 0 waits in send #0 to rank 2 in the group of ranks (0, 2), rank 1 waits "
        "in all_reduce #0 (in the group of ranks (0, 1)), rank 2 waits in all_reduce #0 (in the "
        "group of ranks (2, 3)), rank 3 waits in recv #0 from rank 1 in the group of ranks "
        "(1, 3)" + DEADLOCK_ADVICE
    )
