"""One specification per collective: both backends compute every one, and a call of any shape
travels to the torch backend's ranks and back unchanged."""

import numpy as np
import pytest
from chainrule import dist
from chainrule.dist import simulated, torch_backend
from chainrule.dist.calls import Call, decode, encode
from chainrule.dist.collectives import COLLECTIVES


def test_both_backends_compute_every_collective_and_nothing_else():
    assert set(simulated.COMPUTE) == set(COLLECTIVES)
    assert set(torch_backend.COLLECTIVES) == set(COLLECTIVES)


@pytest.mark.parametrize(
    "call",
    [
        Call("barrier"),
        Call("returned"),
        Call("broadcast", (("src", 2),)),
        Call("all_reduce", (("op", dist.ReduceOp.AVG),), (3, 4), "bfloat16", "torch"),
        Call("all_gather", (("axis", 17),), (2,) * 20, "bool", "numpy"),
        Call(
            "all_to_all",
            (("split_axis", 0), ("concat_axis", 0), ("send_counts", ((0, 5), (1000, 2)))),
            (0, 7),
            "int8",
            "engine",
        ),
    ],
)
def test_a_call_of_any_shape_is_encoded_and_decoded_unchanged(call):
    assert decode(encode(call)) == call


def test_a_call_the_torch_backend_cannot_move_is_refused():
    with pytest.raises(TypeError, match="does not move object values"):
        encode(Call("all_reduce", (("op", dist.ReduceOp.SUM),), (2,), "object", "numpy"))


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
