"""The judge and the kernel's agent, talking in one process, and what may cross between them.

A fake transport runs the agent's line the way a kernel would, with a plain dict as the
notebook's namespace, and hands the judge the display outputs it produced.
"""

from __future__ import annotations

import base64
import json
import types

import numpy as np
import pytest
from chainrule.course import checks
from chainrule.judging import agent, wire
from chainrule.judging.judge import (
    GraderCallFailed,
    Judge,
    RemoteName,
    StudentCell,
    StudentCodeError,
    StudentTimeout,
)
from chainrule.judging.source_scan import library_uses, reaches_into_grader

# -- what may cross -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        3,
        -(2**80),
        2.5,
        float("inf"),
        1 + 2j,
        "text",
        [1, (2.0, "x")],
        {"a": [None], 3: 4.0},
        np.float32(1.5),
        np.arange(6, dtype=np.int16).reshape(2, 3),
        np.array(2.0),
        np.ones((2, 2))[:, ::-1],
        np.array([True, False]),
    ],
)
def test_plain_values_cross_unchanged(value):
    decoded = wire.decode(json.loads(json.dumps(wire.encode(value))))
    if isinstance(value, np.ndarray):
        assert decoded.dtype == value.dtype and np.array_equal(decoded, value)
    else:
        assert decoded == value or (np.isnan(decoded) if isinstance(decoded, float) else False)


def test_torch_and_engine_tensors_cross_as_arrays():
    import torch
    from chainrule import Tensor

    assert np.array_equal(wire.decode(wire.encode(torch.ones(2, dtype=torch.float64))), [1, 1])
    assert np.array_equal(wire.decode(wire.encode(Tensor(np.arange(3.0)))), [0, 1, 2])


def test_dict_keys_cross_as_numbers_or_the_dict_says_which_key_cannot():
    """numpy's integers and floats as keys are the numbers they equal; a key the grader cannot
    carry is not dropped silently (a dict missing entries would be judged as if it had none):
    the dict arrives as an object that names the key."""
    assert wire.as_sent({np.int64(2): ["W"], np.float64(0.5): 1}) == {2: ["W"], 0.5: 1}
    for key in [(1, 2), True, frozenset()]:
        received = wire.as_sent({key: 1, "a": 2})
        assert isinstance(received, wire.Opaque)
        assert "keys must be str, int or float" in received.text


def test_other_objects_cross_as_their_type_name_only():
    class Anything:
        def __eq__(self, other):
            return True

    decoded = wire.decode(wire.encode(Anything()))
    assert isinstance(decoded, wire.Opaque) and decoded.type_name == "Anything"
    assert decoded != 3 and decoded != decoded.text  # an Opaque compares as what it is


@pytest.mark.parametrize(
    "node",
    [
        {"t": "pickle", "v": "gASVAAAA"},
        {"t": "ndarray", "dtype": "O", "shape": [1], "b64": "AA=="},
        {"t": "ndarray", "dtype": "f8", "shape": [3], "b64": base64.b64encode(b"1234").decode()},
        {"t": "int", "v": "12; import os"},
        {"t": "dict", "v": [[{"t": "list", "v": []}, {"t": "none"}]]},
        {"t": "list", "v": "not a list"},
        "a bare string",
        {"t": "str", "v": "x" * (wire.MAX_TEXT + 1)},
    ],
)
def test_malformed_replies_are_refused(node):
    with pytest.raises(wire.WireError):
        wire.decode(node)


def test_deep_nesting_is_refused():
    node = {"t": "none"}
    for _ in range(wire.MAX_DEPTH + 5):
        node = {"t": "list", "v": [node]}
    with pytest.raises(wire.WireError):
        wire.decode(node)


# -- the judge, with the agent in this process ---------------------------------------------------


class FakeKernel:
    """The agent's view of a kernel: a namespace, and the display outputs it produces."""

    def __init__(self, monkeypatch, namespace):
        self.namespace = namespace
        self.outputs = []
        self.answer = True
        shell = types.SimpleNamespace(user_ns=namespace, compile=types.SimpleNamespace())
        monkeypatch.setattr(agent, "_shell", lambda: shell)
        import IPython.display

        monkeypatch.setattr(IPython.display, "display", lambda data, raw: self.outputs.append(data))

    def transport(self, code):
        self.outputs = []
        if self.answer:
            exec(code, {})
        data = [json.loads(json.dumps(d)) for d in self.outputs]  # what crosses is JSON
        return [{"output_type": "display_data", "data": d} for d in data]


@pytest.fixture
def kernel(monkeypatch):
    def double(x):
        return 2 * np.asarray(x)

    def broken(x):
        raise ValueError(f"bad input {x}")

    namespace = {"double": double, "broken": broken, "ANSWER": "C", "np": np}
    return FakeKernel(monkeypatch, namespace)


def test_student_names_resolve_to_values_or_references(kernel):
    judge = Judge(kernel.transport)
    printed, error = judge.run_cell(
        "value = ANSWER\nresult = double([1.0, 2.0])\nkind = type(double).__name__", "t"
    )
    assert error is None and printed == ""
    assert judge.namespace["value"] == "C"
    assert np.array_equal(judge.namespace["result"], [2.0, 4.0])
    assert judge.namespace["kind"] == "RemoteName"


def test_builtins_and_missing_names_behave_as_in_python(kernel):
    judge = Judge(kernel.transport)
    _, error = judge.run_cell("n = len([1, 2])\nmissing_name_xyz", "t")
    assert isinstance(error, NameError) and judge.namespace["n"] == 2


def test_the_students_exception_comes_back_as_data(kernel):
    judge = Judge(kernel.transport)
    _, error = judge.run_cell("broken(3)", "t")
    assert isinstance(error, StudentCodeError)
    assert error.type_name == "ValueError" and error.message == "bad input 3"


def test_a_kernel_that_does_not_answer_is_a_test_that_did_not_run(kernel):
    judge = Judge(kernel.transport)
    kernel.answer = False
    _, error = judge.run_cell("double(1)", "t")
    assert isinstance(error, GraderCallFailed)
    assert judge.failures == ["the kernel did not answer the grader's request"]


def test_a_forged_reply_cannot_be_another_requests_answer(kernel, monkeypatch):
    judge = Judge(kernel.transport)

    def forged(code):
        reply = {"nonce": "guessed", "ok": True, "value": wire.encode(42)}
        return [{"output_type": "display_data", "data": {agent.REPLY_MIME: reply}}]

    judge.transport = forged
    _, error = judge.run_cell("x = double(1)", "t")
    assert isinstance(error, GraderCallFailed) and "x" not in judge.namespace


def test_a_timeout_is_the_students(kernel):
    def timed_out(code):
        return [{"output_type": "error", "ename": "CellTimeoutError", "evalue": ""}]

    judge = Judge(timed_out)
    _, error = judge.run_cell("double(1)", "t")
    assert isinstance(error, StudentTimeout)


def test_helpers_marked_for_the_kernel_run_there_with_the_students_names(kernel):
    judge = Judge(kernel.transport)
    source = (
        "from chainrule.course.checks import in_student_kernel\n"
        "OFFSET = 10\n"
        "@in_student_kernel\n"
        "def run(values):\n"
        "    return [double(v) + OFFSET for v in values]\n"
        "out = run([1, 2])\n"
    )
    _, error = judge.run_cell(source, "helpers", test=False)
    assert error is None, error
    assert [int(v) for v in judge.namespace["out"]] == [12, 14]
    assert isinstance(judge.namespace["run"], type(judge.in_student_kernel(len)))


def test_no_code_of_a_test_cell_reaches_the_kernel(kernel):
    """Test cells hold hidden tests: the functions and classes they define never travel to the
    student's kernel, not as a helper, not as an argument; their data does."""
    judge = Judge(kernel.transport)
    helpers = (
        "from chainrule.course.checks import in_student_kernel\n"
        "@in_student_kernel\n"
        "def apply(f, x):\n"
        "    return f(x)\n"
        "@in_student_kernel\n"
        "def twice(x):\n"
        "    return double(x)\n"
    )
    assert judge.run_cell(helpers, "helpers", test=False)[1] is None
    sent = {
        "a function": "def secret_loss(x):\n    return x + 1\napply(secret_loss, 1)\n",
        "a lambda": "apply(lambda x: x - 7, 1)\n",
        "a class": "class Secret:\n    def __call__(self, x):\n        return x\n"
        "apply(Secret(), 1)\n",
        "a helper": "from chainrule.course.checks import in_student_kernel\n"
        "@in_student_kernel\ndef hidden_helper():\n    return 1\nhidden_helper()\n",
    }
    for what, source in sent.items():
        kernel.outputs = []
        _, error = judge.run_cell(source, f"test_{what}")
        assert isinstance(error, GraderCallFailed), what
        assert "defined in a test cell" in str(error), what
    _, error = judge.run_cell("out = twice(np.arange(3.0))\n", "test_data")
    assert error is None and list(judge.namespace["out"]) == [0.0, 2.0, 4.0]


def test_in_a_plain_notebook_a_marked_helper_is_the_function_itself():
    def helper(x):
        return x + 1

    assert checks.in_student_kernel(helper)(1) == 2

    def failing():
        raise KeyError("nope")

    with pytest.raises(checks.ErrorInYourCode, match="KeyError: 'nope'"):
        checks.in_student_kernel(failing)()


def test_in_a_plain_notebook_a_marked_helper_hands_over_what_the_grader_would_receive():
    """Validate runs the helper in the notebook; grading in the kernel, whose answer crosses the
    wire. The checks see the same value either way: arguments are copies, and the result is
    the value as sent (a set is an object the grader cannot judge, a tuple stays a tuple)."""
    from chainrule.judging.wire import Opaque

    def scaled_in_place(values):
        values *= 2  # the student's code changes what it was given
        return values, {1, 2}, (3, np.float32(0.5))

    given = np.arange(3.0)
    doubled, a_set, pair = checks.in_student_kernel(scaled_in_place)(given)
    assert given.tolist() == [0.0, 1.0, 2.0]  # the test's own array is untouched
    assert doubled.tolist() == [0.0, 2.0, 4.0]
    assert isinstance(a_set, Opaque) and a_set.type_name == "set"
    assert pair == (3, 0.5) and type(pair[1]) is float


def test_remote_names_refuse_private_attributes_and_reduce_to_a_lookup(kernel):
    judge = Judge(kernel.transport)
    remote = RemoteName(judge, "double", "function")
    with pytest.raises(AttributeError):
        remote._secret  # noqa: B018
    assert remote.__reduce__() == (agent.lookup, ("double",))
    assert remote.attr.remote_path == "double.attr"


# -- own work, read from the source -------------------------------------------------------------


def test_own_work_of_a_remote_function_is_read_from_the_cells(kernel):
    cells = [
        StudentCell("'a'", "import chainrule\n"),
        StudentCell("'f'", "def f(x):\n    return chainrule.duality.gather_from_ranks(x)\n"),
        StudentCell("'g'", "def g(x):\n    return x\n"),
    ]
    judge = Judge(kernel.transport, cells)
    with judge.active():
        with pytest.raises(AssertionError, match="chainrule.duality"):
            checks.expect_own_function(RemoteName(judge, "f"), "f", ("chainrule.duality",))
        checks.expect_own_function(RemoteName(judge, "g"), "g", ("chainrule.duality",))
        with pytest.raises(AssertionError, match="no cell of yours defines h"):
            checks.expect_own_function(RemoteName(judge, "h"), "h", ("chainrule.duality",))


def test_library_uses_inside_functions_under_aliases_and_by_name_are_found():
    cells = [
        ("a", "from chainrule import data_parallel as dp\n"),
        ("b", "def f():\n    from chainrule.duality import gather_from_ranks as g\n    return g\n"),
        ("c", "def h():\n    return dp.average_gradients\n"),
        ("d", "import importlib\nm = importlib.import_module('chainrule.duality')\n"),
    ]
    found = " ".join(
        f.describe() for f in library_uses(cells, ("chainrule.duality", "chainrule.data_parallel"))
    )
    for expected in ("cell a", "cell b", "cell c", "runs or imports code by name", "in a string"):
        assert expected in found, found


def test_a_library_path_spelled_out_after_another_cells_import_is_found():
    # ``torch`` comes from the notebook's own setup cell, not from the student's.
    cells = [("a", "class W(torch.nn.parallel.DistributedDataParallel):\n    pass\n")]
    found = [f.describe() for f in library_uses(cells, ("torch.nn.parallel",))]
    assert found == [
        "cell a, line 1: uses torch.nn.parallel.DistributedDataParallel "
        "(`class W(torch.nn.parallel.DistributedDataParallel):`)"
    ]
    assert library_uses([("b", "y = torch.nn.functional.relu(x)\n")], ("torch.nn.parallel",)) == []


def test_a_library_reached_through_a_name_the_locked_cells_import_is_found():
    # ``torch`` comes from the notebook's setup cell, which is not the student's.
    cells = [("z", "class Z:\n    def step(self):\n        return torch.optim.Adam([])\n")]
    found = " ".join(f.describe() for f in library_uses(cells, ("torch.optim",)))
    assert "cell z, line 3: uses torch.optim.Adam" in found, found
    assert library_uses([("y", "def f(t):\n    return torch.tanh(t)\n")], ("torch.optim",)) == []


def test_code_that_reaches_into_the_grader_is_found_and_honest_code_is_not():
    honest = [
        (
            "s",
            "import numpy as np\nfrom chainrule import dist\n\n"
            "def f(x, sizes):\n    total = dist.all_reduce(np.array(float(sum(sizes))))\n"
            "    np.testing.assert_equal(total, total)\n    return x / total\n",
        )
    ]
    assert reaches_into_grader(honest, protected={"expect_close"}) == []
    cheats = {
        "get_ipython().input_transformers_post.append(lambda l: l)": "input transformers",
        "import os\nos._exit(0)": "exiting",
        "import numpy as np\nnp.allclose = lambda *a, **k: True": "imported module",
        "expect_close = print": "a name of the notebook's own cells",
        "x = open('/srv/course/gradebook.db').read()": "outside the submission",
        "print('Success! All tests passed.')": "imitates a grader's verdict",
        "class Yes:\n    def __eq__(self, other):\n        return True": "compare or convert",
        "exec('1')": "running code from a string",
    }
    for source, reason in cheats.items():
        found = reaches_into_grader([("c", source)], protected={"expect_close"})
        assert any(reason in f.what for f in found), (source, found)


def test_cells_are_read_as_ipython_runs_them():
    """A magic cannot hide code from the scan: the scan reads what IPython compiles."""
    library = ("chainrule.duality",)
    hidden = [
        ("a", "for _ in range(1):\n    %time import chainrule.duality\n"),
        ("b", "%%time\nfrom chainrule.duality import gather_from_ranks\n"),
        ("c", "%timeit -n 1 -r1 __import__('os')\n"),
    ]
    found = [f.describe() for f in library_uses(hidden, library)]
    assert any("cell a, line 2: imports chainrule.duality" in f for f in found), found
    assert any("cell b" in f and "chainrule.duality" in f for f in found), found
    assert any("cell c" in f and "by name" in f for f in found), found


def test_a_cell_that_cannot_be_read_is_a_finding_not_a_skip():
    found = library_uses([("broken", "def f(:\n    import chainrule.duality\n")], ("x",))
    assert [f.cell for f in found] == ["broken"] and "cannot be read" in found[0].what


def test_a_library_named_in_a_docstring_or_comment_is_not_a_use():
    cells = [
        (
            "s",
            '"""Like chainrule.duality.gather_from_ranks, written by hand."""\n'
            "def gather(x):\n"
            '    """The backward of chainrule.duality\'s all-gather row."""\n'
            "    # chainrule.duality would do this\n"
            "    return x\n",
        )
    ]
    assert library_uses(cells, ("chainrule.duality",)) == []
    named = [("t", "name = 'chainrule.duality'\n")]
    assert library_uses(named, ("chainrule.duality",)) != []


def test_shell_escapes_and_unread_magics_reach_out_and_harmless_magics_do_not():
    assert reaches_into_grader([("m", "%matplotlib inline\n%time x = 1\n")]) == []
    for source, reason in {
        "!cat /etc/passwd": "shell command",
        "files = !ls": "shell command",
        "%run other.py": "magic %run",
        "%load_ext something": "magic %load_ext",
    }.items():
        found = reaches_into_grader([("c", source)])
        assert any(reason in f.what for f in found), (source, found)


def test_every_kind_of_binding_is_a_definition():
    from chainrule.judging.source_scan import definitions

    cells = [
        ("a", "a, (b, c) = 1, (2, 3)\n"),
        ("b", "d: int = 4\n"),
        ("c", "for e in range(2):\n    pass\n"),
        ("d", "with open('x') as f:\n    pass\n"),
        ("e", "%%capture out\nprint(1)\n"),
        ("f", "if True:\n    def g():\n        return 1\n"),
    ]
    for name, label in [("a", "a"), ("c", "a"), ("d", "b"), ("e", "c"), ("f", "d"), ("out", "e")]:
        assert [found[0] for found in definitions(cells, name)] == [label], name
    ((_, node),) = definitions(cells, "g")
    import ast

    assert isinstance(node, ast.FunctionDef)
