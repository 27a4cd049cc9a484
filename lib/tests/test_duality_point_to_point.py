"""The point-to-point rows: the backward of a send is a recv of the gradient, the backward of a
recv a send of it back; adjoint-tested and equal to one process on 2–4 ranks, on the simulated
world and on gloo (engine rows and torch autograd Functions)."""

import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.parallel import duality
from chainrule.parallel.dist_adjoint import compare_with_single_process, distributed_adjoint_test
from chainrule.parallel.duality import PER_RANK, POINT_TO_POINT_TABLE

gloo = pytest.mark.skipif(not dist.is_available("gloo"), reason="no gloo")


def check(fn, world_size, backend, framework="engine"):
    forward, backward = distributed_adjoint_test(
        fn, [(2, 3)], PER_RANK, PER_RANK, world_size, backend, framework
    )
    assert forward != 0.0 and backward == pytest.approx(forward, rel=1e-12, abs=1e-12)
    rng = np.random.default_rng(world_size)
    inputs = [rng.standard_normal((2, 3)) for _ in range(world_size)]
    error = compare_with_single_process(
        fn, duality.global_pass_to_next, inputs, PER_RANK, PER_RANK, world_size, backend, framework
    )
    assert error.output == 0.0 and error.gradient == 0.0  # values move, nothing is added


def test_the_rows_say_what_their_backward_is():
    send, recv = POINT_TO_POINT_TABLE
    assert (send.key, recv.key) == ("send", "recv")
    assert send.backward.startswith("recv") and recv.backward.startswith("send")
    assert not any(row.in_syllabus for row in POINT_TO_POINT_TABLE)
    assert {row.key for row in duality.DUALITY_TABLE}.isdisjoint({"send", "recv"})
    assert send.torch_fn.__name__ == send.engine_fn.__name__ == "pass_to_next"


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_engine_rows_on_the_simulated_world(world_size):
    check(duality.pass_to_next, world_size, "sim")


def _traced(x):
    y = duality.pass_to_next(Tensor(x, requires_grad=True))
    dist.barrier()
    y.backward(np.ones(y.shape))
    return None


def test_forward_and_backward_move_what_the_table_says():
    trace = dist.Trace()
    dist.run(_traced, 3, args=(np.ones((2, 3)),), trace=trace)
    rows = [(e.op, e.kwargs.get("src"), e.kwargs.get("dst")) for e in trace]
    split = rows.index(("barrier", None, None))
    assert sorted(rows[:split]) == [("send", 0, 1), ("send", 1, 2)]  # the values, forward
    assert sorted(rows[split + 1 :]) == [("send", 1, 0), ("send", 2, 1)]  # gradients, back
    assert {e.nbytes for e in trace if e.op == "send"} == {48}


def send_without_its_recv(x):
    """A hand-written send row that forgets the gradient: its VJP returns zeros."""
    r, P = dist.rank(), dist.world_size()
    x = Tensor(x.data, requires_grad=True) if not isinstance(x, Tensor) else x
    y = duality.recv_from_rank(r - 1) if r > 0 else x * 0.0
    if r < P - 1:
        dist.send(x.data, r + 1)
        phony = Tensor.from_op(np.zeros(0), (x,), lambda g: (np.zeros(x.shape),), "wrong")
        y = y + phony.sum()
    return y


def test_a_send_whose_backward_receives_nothing_is_caught_not_hung():
    """Rank 1's recv row sends its gradient back; rank 0 goes on to the test's all-reduce."""
    with pytest.raises(dist.CollectiveError) as info:
        distributed_adjoint_test(send_without_its_recv, [(2, 3)], PER_RANK, PER_RANK, 2)
    assert str(info.value).startswith(
        "deadlock: rank 0 waits in all_reduce #0, rank 1 waits in send #0 to rank 0;"
    )


@gloo
@pytest.mark.parametrize("framework", ["engine", "torch"])
def test_rows_on_gloo(framework):
    row = POINT_TO_POINT_TABLE[0]
    fn = row.engine_fn if framework == "engine" else row.torch_fn
    for world_size in (2, 3):
        check(fn, world_size, "gloo", framework)
