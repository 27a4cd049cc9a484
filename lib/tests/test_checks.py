"""The exercise assertions: they pass on right answers and name the mistake behind wrong ones."""

from __future__ import annotations

import linecache
import sys
import types

import numpy as np
import pytest
from chainrule.course import checks as fb
from chainrule.engine.tensor import Tensor

RNG = np.random.default_rng(7)


def failure(check, *args, **kwargs) -> str:
    """The message of the AssertionError that ``check(*args, **kwargs)`` must raise."""
    with pytest.raises(AssertionError) as caught:
        check(*args, **kwargs)
    return str(caught.value)


# -- expect_close and its diagnoses ------------------------------------------------------------


def test_close_values_pass_in_every_container():
    expected = RNG.standard_normal((2, 3))
    fb.expect_close(expected + 1e-13, expected, "gradient")
    fb.expect_close(Tensor(expected), expected, "gradient")
    fb.expect_close(expected.tolist(), Tensor(expected), "gradient")
    fb.expect_close([Tensor(row) for row in expected], expected, "gradient")


def test_a_failure_says_what_was_expected_and_received():
    message = failure(fb.expect_close, np.array([1.0, 2.0]), np.array([1.0, 2.5]), "the mean")
    assert message.startswith("the mean: expected [1. , 2.5] (shape (2,)), received [1., 2.]")
    assert "Likely mistake" not in message  # nothing recognisable about an unrelated value


@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_a_sum_over_ranks_is_named(ranks):
    expected = RNG.standard_normal(5)
    message = failure(fb.expect_close, ranks * expected, expected, "x.grad", ranks=ranks)
    assert f"received P = {ranks} times the expected value" in message
    assert "summed over the ranks that should have been averaged or counted once" in message


def test_an_extra_division_by_the_world_size_is_named():
    expected = RNG.standard_normal(4)
    message = failure(fb.expect_close, expected / 4, expected, "x.grad", ranks=4)
    assert "received 1/P = 1/4 of the expected value" in message


def test_a_ratio_of_p_is_not_claimed_without_ranks():
    expected = RNG.standard_normal(4)
    message = failure(fb.expect_close, 2 * expected, expected, "x.grad")
    assert "P =" not in message
    assert "received 2 times the expected value everywhere" in message


def test_a_constant_ratio_is_not_claimed_for_a_single_number():
    assert "Likely mistake" not in failure(fb.expect_close, 0.3, 1.0, "max_difference")
    assert "P = 2 times" in failure(fb.expect_close, 2.0, 1.0, "the mean", ranks=2)


def test_a_wrong_sign_is_named():
    expected = RNG.standard_normal((3, 2))
    message = failure(fb.expect_close, -expected, expected, "w.grad", ranks=2)
    assert "wrong sign" in message


def test_the_plain_mean_of_means_is_named_with_the_token_weights():
    tokens = [900, 300]
    local_means = [RNG.standard_normal(3), RNG.standard_normal(3)]
    weighted = (900 * local_means[0] + 300 * local_means[1]) / 1200
    plain = (local_means[0] + local_means[1]) / 2
    message = failure(
        fb.expect_close,
        plain,
        weighted,
        "the reduced gradient",
        tokens=tokens,
        local_means=local_means,
    )
    assert "plain mean of the local means. It weighs every rank equally" in message
    assert "rank 0: 1/1800 instead of 1/1200" in message
    assert "rank 1: 1/600 instead of 1/1200" in message


def test_equal_token_counts_make_the_plain_mean_right():
    local_means = [RNG.standard_normal(3), RNG.standard_normal(3)]
    plain = (local_means[0] + local_means[1]) / 2
    fb.expect_close(plain, plain.copy(), "mean", tokens=[5, 5], local_means=local_means)


def test_a_missing_division_by_the_token_count_is_named():
    tokens = [7, 2, 3]
    local_means = [RNG.standard_normal(2) for _ in tokens]
    weighted_sum = sum(t * m for t, m in zip(tokens, local_means, strict=True))
    expected = weighted_sum / sum(tokens)
    message = failure(
        fb.expect_close, weighted_sum, expected, "g", tokens=tokens, local_means=local_means
    )
    assert "count-weighted sum: a sum over all the tokens, ΣT = 12 times their mean" in message
    message = failure(fb.expect_close, weighted_sum, expected, "g", tokens=tokens)
    assert "received ΣT = 12 times the expected value" in message


def test_a_transposed_result_is_named():
    expected = RNG.standard_normal((2, 3))
    message = failure(fb.expect_close, expected.T, expected, "W.grad")
    assert "transposed" in message
    assert "expected shape (2, 3)" in message


def test_the_whole_tensor_instead_of_a_slice_is_named():
    expected = RNG.standard_normal((2, 3))
    whole = np.concatenate([expected, expected, expected], axis=1)
    message = failure(fb.expect_close, whole, expected, "x.grad", ranks=3)
    assert "the whole tensor where only this rank's slice was expected" in message
    assert "along axis 1" in message
    message = failure(fb.expect_close, expected, whole, "y", ranks=3)
    assert "one rank's slice where the whole" in message


def test_a_scalar_instead_of_an_array_is_named():
    message = failure(fb.expect_close, 3.0, np.ones(4), "grad")
    assert "single number where shape (4,) was expected" in message


def test_a_mistake_named_by_the_test_is_recognised():
    expected = RNG.standard_normal(3)
    summed = 5 * expected + 1
    message = failure(
        fb.expect_close, summed, expected, "g", mistakes={"adding the bias twice": summed}
    )
    assert "Likely mistake: adding the bias twice: that gives exactly what was received." in message


def test_none_zeros_and_nan_are_named():
    expected = np.ones(3)
    assert "without `return`" in failure(fb.expect_close, None, expected, "f(x)")
    assert "no gradient reached it" in failure(fb.expect_close, np.zeros(3), expected, "x.grad")
    message = failure(fb.expect_close, np.zeros(3), expected, "x̄ on rank 0")
    assert "no gradient reached it" in message
    # Zeros of a value that is not a gradient: the relation only, no cause it cannot know.
    message = failure(fb.expect_close, np.zeros(3), expected, "bytes of the forward pass")
    assert "received all zeros where the expected value is not" in message
    assert "gradient" not in message
    assert "NaN or infinity" in failure(fb.expect_close, [1.0, np.nan, 1.0], expected, "g")


def test_a_value_that_is_not_numeric_fails_as_an_assertion():
    message = failure(fb.expect_close, {"grad": 1.0}, np.ones(2), "f(x)")
    assert "received a dict {'grad': 1.0}, which is not a number" in message
    assert "not a number" in failure(fb.expect_close, [np.ones(2), np.ones(3)], np.ones(2), "g")
    # Text is not a number, though numpy would parse it.
    assert "received a str '0.5'" in failure(fb.expect_number, "0.5", "s_p")
    assert "not a number" in failure(fb.expect_close, ["1", "2"], np.ones(2), "g")
    assert "received a str" in failure(fb.expect_array, "1.0", (), "g")


def test_values_the_grader_cannot_carry_fail_alike_with_what_they_were():
    """An int too large for a float or for the wire, an array beyond the wire's limit: the same
    message whether the value comes straight from the notebook (Validate) or over the wire."""
    from chainrule.judging.wire import as_sent

    huge = 10**5000
    for received in (huge, as_sent(huge)):
        message = failure(fb.expect_number, received, "s_p")
        assert "int of about 5000 digits" in message or "int of 5001 digits" in message
    message = failure(fb.expect_close, 10**400, 1.0, "s_p")
    assert "not a number or an array of numbers" in message
    big = np.zeros(9 * 1024 * 1024)
    message = failure(fb.expect_array, as_sent(big), (3,), "g")
    assert "more than the grader accepts" in message


def test_extended_precision_arrays_cross_as_float64():
    from chainrule.judging.wire import as_sent

    value = np.array([0.25, 0.5], dtype=np.longdouble)
    received = as_sent(value)
    assert received.dtype == np.float64 and received.tolist() == [0.25, 0.5]
    fb.expect_close(value, [0.25, 0.5], "w")
    fb.expect_close(received, [0.25, 0.5], "w")


def test_values_that_print_alike_are_told_apart_by_their_difference():
    expected = np.array([0.1, 0.2])
    received = (expected * (1 + 3e-7)).astype(np.float32)
    message = failure(fb.expect_close, received, expected, "w.grad")
    assert "they differ by up to" in message and "is allowed" in message
    assert "float32, about 7 significant digits" in message


def test_diagnose_returns_nothing_for_an_unrelated_value():
    expected = RNG.standard_normal(6)
    assert fb.diagnose(RNG.standard_normal(6), expected, ranks=2, tokens=[1, 2]) == []


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    expected = np.arange(3.0)
    fb.expect_close(torch.arange(3.0), expected, "t")
    message = failure(fb.expect_close, 2 * torch.arange(3.0), expected, "t", ranks=2)
    assert "P = 2 times" in message


# -- exact values and choices ------------------------------------------------------------------


def test_expect_equal_and_expect_choice():
    fb.expect_equal(True, True, "agrees")
    message = failure(fb.expect_equal, False, True, "agrees", hint="look at batch statistics")
    assert message == "agrees: expected True, received False.\nlook at batch statistics"
    fb.expect_choice("B", {"A": 1, "B": 2}, "STEP")
    assert "must be one of 'A', 'B'; received 'Z'" in failure(
        fb.expect_choice, "Z", {"A": 1, "B": 2}, "STEP"
    )
    failure(fb.expect_choice, 1, {"A": 1}, "STEP")


# -- the student's own code --------------------------------------------------------------------


@pytest.fixture
def fake_library(monkeypatch):
    """A module ``fakelib.duality`` with a 'library solution' function and autograd-like class."""
    library = types.ModuleType("fakelib.duality")
    exec(
        "def gather(x):\n    return x\n\nclass Base:\n    pass\n",
        library.__dict__,
    )
    package = types.ModuleType("fakelib")
    package.duality = library
    monkeypatch.setitem(sys.modules, "fakelib", package)
    monkeypatch.setitem(sys.modules, "fakelib.duality", library)
    return library


def notebook_cell(source: str, namespace: dict | None = None, name: str = "cell") -> dict:
    """Run ``source`` the way a notebook cell runs: in ``__main__``, its source findable."""
    filename = f"<notebook-{name}-{abs(hash(source))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__"} if namespace is None else namespace
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def test_a_function_written_in_the_notebook_passes(fake_library):
    cell = notebook_cell("import numpy as np\ndef mine(x):\n    return np.asarray(x) * 2\n")
    fb.expect_own_function(cell["mine"], "mine", library=("fakelib",))


def test_an_imported_library_function_fails(fake_library):
    message = failure(fb.expect_own_function, fake_library.gather, "mine", library=("fakelib",))
    assert "fakelib.duality.gather" in message
    assert "write your own" in message


@pytest.mark.parametrize(
    "source",
    [
        "from fakelib.duality import gather\ndef mine(x):\n    return gather(x)\n",
        "import fakelib.duality as duality\ndef mine(x):\n    return duality.gather(x)\n",
        "import fakelib\ndef mine(x):\n    return fakelib.duality.gather(x)\n",
        "import fakelib.duality as d\ndef mine(x):\n    def inner(y):\n        return d.gather(y)\n"
        "    return inner(x)\n",
    ],
)
def test_a_notebook_function_that_calls_the_library_fails(fake_library, source):
    cell = notebook_cell(source)
    message = failure(fb.expect_own_function, cell["mine"], "mine", library=("fakelib",))
    assert "calls the library's solution" in message


def test_a_non_function_fails(fake_library):
    import functools

    partial = functools.partial(fake_library.gather)
    assert "defined with `def`" in failure(fb.expect_own_function, partial, "mine", ("fakelib",))


def test_own_vjp_is_recognised_on_the_graph(fake_library):
    cell = notebook_cell(
        "from chainrule.engine.tensor import Tensor\n"
        "def double(x):\n"
        "    def vjp(g):\n"
        "        return (2 * g,)\n"
        "    return Tensor.from_op(2 * x.data, (x,), vjp, 'double')\n"
    )
    x = Tensor(np.ones(3), requires_grad=True)
    fb.expect_own_vjp(cell["double"](x) * 3.0, "double(x)", library=("fakelib",))

    library_cell = notebook_cell(
        "from chainrule.engine.tensor import Tensor\n"
        "def double(x):\n"
        "    def vjp(g):\n"
        "        return (2 * g,)\n"
        "    return Tensor.from_op(2 * x.data, (x,), vjp, 'double')\n",
        namespace={"__name__": "fakelib.duality"},
    )
    message = failure(fb.expect_own_vjp, library_cell["double"](x), "y", library=("fakelib",))
    assert "built from the library's differentiable collectives (fakelib.duality)" in message
    message = failure(fb.expect_own_vjp, x * 2.0, "y", library=("fakelib",))
    assert "no backward of your own" in message


AUTOGRAD_CELL = """
import torch

class Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad
"""


def test_own_autograd_function_passes_and_borrowed_ones_fail(fake_library):
    torch = pytest.importorskip("torch")
    own = notebook_cell(AUTOGRAD_CELL, name="own")["Copy"]
    fb.expect_own_autograd_function(own, "Copy", library=("fakelib",))

    library_class = notebook_cell(AUTOGRAD_CELL, {"__name__": "fakelib.duality"}, "lib")["Copy"]
    message = failure(fb.expect_own_autograd_function, library_class, "Copy", ("fakelib",))
    assert "define the class yourself" in message

    subclass = notebook_cell(
        "class Copy(Base):\n    pass\n", {"__name__": "__main__", "Base": library_class}, "sub"
    )["Copy"]
    message = failure(fb.expect_own_autograd_function, subclass, "Copy", ("fakelib",))
    assert "must subclass torch.autograd.Function directly" in message

    half = notebook_cell(
        "import torch\nclass Copy(torch.autograd.Function):\n"
        "    @staticmethod\n    def forward(ctx, x):\n        return x\n",
        name="half",
    )["Copy"]
    message = failure(fb.expect_own_autograd_function, half, "Copy", ("fakelib",))
    assert "Copy.backward must be written in Copy itself" in message

    calling = notebook_cell(
        AUTOGRAD_CELL.replace("return grad", "return fakelib.duality.gather(grad)")
        + "import fakelib\n",
        name="calling",
    )["Copy"]
    message = failure(fb.expect_own_autograd_function, calling, "Copy", ("fakelib",))
    # The cell imports the library: Validate judges the cell, as grading does.
    assert "must be your own code" in message and "imports fakelib" in message

    assert "must be a class" in failure(
        fb.expect_own_autograd_function, torch.nn.functional.relu, "Copy", ("fakelib",)
    )


WRAPPER_CELL = """
class Wrapper:
    def __init__(self, module):
        self.module = module

    def forward(self, x):
        return self.module(x)
"""


def test_own_class_passes_and_borrowed_ones_fail(fake_library):
    own = notebook_cell(WRAPPER_CELL, name="wrapper")["Wrapper"]
    fb.expect_own_class(own, "Wrapper", library=("fakelib",))

    imported = notebook_cell(WRAPPER_CELL, {"__name__": "fakelib.duality"}, "lib")["Wrapper"]
    message = failure(fb.expect_own_class, imported, "Wrapper", ("fakelib",))
    assert "define the class yourself" in message

    subclass = notebook_cell(
        "class Wrapper(Base):\n    def forward(self, x):\n        return x\n",
        {"__name__": "__main__", "Base": fake_library.Base},
        "sub",
    )["Wrapper"]
    message = failure(fb.expect_own_class, subclass, "Wrapper", ("fakelib",))
    assert "must be your own code, but it subclasses fakelib.duality.Base" in message

    calling = notebook_cell(
        WRAPPER_CELL.replace("return self.module(x)", "return fakelib.duality.gather(x)")
        + "import fakelib\n",
        name="calling",
    )["Wrapper"]
    message = failure(fb.expect_own_class, calling, "Wrapper", ("fakelib",))
    assert "Wrapper.forward calls the library's solution" in message

    assert "must be a class" in failure(fb.expect_own_class, len, "Wrapper", ("fakelib",))


def test_checks_judge_what_the_grader_receives_so_validate_and_grading_agree():
    """Exact numbers cross the wire as themselves; any other object only by its type, in a
    notebook (Validate) as in grading."""
    import decimal
    import fractions

    from chainrule.judging.wire import as_sent

    for value in (fractions.Fraction(3, 4), decimal.Decimal("0.75")):
        assert as_sent(value) == value and type(as_sent(value)) is type(value)
        for received in (value, as_sent(value)):  # Validate sees the first, grading the second
            assert fb.expect_number(received, "the share") == 0.75
            fb.expect_close(received, 0.75, "the share")
            fb.expect_equal(received, 0.75, "the share")

    class Anything:
        def __eq__(self, other):
            return True

        def __float__(self):
            return 0.75

        def __array__(self, *args, **kwargs):
            return np.array(0.75)

    for received in (Anything(), as_sent(Anything())):
        with pytest.raises(AssertionError, match="Anything"):
            fb.expect_number(received, "the share")
        with pytest.raises(AssertionError):
            fb.expect_equal(received, 0.75, "the share")
        with pytest.raises(AssertionError, match="not a number"):
            fb.expect_close(received, 0.75, "the share")
