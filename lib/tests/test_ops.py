"""Every op's forward and VJP against torch.autograd (float64) and against finite differences.

The property tests draw shapes (with broadcasting) and a seed; the values come from the seed.
For each op we compare the forward value and the VJP ``Jᵀ v`` for a random cotangent ``v``.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from chainrule.engine import ops
from chainrule.engine.gradcheck import gradcheck
from chainrule.engine.tensor import Tensor
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

TOL = {"rtol": 1e-10, "atol": 1e-12}
seeds = st.integers(0, 2**32 - 1)
small_shapes = array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)
pairs_of_shapes = mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4)


def compare_with_torch(our_fn, torch_fn, arrays, rng, check_inputs=None):
    """Run both engines on the same float64 inputs; compare outputs and VJPs for a random v."""
    ours = [Tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = our_fn(*ours)
    expected = torch_fn(*theirs)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), **TOL)
    assert out.data.shape == tuple(expected.shape)
    v = rng.standard_normal(out.data.shape)
    out.backward(v)
    expected.backward(torch.tensor(v))
    for i, (x, t) in enumerate(zip(ours, theirs, strict=True)):
        if check_inputs is not None and i not in check_inputs:
            continue
        assert x.grad is not None, f"input {i} got no gradient"
        assert x.grad.shape == x.data.shape
        np.testing.assert_allclose(x.grad, t.grad.numpy(), err_msg=f"input {i}", **TOL)


# -- arithmetic with broadcasting ---------------------------------------------------------


@pytest.mark.parametrize(
    "our_fn, torch_fn, positive_b",
    [
        (ops.add, torch.add, False),
        (ops.sub, torch.sub, False),
        (ops.mul, torch.mul, False),
        (ops.div, torch.div, True),
        (lambda a, b: a + b, lambda a, b: a + b, False),
        (lambda a, b: a - b, lambda a, b: a - b, False),
        (lambda a, b: a * b, lambda a, b: a * b, False),
        (lambda a, b: a / b, lambda a, b: a / b, True),
    ],
    ids=["add", "sub", "mul", "div", "+", "-", "*", "/"],
)
@given(shapes=pairs_of_shapes, seed=seeds)
def test_binary_ops_broadcast_like_torch(our_fn, torch_fn, positive_b, shapes, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    a = rng.standard_normal(sa)
    b = rng.standard_normal(sb)
    if positive_b:
        b = np.abs(b) + 0.5
    compare_with_torch(our_fn, torch_fn, [a, b], rng)


@given(shapes=pairs_of_shapes, seed=seeds)
def test_pow_tensor_tensor_like_torch(shapes, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    a = rng.uniform(0.5, 2.0, sa)
    b = rng.standard_normal(sb)
    compare_with_torch(ops.pow, torch.pow, [a, b], rng)


@pytest.mark.parametrize("p", [2, 3, 0.5, -1.5, 1])
@given(shape=small_shapes, seed=seeds)
def test_pow_number_like_torch(p, shape, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 2.0, shape)
    compare_with_torch(lambda x: x**p, lambda x: x**p, [a], rng)


def test_pow_tensor_exponent_at_zero_base_has_zero_exponent_gradient():
    a = Tensor(np.array([0.0, 2.0]), requires_grad=True)
    b = Tensor(np.array([2.0, 3.0]), requires_grad=True)
    ops.pow(a, b).sum().backward()
    assert b.grad[0] == 0.0
    assert np.isclose(b.grad[1], 8.0 * np.log(2.0))


@given(shape=small_shapes, seed=seeds)
def test_neg_like_torch(shape, seed):
    rng = np.random.default_rng(seed)
    compare_with_torch(lambda x: -x, torch.neg, [rng.standard_normal(shape)], rng)


matmul_shapes = st.sampled_from(
    [
        ((3,), (3,)),
        ((3,), (3, 2)),
        ((2, 3), (3,)),
        ((2, 3), (3, 4)),
        ((5, 2, 3), (3, 4)),
        ((2, 3), (5, 3, 4)),
        ((5, 2, 3), (5, 3, 4)),
        ((1, 2, 3), (4, 3, 2)),
        ((3,), (2, 3, 4)),
        ((2, 2, 3), (3,)),
        ((2, 1, 2, 3), (3, 3, 1)),
    ]
)


@given(shapes=matmul_shapes, seed=seeds)
def test_matmul_like_numpy_and_torch(shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(s) for s in shapes)
    compare_with_torch(ops.matmul, torch.matmul, [a, b], rng)
    compare_with_torch(lambda x, y: x @ y, lambda x, y: x @ y, [a, b], rng)


def test_matmul_with_constant_operand_gives_gradient_only_to_the_tensor(rng):
    w = Tensor(rng.standard_normal((3, 2)), requires_grad=True)
    x = rng.standard_normal((4, 3))
    (x @ w).sum().backward()
    np.testing.assert_allclose(w.grad, x.T @ np.ones((4, 2)))


# -- elementwise ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, our_fn, torch_fn, domain",
    [
        ("exp", ops.exp, torch.exp, "any"),
        ("log", ops.log, torch.log, "positive"),
        ("tanh", ops.tanh, torch.tanh, "any"),
        ("relu", ops.relu, torch.relu, "any"),
        ("sigmoid", ops.sigmoid, torch.sigmoid, "wide"),
        ("Tensor.exp", Tensor.exp, torch.exp, "any"),
        ("Tensor.sigmoid", Tensor.sigmoid, torch.sigmoid, "any"),
    ],
)
@given(shape=small_shapes, seed=seeds)
def test_elementwise_like_torch(name, our_fn, torch_fn, domain, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if domain == "positive":
        x = np.abs(x) + 0.1
    elif domain == "wide":
        x = 30 * x  # far into both tails: no overflow, no cancellation
    compare_with_torch(our_fn, torch_fn, [x], rng)


def test_sigmoid_does_not_overflow():
    x = Tensor(np.array([-1000.0, 0.0, 1000.0]), requires_grad=True)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = ops.sigmoid(x)
    np.testing.assert_array_equal(y.data, [0.0, 0.5, 1.0])


def test_relu_gradient_at_zero_is_zero_like_torch():
    x = Tensor(np.array([-1.0, 0.0, 2.0]), requires_grad=True)
    ops.relu(x).sum().backward()
    t = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    torch.relu(t).sum().backward()
    np.testing.assert_array_equal(x.grad, t.grad.numpy())


# -- reductions -----------------------------------------------------------------------------


@st.composite
def shape_and_axis(draw):
    shape = draw(array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    ndim = len(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return shape, None
    if kind == "int":
        return shape, draw(st.integers(-ndim, ndim - 1))
    axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return shape, tuple(axes)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@given(case=shape_and_axis(), keepdims=st.booleans(), seed=seeds)
def test_reductions_like_torch(reduction, case, keepdims, seed):
    shape, axis = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    ours = getattr(ops, reduction)
    theirs = getattr(torch, reduction)
    if axis is None:
        torch_fn = (
            (lambda t: theirs(t))
            if not keepdims
            else (lambda t: theirs(t).reshape((1,) * len(shape)))
        )
    else:
        torch_fn = lambda t: theirs(t, dim=axis, keepdim=keepdims)  # noqa: E731
    compare_with_torch(lambda t: ours(t, axis=axis, keepdims=keepdims), torch_fn, [x], rng)


def test_sum_gradient_is_a_writable_array_of_the_input_shape(rng):
    x = Tensor(rng.standard_normal((2, 3)), requires_grad=True)
    x.sum().backward()
    assert x.grad.shape == (2, 3)
    x.grad *= 2  # an optimiser may scale gradients in place
    np.testing.assert_array_equal(x.grad, np.full((2, 3), 2.0))


# -- shape ops -------------------------------------------------------------------------------


@given(shape=array_shapes(min_dims=1, max_dims=4, max_side=4), seed=seeds)
def test_reshape_and_transpose_like_torch(shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    perm = tuple(int(i) for i in rng.permutation(len(shape)))
    compare_with_torch(lambda t: t.reshape(-1), lambda t: t.reshape(-1), [x], rng)
    compare_with_torch(lambda t: ops.transpose(t, perm), lambda t: t.permute(*perm), [x], rng)
    compare_with_torch(lambda t: t.T, lambda t: t.permute(*reversed(range(len(shape)))), [x], rng)
    compare_with_torch(lambda t: t.transpose(*perm), lambda t: t.permute(*perm), [x], rng)


@st.composite
def index_cases(draw):
    kind = draw(
        st.sampled_from(["int", "slice", "ellipsis", "int_array", "bool", "mixed", "newaxis"])
    )
    shape = draw(array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=5))
    n = shape[0]
    if kind == "int":
        return shape, draw(st.integers(-n, n - 1))
    if kind == "slice":
        start = draw(st.integers(-n, n))
        step = draw(st.sampled_from([1, 2, -1]))
        return shape, (slice(start, None, step), slice(None, None, 2))
    if kind == "ellipsis":
        return shape, (Ellipsis, 0)
    if kind == "int_array":  # with repeated indices: their gradients must add up
        idx = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8))
        return shape, np.array(idx)
    if kind == "bool":
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return shape, np.array(mask)
    if kind == "newaxis":
        return shape, (None, slice(1, None))
    rows = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=5))
    cols = draw(st.lists(st.integers(0, shape[1] - 1), min_size=len(rows), max_size=len(rows)))
    return shape, (np.array(rows), np.array(cols))


@given(case=index_cases(), seed=seeds)
def test_getitem_like_torch(case, seed):
    shape, index = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if isinstance(index, tuple):
        torch_index = tuple(torch.tensor(i) if isinstance(i, np.ndarray) else i for i in index)
    else:
        torch_index = torch.tensor(index) if isinstance(index, np.ndarray) else index
    if isinstance(index, tuple) and any(isinstance(i, slice) and (i.step or 1) < 0 for i in index):
        # torch has no negative steps: read the reversed rows with flip instead
        sl = index[0]
        torch_fn = lambda t: t.flip(0)[slice(n_flip(shape[0], sl.start), None)][:, ::2]  # noqa: E731
    else:
        torch_fn = lambda t: t[torch_index]  # noqa: E731
    compare_with_torch(lambda t: t[index], torch_fn, [x], rng)


def n_flip(n, start):
    """Where ``x[start::-1]`` begins in ``x.flip(0)``."""
    start = n - 1 if start is None else (start + n if start < 0 else start)
    start = min(max(start, -1), n - 1)
    return n - 1 - start


def test_getitem_repeated_indices_add_up():
    x = Tensor(np.arange(4.0), requires_grad=True)
    x[np.array([1, 1, 1, 3])].sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 3.0, 0.0, 1.0])


@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    other=array_shapes(min_dims=0, max_dims=2, max_side=3),
    axis_pos=st.integers(0, 2),
    seed=seeds,
)
def test_concat_split_stack_like_torch(sizes, other, axis_pos, seed):
    rng = np.random.default_rng(seed)
    axis = min(axis_pos, len(other))
    shapes = [other[:axis] + (s,) + other[axis:] for s in sizes]
    arrays = [rng.standard_normal(s) for s in shapes]
    n = len(arrays)
    compare_with_torch(
        lambda *ts: ops.concat(ts, axis=axis), lambda *ts: torch.cat(ts, dim=axis), arrays, rng
    )
    whole = np.concatenate(arrays, axis=axis)

    def our_split(t):
        return ops.concat([p * (i + 1) for i, p in enumerate(ops.split(t, sizes, axis=axis))], axis)

    def torch_split(t):
        return torch.cat([p * (i + 1) for i, p in enumerate(torch.split(t, sizes, dim=axis))], axis)

    compare_with_torch(our_split, torch_split, [whole], rng)
    same = [rng.standard_normal(other) for _ in range(n)]
    compare_with_torch(
        lambda *ts: ops.stack(ts, axis=axis), lambda *ts: torch.stack(ts, dim=axis), same, rng
    )


def test_split_into_equal_sections(rng):
    x = Tensor(rng.standard_normal((6, 2)), requires_grad=True)
    pieces = ops.split(x, 3)
    assert [p.shape for p in pieces] == [(2, 2)] * 3
    np.testing.assert_array_equal(np.concatenate([p.data for p in pieces]), x.data)


# -- nn ops ----------------------------------------------------------------------------------


@given(shape=array_shapes(min_dims=1, max_dims=3, max_side=5), seed=seeds, data=st.data())
def test_softmax_and_log_softmax_like_torch(shape, seed, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = 5 * rng.standard_normal(shape)
    compare_with_torch(
        lambda t: ops.softmax(t, axis), lambda t: torch.softmax(t, dim=axis), [x], rng
    )
    compare_with_torch(
        lambda t: ops.log_softmax(t, axis), lambda t: torch.log_softmax(t, dim=axis), [x], rng
    )


def test_log_softmax_is_stable_for_huge_logits():
    x = Tensor(np.array([[1000.0, 0.0, -1000.0]]), requires_grad=True)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = ops.log_softmax(x)
        y.sum().backward()
    assert np.isfinite(y.data).all() and np.isfinite(x.grad).all()
    np.testing.assert_allclose(y.data, [[0.0, -1000.0, -2000.0]])


def torch_masked_cross_entropy(logits, targets, mask, reduction):
    per_token = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), torch.tensor(targets.reshape(-1)), reduction="none"
    )
    m = torch.tensor(mask.reshape(-1))
    total = (per_token * m).sum()
    return total / m.sum() if reduction == "mean" else total


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@given(
    lead=array_shapes(min_dims=1, max_dims=2, max_side=5),
    classes=st.integers(2, 6),
    use_mask=st.booleans(),
    seed=seeds,
)
def test_cross_entropy_like_torch(reduction, lead, classes, use_mask, seed):
    rng = np.random.default_rng(seed)
    logits = 3 * rng.standard_normal(lead + (classes,))
    targets = rng.integers(0, classes, lead)
    mask = (rng.random(lead) < 0.7).astype(float)
    mask.reshape(-1)[0] = 1.0  # at least one real token
    if not use_mask:
        mask = np.ones(lead)
    compare_with_torch(
        lambda z: ops.cross_entropy(z, targets, mask if use_mask else None, reduction),
        lambda z: torch_masked_cross_entropy(z, targets, mask, reduction),
        [logits],
        rng,
    )


def test_cross_entropy_without_mask_equals_torch_default(rng):
    logits = rng.standard_normal((7, 4))
    targets = rng.integers(0, 4, 7)
    compare_with_torch(
        lambda z: ops.cross_entropy(z, targets),
        lambda z: F.cross_entropy(z, torch.tensor(targets)),
        [logits],
        rng,
    )


def test_cross_entropy_mean_divides_by_real_tokens_only(rng):
    logits = rng.standard_normal((2, 3, 5))
    targets = rng.integers(0, 5, (2, 3))
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    total = ops.cross_entropy(logits, targets, mask, reduction="sum").item()
    mean = ops.cross_entropy(logits, targets, mask, reduction="mean").item()
    assert np.isclose(mean, total / 3)
    # padding positions do not matter at all
    changed = logits.copy()
    changed[mask == 0] = 100 * rng.standard_normal((3, 5))
    assert np.isclose(ops.cross_entropy(changed, targets, mask).item(), mean)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@given(shapes=pairs_of_shapes, seed=seeds)
def test_mse_loss_like_torch(reduction, shapes, seed):
    rng = np.random.default_rng(seed)
    sp, _ = shapes.input_shapes
    pred, target = rng.standard_normal(sp), rng.standard_normal(sp)
    compare_with_torch(
        lambda p, t: ops.mse_loss(p, t, reduction),
        lambda p, t: F.mse_loss(p, t, reduction=reduction),
        [pred, target],
        rng,
    )


@pytest.mark.parametrize("affine", [True, False])
@given(shape=array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=6), seed=seeds)
def test_layer_norm_like_torch(affine, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 3 + 1
    d = shape[-1]
    if affine:
        arrays = [x, rng.standard_normal(d), rng.standard_normal(d)]
        compare_with_torch(
            lambda t, w, b: ops.layer_norm(t, w, b, eps=1e-5),
            lambda t, w, b: F.layer_norm(t, (d,), w, b, eps=1e-5),
            arrays,
            rng,
        )
    else:
        compare_with_torch(
            lambda t: ops.layer_norm(t, eps=1e-5),
            lambda t: F.layer_norm(t, (d,), eps=1e-5),
            [x],
            rng,
        )


@pytest.mark.parametrize("affine", [True, False])
@given(shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6), seed=seeds)
def test_rms_norm_like_torch(affine, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    d = shape[-1]
    arrays = [x, rng.standard_normal(d)] if affine else [x]
    compare_with_torch(
        lambda t, *w: ops.rms_norm(t, *w, eps=1e-6),
        lambda t, *w: F.rms_norm(t, (d,), *w, eps=1e-6),
        arrays,
        rng,
    )


@pytest.mark.parametrize("affine", [True, False])
@settings(max_examples=10)  # torch's batch_norm alone takes up to ~0.1 s a call here
@given(batch=st.integers(2, 8), features=st.integers(1, 5), seed=seeds)
def test_batch_norm_training_mode_like_torch(affine, batch, features, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, features)) * 2 - 1
    arrays = [x, rng.standard_normal(features), rng.standard_normal(features)] if affine else [x]

    def torch_fn(t, *wb):
        return F.batch_norm(t, None, None, *wb, training=True, eps=1e-5)

    compare_with_torch(lambda t, *wb: ops.batch_norm(t, *wb, eps=1e-5), torch_fn, arrays, rng)


def test_batch_norm_mixes_the_batch_but_layer_norm_does_not(rng):
    """Changing example 0 changes batch norm's output for example 1, not layer norm's."""
    x = rng.standard_normal((4, 3))
    y = x.copy()
    y[0] += 5.0
    assert not np.allclose(ops.batch_norm(x).data[1], ops.batch_norm(y).data[1])
    np.testing.assert_allclose(ops.layer_norm(x).data[1], ops.layer_norm(y).data[1])
    np.testing.assert_allclose(ops.rms_norm(x).data[1], ops.rms_norm(y).data[1])


# -- finite differences (independent of torch) -----------------------------------------------

FD_CASES = {
    "add": (lambda a, b: (a + b) ** 2, [(3, 1), (4,)]),
    "sub": (lambda a, b: (a - b) ** 2, [(3, 4), (1, 4)]),
    "mul": (lambda a, b: a * b, [(2, 3), (3,)]),
    "div": (lambda a, b: a / (b * b + 1), [(2, 3), (2, 1)]),
    "pow": (lambda a, b: ops.pow(a * a + 1, b), [(2, 3), (3,)]),
    "matmul": (lambda a, b: ops.tanh(a @ b), [(2, 3, 4), (4, 2)]),
    "matvec": (lambda a, b: a @ b, [(3,), (2, 3, 2)]),
    "exp_log": (lambda a: ops.log(ops.exp(a) + 1), [(3, 2)]),
    "sigmoid_relu": (lambda a: ops.sigmoid(a) * ops.relu(a), [(5,)]),
    "sum_mean": (lambda a: a.sum(axis=0) * a.mean(axis=(0, 1), keepdims=True), [(3, 2, 2)]),
    "reshape_T": (lambda a: a.reshape(2, 6).T * np.arange(12.0).reshape(6, 2), [(3, 4)]),
    "getitem": (lambda a: a[np.array([0, 2, 0]), 1:] ** 2, [(3, 3)]),
    "concat": (lambda a, b: ops.concat([a, b * b], axis=1) ** 2, [(2, 1), (2, 3)]),
    "split": (lambda a: ops.split(a, [1, 2], axis=1)[1] ** 3, [(2, 3)]),
    "stack": (lambda a, b: ops.stack([a, b], axis=1) ** 2, [(2, 3), (2, 3)]),
    "softmax": (lambda a: ops.softmax(a) ** 2, [(2, 4)]),
    "log_softmax": (lambda a: ops.log_softmax(a, axis=0) ** 2, [(3, 2)]),
    "cross_entropy": (
        lambda a: ops.cross_entropy(a, np.array([[0, 2], [1, 1]]), np.array([[1, 0], [1, 1]])),
        [(2, 2, 3)],
    ),
    "mse": (lambda a, b: ops.mse_loss(a, b), [(3, 2), (3, 2)]),
    "layer_norm": (lambda a, w, b: ops.layer_norm(a, w, b) ** 2, [(3, 4), (4,), (4,)]),
    "rms_norm": (lambda a, w: ops.rms_norm(a, w) ** 2, [(3, 4), (4,)]),
    "batch_norm": (lambda a, w, b: ops.batch_norm(a, w, b) ** 3, [(4, 3), (3,), (3,)]),
}


@pytest.mark.parametrize("name", list(FD_CASES))
def test_op_gradients_match_central_differences(name, rng):
    fn, shapes = FD_CASES[name]
    inputs = [rng.standard_normal(s) for s in shapes]
    weights = None

    def scalar(xs):
        nonlocal weights
        out = fn(*xs)
        if weights is None:
            weights = rng.standard_normal(out.shape)
        return (out * weights).sum()

    assert gradcheck(scalar, inputs, atol=1e-7, rtol=1e-5)
