"""Pipeline parallelism: the schedules' bubble and activation memory, and the pipelined step's
gradients equal to one process (float64 on the simulated world, float32 on gloo)."""

import numpy as np
import pytest
from chainrule import dist
from chainrule.parallel import pipeline as pp


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("P", "m"), [(1, 3), (2, 1), (2, 4), (3, 5), (4, 8), (8, 3)])
def test_the_bubble_is_the_formula_and_the_memory_is_the_schedules(name, P, m):
    schedule = pp.SCHEDULES[name](P, m)
    assert all(
        sorted(map(str, row)) == sorted([f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)])
        for row in schedule
    )
    line = pp.timeline(schedule)
    assert line.makespan == 2 * (m + P - 1)
    assert line.bubble == pytest.approx(pp.bubble_formula(P, m), abs=1e-15)
    expected = [m] * P if name == "gpipe" else [min(P - s, m) for s in range(P)]
    assert line.peak_activations() == expected


def test_a_backward_before_its_forward_is_refused():
    with pytest.raises(ValueError, match="the schedule deadlocks"):
        pp.timeline(
            [[pp.Action("B", 0), pp.Action("F", 0)], [pp.Action("F", 0), pp.Action("B", 0)]]
        )


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(3)
    model = pp.random_model(4, 2, 6, seed=4)
    inputs = [rng.standard_normal((3, 6)) for _ in range(5)]
    targets = [rng.standard_normal((3, 6)) for _ in range(5)]
    return model, inputs, targets, pp.one_process_step(model, inputs, targets)


def relative_error(results, reference):
    return max(
        float(np.abs(g - r).max() / np.abs(r).max())
        for result, stage in zip(results, reference, strict=True)
        for g, r in zip(result.gradients, stage, strict=True)
    )


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_pipelined_gradients_equal_one_process_on_the_simulated_world(problem, name):
    model, inputs, targets, (loss, reference) = problem
    trace = dist.Trace()
    results = pp.pipeline_step(model, inputs, targets, name, trace=trace)
    assert relative_error(results, reference) < 1e-14  # float64: equal to rounding
    assert results[-1].loss == pytest.approx(loss, rel=1e-14)
    assert [r.order for r in results] == [[str(a) for a in row] for row in pp.SCHEDULES[name](4, 5)]
    expected = [5] * 4 if name == "gpipe" else [4, 3, 2, 1]
    assert [r.peak_activations for r in results] == expected
    # each micro-batch (3 × 6 float64) crosses 3 links forward, its gradient 3 links back
    assert trace.count("send") == 2 * 3 * 5 and trace.total_bytes("send") == 2 * 3 * 5 * 3 * 6 * 8


@pytest.mark.skipif(not dist.is_available("gloo"), reason="no gloo")
def test_pipelined_gradients_on_gloo_in_float32(problem):
    """float32 rounds each product and sum to about 6e-8 (2^−24) of its size; 8 layers of
    6-term sums, forward and backward, and 5 micro-batches added up, stay far below 1e-5 of the
    largest gradient, while a wrong gradient (a missed micro-batch, a wrong route) is off by
    more than 1e-2."""
    model, inputs, targets, (loss, reference) = problem
    results = pp.pipeline_step(model, inputs, targets, "1f1b", "gloo", np.float32)
    assert results[0].gradients[0].dtype == np.float32
    assert relative_error(results, reference) < 1e-5
    assert results[-1].loss == pytest.approx(loss, rel=1e-5)
