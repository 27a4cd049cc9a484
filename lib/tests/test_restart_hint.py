"""The kernel-restart hint: which cell defines a missing name, and the message it prints."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from chainrule.course.restart_hint import (
    find_definitions,
    locate_cell,
    missing_name,
    names_defined,
    notebook_path,
    read_cells,
    restart_hint,
    section_of,
)

# -- names a cell defines ---------------------------------------------------------------------


def test_names_defined_finds_every_kind_of_binding():
    source = """
%matplotlib inline
import numpy as np
import os.path
from chainrule import tensor as make_tensor
from chainrule.engine import ops
a, (b, *c) = 1, (2, 3, 4)
d: int = 5
for i, j in []:
    pass
with open(__file__) as handle:
    pass
if (n := 3) > 2:
    inside_if = 1
def train(model):
    hidden_local = model
class Model:
    attribute = 1
"""
    names = names_defined(source)
    expected = {
        "np": "import",
        "os": "import",
        "make_tensor": "import",
        "ops": "import",
        "a": "assignment",
        "b": "assignment",
        "c": "assignment",
        "d": "assignment",
        "i": "for loop",
        "j": "for loop",
        "handle": "with statement",
        "n": "assignment",
        "inside_if": "assignment",
        "train": "def",
        "Model": "class",
    }
    assert names == expected


def test_names_defined_ignores_other_scopes_and_non_bindings():
    source = """
squares = [k * k for k in range(3)]
f = lambda lam: lam
obj.attr = 1
table[0] = 2
total += 1
x: float
"""
    names = names_defined(source)
    assert set(names) == {"squares", "f"}


def test_names_defined_reads_through_cell_magics_and_survives_bad_syntax():
    assert names_defined("%%time\nresult = 1 + 1\n") == {"result": "assignment"}
    assert names_defined("for x in range(3):\n    !echo hi\n") == {"x": "for loop"}
    assert names_defined("def broken(:\n") == {}


# -- a sample notebook ------------------------------------------------------------------------


def _sample_notebook(path: Path) -> Path:
    cells = [
        nbformat.v4.new_markdown_cell("# Lesson\n\nSome text.", id="intro"),
        nbformat.v4.new_markdown_cell("## Set-up", id="setup-heading"),
        nbformat.v4.new_code_cell("import numpy as np\nmodel = np.zeros(3)", id="define-model"),
        nbformat.v4.new_markdown_cell("## Training\n### The loss", id="training-heading"),
        nbformat.v4.new_code_cell("loss = model.sum()", id="use-model"),
        nbformat.v4.new_code_cell("later = helper(1)", id="use-helper"),
        nbformat.v4.new_code_cell("def helper(v):\n    return v\nmodel = 2", id="define-helper"),
        nbformat.v4.new_code_cell("print(model)", id="use-model-again"),
    ]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


@pytest.fixture
def cells(tmp_path):
    return read_cells(_sample_notebook(tmp_path / "lesson.ipynb"))


def test_read_cells_keeps_order_ids_and_text(cells):
    assert [c.cell_id for c in cells][:3] == ["intro", "setup-heading", "define-model"]
    assert [c.cell_type for c in cells].count("code") == 5
    assert cells[2].source == "import numpy as np\nmodel = np.zeros(3)"


def test_section_is_the_nearest_heading_above(cells):
    assert section_of(cells, 2) == "Set-up"
    assert section_of(cells, 4) == "The loss"
    assert section_of(cells, 0) is None


def test_locate_cell_by_id_then_by_source(cells):
    assert locate_cell(cells, cell_id="use-model") == 4
    assert locate_cell(cells, cell_id="unknown", source="  loss = model.sum()\n") == 4
    assert locate_cell(cells, source="not in the notebook") is None


def test_find_definitions_numbers_cells_from_one_counting_markdown(cells):
    found = find_definitions(cells, "model")
    assert [(d.cell_number, d.kind, d.section) for d in found] == [
        (3, "assignment", "Set-up"),
        (7, "assignment", "The loss"),
    ]
    assert found[0].first_line == "import numpy as np"


def test_hint_names_the_defining_cell_above_and_says_what_to_run(cells):
    hint = restart_hint(cells, "model", cell_id="use-model")
    assert hint is not None
    assert hint.startswith("`model` is defined in cell 3 (section 'Set-up')")
    assert "kernel has probably restarted" in hint
    assert "Run All Above Selected Cell" in hint


def test_hint_prefers_the_nearest_definition_above(cells):
    hint = restart_hint(cells, "model", cell_id="use-model-again")
    assert hint is not None and "cell 7 " in hint


def test_hint_for_a_name_defined_only_below(cells):
    hint = restart_hint(cells, "helper", cell_id="use-helper")
    assert hint is not None
    assert "defined further down, in cell 7" in hint
    assert "Run that cell first" in hint


def test_hint_when_the_running_cell_is_not_in_the_saved_file(cells):
    hint = restart_hint(cells, "model", source="edited since the last save")
    assert hint is not None
    assert "cell 3" in hint and "from the top" in hint


def test_no_hint_for_a_typo_or_a_name_only_the_failing_cell_defines(cells):
    assert restart_hint(cells, "modle", cell_id="use-model") is None
    assert restart_hint(cells, "loss", cell_id="use-model") is None


def test_missing_name_reads_name_errors_only():
    try:
        exec("undefined_thing + 1", {})
    except NameError as error:
        assert missing_name(error) == "undefined_thing"

    def uses_local_before_assignment():
        value = value + 1  # noqa: F821, F841
        return value

    with pytest.raises(UnboundLocalError) as info:
        uses_local_before_assignment()
    assert missing_name(info.value) is None
    assert missing_name(NameError("name 'from_message' is not defined")) == "from_message"
    assert missing_name(ValueError("x")) is None


def test_notebook_path_from_environment_namespace_or_cwd(tmp_path):
    nb = _sample_notebook(tmp_path / "lesson.ipynb")
    assert notebook_path(environ={"JPY_SESSION_NAME": str(nb)}) == nb
    assert notebook_path(environ={"JPY_SESSION_NAME": "course/lesson.ipynb"}, cwd=tmp_path) == nb
    assert notebook_path(environ={}, user_ns={"__vsc_ipynb_file__": str(nb)}) == nb
    assert notebook_path(environ={"JPY_SESSION_NAME": "Console 1"}, cwd=tmp_path) is None
    assert notebook_path(environ={"JPY_SESSION_NAME": str(tmp_path / "gone.ipynb")}) is None


# -- the extension in a real kernel -----------------------------------------------------------


def _run_in_kernel(env: dict[str, str], cwd: Path, code: str, cell_id: str) -> list[dict]:
    """Execute ``code`` in a fresh kernel as a front end would (with the cell id); return
    the IOPub output messages (type and content) it produced."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(cwd))
    try:
        msg = kc.session.msg(
            "execute_request",
            content={"code": code, "silent": False, "store_history": True, "allow_stdin": False},
            metadata={"cellId": cell_id},
        )
        kc.shell_channel.send(msg)
        outputs = []
        while True:
            reply = kc.get_iopub_msg(timeout=30)
            if reply["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
                continue
            kind = reply["header"]["msg_type"]
            if kind == "status" and reply["content"]["execution_state"] == "idle":
                return outputs
            if kind in ("stream", "error"):
                outputs.append({"type": kind, **reply["content"]})
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_kernel_config_line_loads_the_extension_and_prints_the_hint_before_the_error(tmp_path):
    nb = _sample_notebook(tmp_path / "lesson.ipynb")
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    # The same line `make install` writes to .venv/etc/ipython/ipython_kernel_config.py.
    (profile / "ipython_kernel_config.py").write_text(
        'c.InteractiveShellApp.extensions = ["chainrule.course.restart_hint"]\n'
    )
    env = dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython"), JPY_SESSION_NAME=str(nb))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    outputs = _run_in_kernel(env, tmp_path, "loss = model.sum()", cell_id="use-model")

    kinds = [o["type"] for o in outputs]
    assert kinds == ["stream", "error"], outputs
    assert outputs[0]["text"].startswith("`model` is defined in cell 3 (section 'Set-up')")
    assert "Run All Above Selected Cell" in outputs[0]["text"]
    assert outputs[1]["ename"] == "NameError"
    assert "model" in outputs[1]["evalue"]
