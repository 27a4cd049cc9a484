"""The capstone's transformer: its tensor-parallel part equals the whole model, and training on a
dp × tp grid equals one process (float64 on the simulated world, float32 on gloo)."""

from __future__ import annotations

import numpy as np
import pytest
from chainrule import Tensor, dist
from chainrule.engine.optim import SGD
from chainrule.parallel import transformer as tf
from chainrule.parallel.data_parallel import DataParallel

TEXT = "reverse mode is a chain of vector-Jacobian products; fan-out becomes a sum. " * 4


def _training(dtype: str = "float64", steps: int = 6, batch: int = 4) -> tf.Training:
    chars = tf.vocabulary(TEXT)
    config = tf.Config(
        vocab=len(chars), context=8, width=16, heads=4, layers=2, hidden=16, dtype=dtype
    )
    windows = tf.batches(tf.encode(TEXT, chars), steps, batch, config.context, seed=3)
    return tf.Training(config, tf.init_weights(config, seed=2), windows, lr=0.2)


def test_batches_are_windows_of_consecutive_tokens():
    ids = np.arange(100)
    windows = tf.batches(ids, 3, 5, 7, seed=0)
    assert windows.shape == (3, 5, 8)
    assert (np.diff(windows, axis=-1) == 1).all()


def test_the_tensor_parallel_loss_and_gradients_equal_the_whole_model():
    t = _training()
    windows = t.windows[0]
    whole = {n: Tensor(w, requires_grad=True) for n, w in t.weights.items()}
    reference = tf.loss(whole, windows, t.config)
    reference.backward()

    def on_row():
        g = dist.grid(1, 2)
        local = tf.shard_weights(t.weights, g.tp_rank, 2)
        params = {n: Tensor(w, requires_grad=True) for n, w in local.items()}
        value = tf.loss(params, windows, t.config, g.tp_group)
        value.backward()
        return float(value.data), {n: p.grad for n, p in params.items()}

    results = dist.run(on_row, 2)
    for tp_rank, (value, grads) in enumerate(results):
        assert value == pytest.approx(float(reference.data), abs=1e-12)
        expected = tf.shard_weights({n: p.grad for n, p in whole.items()}, tp_rank, 2)
        for name, grad in grads.items():
            np.testing.assert_allclose(grad, expected[name], atol=1e-12, err_msg=name)


@pytest.mark.parametrize(("dp", "tp"), [(2, 2), (4, 1), (1, 4), (3, 1)])
def test_training_on_a_grid_equals_one_process_in_float64(dp, tp):
    t = _training(batch=12)
    one = tf.train_one_process(t)
    curves = dist.run(tf.train_on_grid, dp * tp, args=(t, dp, tp))
    assert all(curve == curves[0] for curve in curves)
    np.testing.assert_allclose(curves[0], one, rtol=0, atol=1e-12)
    assert one[-1] < one[0]


def test_training_on_four_gloo_processes_in_float32_is_within_float32_rounding():
    t64, t32 = _training(), _training("float32")
    one64, one32 = np.array(tf.train_one_process(t64)), np.array(tf.train_one_process(t32))
    gloo = dist.run(tf.train_on_grid, 4, backend="gloo", args=(t32, 2, 2), timeout=120)
    rounding = np.abs(one32 - one64).max()
    assert 0 < rounding < 1e-4
    assert np.abs(np.array(gloo[0]) - one32).max() <= 4 * rounding


def test_a_missing_average_over_the_column_is_caught_by_the_comparison():
    t = _training(batch=4)
    one = tf.train_one_process(t)

    def no_data_parallel_average():
        g = dist.grid(2, 1)
        params = {n: Tensor(w.copy(), requires_grad=True) for n, w in t.weights.items()}
        alone = DataParallel(params.values(), group=dist.new_group([g.dp_rank]))
        optimizer = SGD(params.values(), t.lr, t.momentum)
        losses = []
        for windows in t.windows:
            value = tf.loss(params, np.split(windows, 2)[g.dp_rank], t.config)
            alone.backward(value)
            losses.append(float(dist.all_reduce(value.data, op="avg", group=g.dp_group)))
            optimizer.step()
            optimizer.zero_grad()
        return losses

    curve = dist.run(no_data_parallel_average, 2)[0]
    assert np.abs(np.array(curve) - one).max() > 1e-3
