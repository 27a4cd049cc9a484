"""The duality table on real processes (gloo): torch autograd Functions and engine rows.

Each check is one ``dist.run`` call on a pool of gloo worker processes that ``dist.run`` keeps
alive between calls, so after the pool's start a check costs milliseconds.
"""

from functools import partial

import numpy as np
import pytest
import torch
from chainrule import dist
from chainrule.parallel import duality, duality_torch
from chainrule.parallel.dist_adjoint import compare_with_single_process, distributed_adjoint_test
from chainrule.parallel.duality import DUALITY_TABLE, PER_RANK

TOL = 1e-12


def input_shape(row):
    return (12, 3) if row.key in ("reduce_scatter", "all_to_all", "split") else (2, 3)


def random_inputs(row, world_size, seed=1, shape=None):
    rng = np.random.default_rng(seed)
    count = 1 if row.input_kind == duality.REPLICATED else world_size
    return [rng.standard_normal(shape or input_shape(row)) for _ in range(count)]


def test_every_row_runs_on_the_torch_autograd_function():
    assert {row.key for row in DUALITY_TABLE} == set(duality_torch.ROWS)
    assert issubclass(duality_torch.Row, torch.autograd.Function)
    for row in DUALITY_TABLE:
        assert row.torch_fn.__name__ == row.engine_fn.__name__
    assert duality_torch.f is duality_torch.copy_to_ranks
    assert duality_torch.f_bar is duality_torch.reduce_from_ranks


def check_row(fn, global_fn, row, world_size, framework, shape=None):
    shape = shape or input_shape(row)
    forward, backward = distributed_adjoint_test(
        fn, [shape], row.input_kind, row.output_kind, world_size, "gloo", framework
    )
    assert forward != 0.0
    assert backward == pytest.approx(forward, rel=TOL, abs=TOL)
    inputs = random_inputs(row, world_size, shape=shape)
    error = compare_with_single_process(
        fn, global_fn, inputs, row.input_kind, row.output_kind, world_size, "gloo", framework
    )
    assert error.output <= TOL
    assert error.gradient <= TOL


@pytest.mark.parametrize("row", DUALITY_TABLE, ids=lambda r: r.key)
def test_torch_rows_on_two_processes(row):
    check_row(row.torch_fn, row.global_fn, row, 2, "torch")


@pytest.mark.parametrize("row", DUALITY_TABLE, ids=lambda r: r.key)
def test_engine_rows_on_two_processes(row):
    check_row(row.engine_fn, row.global_fn, row, 2, "engine")


def test_torch_all_to_all_with_different_axes_on_two_processes():
    row = duality.duality_row("all_to_all")
    fn = partial(duality_torch.all_to_all_ranks, split_axis=1, concat_axis=0)
    global_fn = partial(duality.global_all_to_all, split_axis=1, concat_axis=0)
    check_row(fn, global_fn, row, 2, "torch", shape=(3, 4))


@pytest.mark.slow
def test_torch_rows_on_four_processes():
    for row in DUALITY_TABLE:
        check_row(row.torch_fn, row.global_fn, row, 4, "torch")


def f_without_all_reduce(x):
    """A hand-written f that forgets its backward all-reduce."""
    return x.clone()


def test_a_wrong_torch_backward_is_caught_on_real_processes():
    row = duality.duality_row("identity")
    forward, backward = distributed_adjoint_test(
        f_without_all_reduce,
        [(3,)],
        row.input_kind,
        PER_RANK,
        2,
        "gloo",
        "torch",
        check_replication=False,
    )
    assert backward != pytest.approx(forward, rel=1e-6)


def backward_keeps_the_incoming_gradient():
    """The backward passes reduce a copy: the caller's gradient tensor is left as it was."""
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    g = torch.full((4,), float(dist.rank() + 1), dtype=torch.float64)
    duality_torch.copy_to_ranks(x).backward(g)
    return g.clone(), x.grad.clone()


def test_torch_backward_does_not_write_into_the_incoming_gradient():
    for rank, (g, x_grad) in enumerate(dist.run(backward_keeps_the_incoming_gradient, 2, "gloo")):
        np.testing.assert_array_equal(g.numpy(), np.full(4, rank + 1.0))
        np.testing.assert_array_equal(x_grad.numpy(), np.full(4, 3.0))


def gradients_the_caller_holds_are_never_written():
    """f's backward all-reduces: every gradient tensor someone else holds must stay as it was."""
    r = dist.rank()
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    g = torch.full((4,), float(r + 1), dtype=torch.float64)
    cases = {}

    def check(name, backward):
        x.grad = None
        kept = backward()
        cases[name] = (g.tolist(), [t.tolist() for t in kept], x.grad.tolist())

    def through_f_bar():
        duality_torch.reduce_from_ranks(duality_torch.copy_to_ranks(x)).backward(g)
        return []

    def kept_by_a_hook():
        stash = []
        y = duality_torch.copy_to_ranks(x)
        y.register_hook(stash.append)
        (y * 2).backward(g)
        return stash

    def sent_to_two_branches():
        # mul makes a new gradient, add passes that one tensor to both branches
        ((duality_torch.copy_to_ranks(x) + x * 1) * 1).backward(g)
        return []

    def second_derivative_graph():
        (duality_torch.copy_to_ranks(x) * 2).backward(g, create_graph=True)
        return []

    def retained():
        y = duality_torch.copy_to_ranks(x) * 1
        z = duality_torch.copy_to_ranks(y)
        y.retain_grad()
        (z * 2).backward(g)
        return [y.grad]

    check("through f_bar", through_f_bar)
    check("kept by a hook", kept_by_a_hook)
    check("sent to two branches", sent_to_two_branches)
    check("second derivative graph", second_derivative_graph)
    check("retained", retained)
    x.grad = None
    return cases


def test_no_backward_writes_into_a_gradient_someone_holds():
    for rank, cases in enumerate(dist.run(gradients_the_caller_holds_are_never_written, 2, "gloo")):
        g = [rank + 1.0] * 4
        assert cases["through f_bar"] == (g, [], [3.0] * 4)
        assert cases["kept by a hook"] == (g, [[2 * (rank + 1.0)] * 4], [6.0] * 4)
        assert cases["sent to two branches"] == (g, [], [3.0 + rank + 1.0] * 4)
        assert cases["second derivative graph"] == (g, [], [6.0] * 4)
        assert cases["retained"] == (g, [[6.0] * 4], [12.0] * 4)


COUNTS = [[0, 2, 1], [3, 0, 1], [1, 1, 0]]  # rank i sends COUNTS[i][j] rows to rank j


def uneven_dispatch(send_known):
    r = dist.rank()
    x = torch.arange(sum(COUNTS[r]) * 2.0, dtype=torch.float64).reshape(-1, 2) + 10 * r
    x.requires_grad_(True)
    receive = [row[r] for row in COUNTS] if send_known else None
    y = duality_torch.all_to_all_ranks(x, send_counts=COUNTS[r], recv_counts=receive)
    y.backward(y.detach() * 2 + 1)  # the cotangent of each row names the row
    return x.detach().numpy(), y.detach().numpy(), x.grad.numpy()


@pytest.mark.parametrize("send_known", [True, False])
def test_the_uneven_torch_all_to_all_row_sends_every_gradient_row_back(send_known):
    results = dist.run(uneven_dispatch, 3, "gloo", args=(send_known,))
    for r, (x, y, grad) in enumerate(results):
        expected = np.concatenate(
            [np.split(results[j][0], np.cumsum(COUNTS[j])[:-1])[r] for j in range(3)]
        )
        np.testing.assert_array_equal(y, expected)
        np.testing.assert_array_equal(grad, x * 2 + 1)
