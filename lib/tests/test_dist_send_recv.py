"""Point to point: ``dist.send(x, dst)`` and ``dist.recv(src)`` on the simulated world and on
gloo (torch.distributed's own send and recv), their trace, and their misuse: a recv whose sender
never sends, a send nobody receives, mismatched shapes or dtypes and a deadlocking order end
within seconds in the same words on both backends, never in a hang."""

from __future__ import annotations

import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.costs import comm_cost
from test_dist_misuse import BACKENDS, _other_fixtures_processes_left_out, fails  # noqa: F401


def chain(x):
    """Rank 0 sends x down the chain 0 → 1 → ... → P−1; each rank adds its rank; the last
    sends the result back to rank 0."""
    r, P = dist.rank(), dist.world_size()
    if r > 0:
        x = dist.recv(r - 1)
    if r < P - 1:
        dist.send(x + r, r + 1)
    if r == P - 1:
        dist.send(x + r, 0)
    if r == 0:
        return dist.recv(P - 1)
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_chain_of_sends_carries_values_kinds_and_dtypes(backend):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    trace = dist.Trace()
    out = dist.run(chain, 3, backend=backend, args=(x,), trace=trace)
    np.testing.assert_array_equal(out[0], x + 3)
    np.testing.assert_array_equal(out[2], x + 1)
    assert out[0].dtype == np.float32 and isinstance(out[0], np.ndarray)
    # (the ranks' traces are merged; messages between different pairs have no order of their own)
    assert sorted((e.op, e.kwargs["src"], e.kwargs["dst"]) for e in trace) == [
        ("send", 0, 1),
        ("send", 1, 2),
        ("send", 2, 0),
    ]
    assert {e.nbytes for e in trace} == {x.nbytes} and {e.shapes for e in trace} == {((2, 3),) * 2}
    assert comm_cost.event_bytes(trace[0]) == x.nbytes  # a send of N bytes sends N
    ints = dist.run(chain, 2, backend=backend, args=(np.arange(3),))
    assert ints[0].dtype == np.int64 and list(ints[0]) == [1, 2, 3]


def kinds():
    if dist.rank() == 0:
        import torch

        dist.send(Tensor(np.ones(2)), 1)
        dist.send(torch.ones(3, dtype=torch.float64), 1)
        dist.send(np.float64(2.5), 1)
        return None
    engine, torch_tensor = dist.recv(0, shape=(2,), dtype=np.float64), dist.recv(0, dtype="float64")
    scalar = dist.recv(0)
    return type(engine).__name__, type(torch_tensor).__module__, scalar.shape, float(scalar)


def test_the_receiver_gets_the_kind_the_sender_sent():
    assert dist.run(kinds, 2)[1] == ("Tensor", "torch", (), 2.5)


def sends_to(peer):
    dist.send(np.ones(2), peer)


def test_a_peer_must_be_another_rank_of_the_world():
    with pytest.raises(dist.RankError, match="dst=0 is this rank: a rank cannot send to itself"):
        dist.run(lambda: sends_to(0) if dist.rank() == 0 else None, 2)
    with pytest.raises(dist.RankError, match="dst=5 is not a rank of a world of size 2"):
        dist.run(sends_to, 2, args=(5,))
    with pytest.raises(dist.RankError, match="must be an int rank"):
        dist.run(sends_to, 2, args=(1.0,))


# -- misuse: the same words on both backends ---------------------------------------------------

DEADLOCK_ADVICE = (
    "; no rank can go on. A send waits for its recv and a recv for its send, so when every rank "
    "receives first (or every rank sends first) each waits for another; let one rank of each pair "
    "send while the other receives"
)


def everyone_receives_first():
    r, P = dist.rank(), dist.world_size()
    x = dist.recv((r - 1) % P)
    dist.send(x, (r + 1) % P)


def everyone_sends_first():
    r, P = dist.rank(), dist.world_size()
    dist.send(np.ones(2), (r + 1) % P)
    return dist.recv((r - 1) % P)


def never_sends():
    if dist.rank() == 1:
        return dist.recv(0)
    return None


def nobody_receives():
    if dist.rank() == 0:
        dist.send(np.ones(2), 1)


def other_shape():
    if dist.rank() == 0:
        dist.send(np.ones((2, 3)), 1)
        return None
    return dist.recv(0, shape=(3, 2))


def other_dtype():
    if dist.rank() == 0:
        dist.send(np.ones(2, np.float32), 1)
        return None
    return dist.recv(0, dtype=np.float64)


def recv_against_a_collective():
    if dist.rank() == 0:
        return dist.recv(1)
    return dist.all_reduce(np.ones(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_rank_receiving_first_is_a_named_deadlock(backend):
    assert fails(everyone_receives_first, 2, backend) == (
        "deadlock: rank 0 waits in recv #0 from rank 1, rank 1 waits in recv #0 from rank 0"
        + DEADLOCK_ADVICE
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_recv_whose_sender_never_sends_and_a_send_nobody_receives(backend):
    assert fails(never_sends, 2, backend) == (
        "rank 1 is waiting in recv #0 from rank 0 but rank 0 has already returned: every send "
        "needs a recv on its destination, and every recv a send on its source"
    )
    assert fails(nobody_receives, 2, backend).startswith(
        "rank 0 is waiting in send #0 to rank 1 but rank 1 has already returned"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatched_shapes_and_dtypes_are_named_before_any_data_moves(backend):
    assert fails(other_shape, 2, backend) == (
        "send #0 from rank 0 to rank 1: the shapes differ: rank 0 sends (2, 3) but rank 1 "
        "receives (3, 2)"
    )
    assert fails(other_dtype, 2, backend) == (
        "send #0 from rank 0 to rank 1: the dtypes differ: rank 0 sends float32 but rank 1 "
        "receives float64"
    )


def test_sending_first_around_a_ring_and_a_recv_against_a_collective_on_the_simulated_world():
    assert fails(everyone_sends_first, 3, "sim") == (
        "deadlock: rank 0 waits in send #0 to rank 1, rank 1 waits in send #0 to rank 2, "
        "rank 2 waits in send #0 to rank 0" + DEADLOCK_ADVICE
    )
    assert fails(recv_against_a_collective, 2, "sim") == (
        "deadlock: rank 0 waits in recv #0 from rank 1, rank 1 waits in all_reduce #0"
        + DEADLOCK_ADVICE
    )


@pytest.mark.skipif(not dist.is_available("gloo"), reason="no gloo")
def test_sending_first_around_a_ring_and_a_recv_against_a_collective_on_gloo():
    """The same words as the simulated world's (the test above): the ranks' waits are read
    from the process group's store and the pool's status files."""
    assert fails(everyone_sends_first, 3, "gloo") == (
        "deadlock: rank 0 waits in send #0 to rank 1, rank 1 waits in send #0 to rank 2, "
        "rank 2 waits in send #0 to rank 0" + DEADLOCK_ADVICE
    )
    assert fails(recv_against_a_collective, 2, "gloo") == (
        "deadlock: rank 0 waits in recv #0 from rank 1, rank 1 waits in all_reduce #0"
        + DEADLOCK_ADVICE
    )


def raises_before_sending():
    if dist.rank() == 0:
        raise ValueError("no data")
    return dist.recv(0)


def catches_the_mismatch():
    try:
        other_shape()
    except dist.CollectiveError:
        return "caught"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sender_that_raises_and_a_caught_mismatch_fail_the_run(backend):
    message = fails(raises_before_sending, 2, backend, error=dist.RankError)
    assert message.startswith("rank 0 raised ValueError: no data")
    assert fails(catches_the_mismatch, 2, backend).startswith(
        "send #0 from rank 0 to rank 1: the shapes differ"
    )
