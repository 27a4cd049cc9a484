"""Unit tests of the grading pipeline's parts that need no nbgrader run: hidden-test splitting
and stripping, failure classification, tamper detection, statuses, limits, the sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from chainrule.grading.child import run_limited
from chainrule.grading.config import grading_env, load_config
from chainrule.grading.feedback import StripHiddenTests, scrub_traceback
from chainrule.grading.hidden import split_hidden_tests
from chainrule.grading.limits import LimitOutputSize, with_output_size_limit
from chainrule.grading.outcomes import (
    CORRUPT_JSON,
    GRADING_ERROR,
    KERNEL_DIED,
    MEMORY_LIMIT,
    TIMEOUT,
    NotebookOutcome,
    RestoredCells,
    StudentOutcome,
    classify_failure,
)
from chainrule.grading.sandbox import uses_torch
from chainrule.grading.tamper import ReleasedCell, find_restored_cells
from grading_course import HIDDEN_MARKER

TEST_SOURCE = (
    'assert square(3) == 9, "square(3) should be 9"\n'
    "### BEGIN HIDDEN TESTS\n"
    f"{HIDDEN_MARKER} = square(-4)\n"
    f'assert {HIDDEN_MARKER} == 16, "square must handle negative numbers"\n'
    "### END HIDDEN TESTS\n"
    "print('visible after')"
)

# The traceback IPython 8 gives for the failing hidden assert, colour codes and all.
TRACEBACK = [
    "\x1b[31m-----------------------------------------------------------------\x1b[39m",
    "\x1b[31mAssertionError\x1b[39m                 Traceback (most recent call last)",
    "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[2]\x1b[39m\x1b[32m, line 4\x1b[39m\n"
    "\x1b[32m      1\x1b[39m \x1b[38;5;28;01massert\x1b[39;00m square(\x1b[32m3\x1b[39m) == "
    '\x1b[32m9\x1b[39m, \x1b[33m"square(3) should be 9"\x1b[39m\n'
    "\x1b[32m      2\x1b[39m \x1b[38;5;66;03m### BEGIN HIDDEN TESTS\x1b[39;00m\n"
    f"\x1b[32m      3\x1b[39m {HIDDEN_MARKER} = square(-\x1b[32m4\x1b[39m)\n"
    f"\x1b[32m----> \x1b[39m\x1b[32m4\x1b[39m \x1b[38;5;28;01massert\x1b[39;00m {HIDDEN_MARKER} == "
    '\x1b[32m16\x1b[39m, \x1b[33m"square must handle negative numbers"\x1b[39m\n'
    "\x1b[32m      5\x1b[39m \x1b[38;5;66;03m### END HIDDEN TESTS\x1b[39;00m\n",
    "\x1b[31mAssertionError\x1b[39m: square must handle negative numbers",
]


def test_split_hidden_tests_matches_nbgrader_release():
    split = split_hidden_tests(TEST_SOURCE)
    assert (
        split.visible == "assert square(3) == 9, \"square(3) should be 9\"\nprint('visible after')"
    )
    assert len(split.hidden_lines) == 4 and split.has_hidden
    assert not split_hidden_tests("x = 1").has_hidden


def test_split_hidden_tests_without_end_hides_the_rest():
    split = split_hidden_tests("a = 1\n### BEGIN HIDDEN TESTS\nsecret = 2")
    assert split.visible == "a = 1" and "secret = 2" in split.hidden_lines


def test_scrub_traceback_drops_quoted_hidden_lines_and_keeps_the_message():
    hidden = {line.strip() for line in split_hidden_tests(TEST_SOURCE).hidden_lines}
    scrubbed = scrub_traceback(TRACEBACK, hidden)
    text = "\n".join(scrubbed)
    assert HIDDEN_MARKER not in text and "BEGIN HIDDEN" not in text
    assert scrubbed[-1] == TRACEBACK[-1]  # AssertionError: square must handle negative numbers
    assert "square(3) should be 9" in text  # the visible line stays
    assert HIDDEN_MARKER in "\n".join(TRACEBACK)  # (the input did quote it)


def test_strip_hidden_tests_preprocessor_cleans_source_and_traceback():
    cell = nbformat.v4.new_code_cell(TEST_SOURCE)
    cell.outputs = [
        nbformat.v4.new_output(
            "error", ename="AssertionError", evalue="square must...", traceback=TRACEBACK
        )
    ]
    plain = nbformat.v4.new_code_cell("y = 2  # " + HIDDEN_MARKER)
    nb = nbformat.v4.new_notebook(cells=[cell, plain])
    nb, _ = StripHiddenTests().preprocess(nb, {})
    assert HIDDEN_MARKER not in nb.cells[0].source
    assert HIDDEN_MARKER not in "".join(nb.cells[0].outputs[0].traceback)
    assert nb.cells[0].outputs[0].ename == "AssertionError"
    assert nb.cells[1].source == plain.source  # cells without a hidden region are untouched


@pytest.mark.parametrize(
    ("log", "reason", "detail"),
    [
        (
            "Traceback...\nnbformat.reader.NotJSONError: Notebook does not appear to be JSON: '{'\n"
            "nbgrader.converters.base.NbGraderException: Please see the above traceback",
            CORRUPT_JSON,
            "NotJSONError",
        ),
        (
            "[ERROR] Kernel died while waiting for execute reply.\n"
            '    raise DeadKernelError("Kernel died") from None\n'
            "nbclient.exceptions.DeadKernelError: Kernel died",
            KERNEL_DIED,
            "DeadKernelError: Kernel died",
        ),
        (
            "[ERROR] Timeout waiting for execute reply (3s).\n"
            "nbclient.exceptions.CellTimeoutError: A cell timed out while it was being executed\n"
            "The message was: Timeout waiting for IOPub output.",
            TIMEOUT,
            "CellTimeoutError",
        ),
        ("MemoryError: Unable to allocate", MEMORY_LIMIT, "MemoryError"),
        ("KeyError: 'test_a'", GRADING_ERROR, "KeyError"),
    ],
)
def test_classify_failure_reads_nbgraders_log(log, reason, detail):
    got_reason, got_detail = classify_failure(log)
    assert got_reason == reason
    assert detail in got_detail


def test_find_restored_cells_compares_with_the_release():
    released = [
        ReleasedCell("test_a", "assert f(1) == 1", is_grade=True),
        ReleasedCell("test_b", "assert f(2) == 4", is_grade=True),
        ReleasedCell("intro", "Read me", is_grade=False),
    ]

    def cell(grade_id, source):
        return nbformat.v4.new_code_cell(source, metadata={"nbgrader": {"grade_id": grade_id}})

    order = ["intro", "test_a", "test_b"]
    untouched = nbformat.v4.new_notebook(
        cells=[
            cell("intro", "Read me"),
            cell("test_a", "assert f(1) == 1\n"),
            cell("mine", "x = 1"),
            cell("test_b", "assert f(2) == 4"),
        ]
    )
    assert not find_restored_cells(untouched, released, order)
    tampered = nbformat.v4.new_notebook(cells=[cell("test_a", "pass")])
    restored = find_restored_cells(tampered, released, order)
    assert restored.edited == ["test_a"] and restored.deleted == ["intro", "test_b"]
    moved = nbformat.v4.new_notebook(
        cells=[cell("test_a", "assert f(1) == 1"), cell("test_b", "assert f(2) == 4")]
        + [cell("intro", "Read me")]
    )
    restored = find_restored_cells(moved, released, order)
    assert restored.moved == ["intro"] and not restored.edited and not restored.deleted
    assert restored.describe() == "moved intro"


def test_statuses_tell_failures_from_zeros_and_restorations():
    graded = NotebookOutcome("ex1", graded=True)
    restored = NotebookOutcome("ex2", graded=True, restored=RestoredCells(edited=["test_x"]))
    died = NotebookOutcome("ex3", reason=KERNEL_DIED)
    assert graded.status == "graded" and not graded.failed
    assert restored.status == "graded: locked cells restored (edited test_x)"
    assert died.status == "failed: kernel died" and died.failed
    student = StudentOutcome("ann", [graded, restored, died])
    assert student.status == "failed: kernel died (ex3)" and not student.fully_graded
    assert StudentOutcome("bob", [graded, restored]).status.startswith("graded: locked cells")
    assert StudentOutcome("cy", [graded]).status == "graded"
    again = NotebookOutcome.from_dict(restored.to_dict())
    assert again == restored


def test_limit_output_size_cuts_big_outputs_only():
    small = nbformat.v4.new_output("stream", name="stdout", text="ok\n")
    big = nbformat.v4.new_output("stream", name="stdout", text="x" * 5000)
    image = nbformat.v4.new_output("display_data", data={"image/png": "A" * 5000})
    cell = nbformat.v4.new_code_cell("print()", outputs=[small, big, image])
    nb, _ = LimitOutputSize(max_chars=1000).preprocess(nbformat.v4.new_notebook(cells=[cell]), {})
    outputs = nb.cells[0].outputs
    assert outputs[0].text == "ok\n"
    assert len(outputs[1].text) < 1100 and "truncated" in outputs[1].text
    assert "image/png" not in outputs[2].data and "removed" in outputs[2].data["text/plain"]


def test_output_size_limit_runs_right_after_nbgraders_limit_output():
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import LimitOutput

    order = with_output_size_limit(list(Autograde().autograde_preprocessors))
    assert order[order.index(LimitOutput) + 1] is LimitOutputSize


def test_load_config_layers_course_file_extra_file_and_overrides(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.Execute.timeout = 60\n")
    extra = tmp_path / "extra.py"
    extra.write_text("c = get_config()\nc.Execute.timeout = 7\nc.Execute.startup_timeout = 9\n")
    config = load_config(tmp_path, [extra], ["--Execute.startup_timeout=11"])
    from nbgrader.preprocessors import Execute

    execute = Execute(config=config)
    assert (execute.timeout, execute.startup_timeout) == (7, 11)
    assert config.CourseDirectory.root == str(tmp_path.resolve())


def test_grading_env_puts_the_interpreters_bin_first_and_fixes_the_hash_seed():
    env = grading_env({"PATH": "/usr/bin"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(os.sys.executable).parent)
    assert env["PYTHONHASHSEED"] == "0"
    assert grading_env({"PATH": "", "PYTHONHASHSEED": "5"})["PYTHONHASHSEED"] == "5"


# -- the sandbox: targets run in the fork server's children ---------------------------------


def spawn_sleeper_and_hang(argv):
    """A child that starts a grandchild in its own session (like a kernel) and never returns."""
    import subprocess
    import sys

    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    Path(argv[0]).write_text(str(sleeper.pid))
    time.sleep(600)


def allocate(argv):
    """A child that allocates ``argv[0]`` MiB and says whether that raised MemoryError."""
    try:
        block = bytearray(int(argv[0]) * 2**20)
        print("allocated", len(block))
        return 0
    except MemoryError:
        print("MemoryError")
        return 7


@pytest.mark.slow  # the fork server's start (it imports nbgrader)
def test_run_limited_kills_the_whole_tree_on_timeout(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    # On a busy machine the child may not reach its grandchild's start before a short limit:
    # the check is then made once more with a longer one (the property is the same).
    for timeout_s in (3, 30):
        run = run_limited(
            spawn_sleeper_and_hang,
            [[str(pid_file)]],
            timeout_s=timeout_s,
            log_path=tmp_path / "log.txt",
            env=grading_env(),
            cwd=tmp_path,
        )
        assert run.timed_out and run.returncode is None and run.seconds >= timeout_s
        if pid_file.exists():
            break
    grandchild = int(pid_file.read_text())
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == "zombie"


def test_run_limited_memory_cap_gives_a_clean_memory_error(tmp_path):
    log = tmp_path / "log.txt"
    capped = run_limited(allocate, [["2048"]], 60, log, grading_env(), tmp_path, 1024)
    assert capped.returncode == 7 and "MemoryError" in log.read_text()
    free = run_limited(allocate, [["64"]], 60, log, grading_env(), tmp_path, 1024)
    assert free.returncode == 0 and not free.timed_out


@pytest.mark.slow  # creates an empty gradebook (nbgrader's tables and alembic stamp)
def test_batch_command_refuses_an_assignment_that_was_never_generated(tmp_path, capsys):
    from chainrule.grading.__main__ import main

    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")
    assert main(["batch", "nope", "--course-root", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "make release ASSIGNMENT=nope" in error
    assert "nbgrader generate_assignment nope --force" in error


def test_batch_refuses_to_grade_without_a_sandbox_tool(tmp_path, capsys, monkeypatch):
    from chainrule.grading import sandbox
    from chainrule.grading.__main__ import EXIT_NO_SANDBOX, main

    monkeypatch.setattr(sandbox, "BWRAP", "bwrap-that-is-not-installed")
    assert main(["batch", "ps1", "--course-root", str(tmp_path)]) == EXIT_NO_SANDBOX
    error = capsys.readouterr().err
    assert "refusing to grade without a sandbox" in error
    assert "`bwrap-that-is-not-installed` was not found on PATH" in error
    assert "apt-get install bubblewrap" in error and "--no-sandbox" in error
    assert not (tmp_path / "grades").exists()  # nothing was graded or written


@pytest.mark.slow
def test_without_the_sandbox_the_summary_says_the_grades_are_not_isolated(tmp_path):
    import io

    from chainrule.grading import BatchOptions, run_batch
    from grading_course import make_course, solve, submit

    course = make_course(tmp_path / "course")
    submit(course, "ann", solve)
    stream = io.StringIO()
    result = run_batch(BatchOptions("tiny", course.root, sandbox=False), stream=stream)
    assert not result.isolated and result.rows[0].total == 4
    assert "NOT ISOLATED" in stream.getvalue().splitlines()[0]
    assert result.summary_txt.read_text().startswith("NOT ISOLATED")


def test_batch_command_passes_config_overrides_and_rejects_other_options():
    from chainrule.grading.__main__ import build_parser, main

    args, extra = build_parser().parse_known_args(
        ["batch", "ps1", "--workers", "2", "--Execute.timeout=5", "--memory-limit-mb", "0"]
    )
    assert (args.workers, args.memory_limit_mb, extra) == (2, None, ["--Execute.timeout=5"])
    with pytest.raises(SystemExit):
        main(["batch", "ps1", "--bogus"])


def test_grading_does_not_import_the_slow_iri_format_checker():
    code = (
        "import sys\n"
        "import chainrule.grading\n"
        "import nbformat\n"
        "nbformat.validate(nbformat.v4.new_notebook())\n"
        "print(sys.modules.get('rfc3987_syntax', 'absent'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("None", "absent")


def test_the_kernels_folders_fit_their_sockets_whatever_the_temporary_folder(tmp_path, monkeypatch):
    from chainrule.grading import scratch
    from chainrule.grading.batch import (
        SOCKET_PATH_IN_WORKSPACES,
        SOCKET_PATH_MAX,
        workspaces_folder,
    )

    long = tmp_path / ("x" * 60)
    long.mkdir()
    for tmp, parent in ((long, Path("/tmp")), (Path("/tmp"), Path("/tmp"))):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
        folder = workspaces_folder()
        try:
            assert folder.parent == parent and folder.is_dir()
            assert len(str(folder)) + SOCKET_PATH_IN_WORKSPACES <= SOCKET_PATH_MAX
        finally:
            scratch.remove(folder)


def test_a_pool_of_a_process_forked_by_the_zygote_is_forked_by_it_too(tmp_path, monkeypatch):
    """The launcher of a gloo pool comes from the zygote (its ranks share its import of
    torch), with the caller's folder and environment, and nothing is left when the pool
    stops."""
    from chainrule import dist
    from chainrule.dist import forks, pool
    from chainrule.grading.sandbox import StudentSandbox

    (tmp_path / "files").mkdir()
    sandbox = StudentSandbox(tmp_path / "zygote", tmp_path / "files", None, isolate=False)
    sandbox.start(log=None)
    try:
        monkeypatch.setenv(forks.ENV, sandbox.address)
        monkeypatch.setenv("CHAINRULE_SEEN_BY_THE_RANKS", "yes")
        monkeypatch.chdir(tmp_path)
        dist.shutdown()  # the pools of earlier tests came from fresh interpreters

        def where():
            return os.getcwd(), os.environ.get("CHAINRULE_SEEN_BY_THE_RANKS"), dist.rank()

        assert dist.run(where, 2, backend="gloo") == [(str(tmp_path), "yes", r) for r in (0, 1)]
        launched = pool._pools[("gloo", 2)]
        assert isinstance(launched.launcher, forks.ForkedChild)
        zygote = sandbox.zygote.pid  # not isolated: the zygote itself, not bubblewrap
        assert psutil.Process(launched.launcher.pid).ppid() == zygote
        processes = [launched.launcher.pid, *launched.pids]
        dist.shutdown()
        deadline = time.monotonic() + 5
        while any(_running(p) for p in processes):
            assert time.monotonic() < deadline, "the pool's processes outlived it"
            time.sleep(0.05)
    finally:
        dist.shutdown()
        sandbox.stop()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_hidden_test_stripper_takes_the_html_exporters_config_without_a_warning():
    """nbconvert's HTML exporter configures ``NbConvertBase.display_data_priority`` for every
    preprocessor it registers; a preprocessor whose trait is not configurable makes traitlets
    log "Config option `display_data_priority` not recognized" in every feedback run (nbgrader's
    own ClearHiddenTests does, the reference here)."""
    import io
    import logging

    from nbconvert import HTMLExporter
    from nbgrader.preprocessors import ClearHiddenTests

    def warnings_of(preprocessor: type) -> str:
        exporter = HTMLExporter()
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        exporter.log.addHandler(handler)
        try:
            exporter.register_preprocessor(preprocessor, enabled=True)
        finally:
            exporter.log.removeHandler(handler)
        return stream.getvalue()

    assert "display_data_priority" in warnings_of(ClearHiddenTests)
    assert warnings_of(StripHiddenTests) == ""
    exporter = HTMLExporter()
    exporter.register_preprocessor(StripHiddenTests, enabled=True)
    stripper = exporter._preprocessors[-1]
    assert isinstance(stripper, StripHiddenTests)
    assert stripper.display_data_priority == exporter.config.NbConvertBase.display_data_priority


def test_a_student_autograde_creates_gets_names_and_names_set_by_hand_stay(tmp_path, monkeypatch):
    """nbgrader's autograde adds a student with no names, which the formgrader lists as
    "None, None": NameStudents names it after its account's full name, else its id."""
    import pwd

    from chainrule.grading import students
    from nbgrader.api import Gradebook

    accounts = {"alovelace": "Ada King Lovelace,,,", "root": "root"}

    def getpwnam(name):
        if name not in accounts:
            raise KeyError(name)
        return pwd.struct_passwd((name, "x", 1000, 1000, accounts[name], "/home", "/bin/sh"))

    monkeypatch.setattr(students.pwd, "getpwnam", getpwnam)
    assert students.student_names("alovelace") == ("Ada King", "Lovelace")
    assert students.student_names("root") == ("", "root")  # one word: not a full name
    assert students.student_names("s1234") == ("", "s1234")

    db_url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(db_url) as gb:
        for student_id in ("alovelace", "s1234"):
            gb.add_student(student_id)
        gb.add_student("named", first_name="Grace", last_name="Hopper")
    for student_id in ("alovelace", "s1234", "named", "absent"):
        resources = {"nbgrader": {"db_url": db_url, "student": student_id}}
        nb = nbformat.v4.new_notebook()
        assert students.NameStudents().preprocess(nb, resources) == (nb, resources)
    with Gradebook(db_url) as gb:
        names = {s.id: (s.first_name, s.last_name) for s in gb.students}
    assert names == {
        "alovelace": ("Ada King", "Lovelace"),
        "s1234": ("", "s1234"),
        "named": ("Grace", "Hopper"),
    }


def test_the_course_config_names_students_when_it_autogrades():
    config = load_config(Path(__file__).resolve().parents[1])
    sanitize = list(config.Autograde.sanitize_preprocessors)
    assert sanitize.index("chainrule.grading.students.NameStudents") == (
        sanitize.index("chainrule.grading.restore.RestoreCells") + 1
    )


def test_a_sandbox_imports_torch_first_only_for_assignments_that_use_it(tmp_path):
    def notebook(name, *cells):
        path = tmp_path / f"{name}.ipynb"
        path.write_text(
            json.dumps({"cells": [{"cell_type": kind, "source": text} for kind, text in cells]})
        )
        return path

    plain = notebook(
        "plain",
        ("code", 'FORBIDDEN = ["chainrule.parallel.duality_torch"]'),
        ("markdown", "import torch"),
    )
    imports = notebook("imports", ("code", ["x = 1\n", "from torch import nn\n"]))
    ranks = notebook("ranks", ("code", 'dist.run(f, 2, backend="gloo")'))
    assert not uses_torch([plain])
    assert uses_torch([plain, imports]) and uses_torch([ranks])
    source = Path(__file__).parents[1] / "source"
    assert uses_torch(sorted((source / "training").glob("*.ipynb")))
    assert not uses_torch(sorted((source / "sharded").glob("*.ipynb")))


def test_a_control_group_left_by_a_killed_grader_is_removed_by_the_next_one():
    """A grading worker killed while it grades never removes its student's control group; the
    next group made on the machine removes it once it is empty, and never one in use."""
    from chainrule.grading import cgroup

    maker = subprocess.run(
        [
            sys.executable,
            "-c",
            "from chainrule.grading import cgroup\n"
            "print('\\n'.join(map(str, cgroup.create(64, label='orphan').folders)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    orphans = [Path(line) for line in maker.stdout.split()]
    assert orphans  # a batch beside this test may remove them first, by the same rule
    busy = cgroup.create(64, label="orphan")  # made by this process, which lives on
    assert busy is not None
    try:
        group = cgroup.create(64, label="orphan")
        assert group is not None
        group.remove()
        assert not any(folder.exists() for folder in orphans)
        assert all(folder.is_dir() for folder in busy.folders)
    finally:
        busy.remove()


def test_a_queue_workers_private_gradebook_leaves_no_file_in_the_temporary_folder(tmp_path):
    """A queue worker's private gradebook starts from an empty one it makes once; making it
    leaves nothing in the temporary folder (a killed worker could never clean it up), and the
    private gradebook holds the student and the assignment from the shared one."""
    from nbgrader.api import Gradebook

    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    with Gradebook(shared, "units") as gradebook:
        gradebook.add_assignment("a1")
        gradebook.add_student("s1")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    private = tmp_path / "worker" / "gradebook.db"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from chainrule.grading.queue import private_gradebook\n"
        "for student in ('s1', 's1'):\n"
        "    print(private_gradebook(sys.argv[1], 'units', 'a1', student, Path(sys.argv[2])))\n"
    )
    made = subprocess.run(
        [sys.executable, "-c", code, shared, str(private)],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(temporary)},
        check=True,
    )
    assert made.stdout.split() == [f"sqlite:///{private.resolve()}"] * 2
    assert list(temporary.iterdir()) == []
    with Gradebook(f"sqlite:///{private}", "units") as gradebook:
        assert [s.id for s in gradebook.students] == ["s1"]
        assert [a.name for a in gradebook.assignments] == ["a1"]


def test_a_scratch_folder_whose_maker_was_killed_is_removed_when_the_next_one_is_made(tmp_path):
    """A grader holds its scratch folder (a batch's kernels' folders, a queue job's) for as long
    as it lives: the next folder of the kind removes those of killed graders, never one whose
    grader is alive, nor this process's own."""
    from chainrule.grading import scratch

    code = (
        "import sys, time\n"
        "from chainrule.grading import scratch\n"
        "print(scratch.make('chainrule-units-', sys.argv[1]), flush=True)\n"
        "time.sleep(600)\n"
    )
    makers = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    try:
        killed, alive = (Path(m.stdout.readline().decode().strip()) for m in makers)
        (killed / "snapshot.ipynb").write_text("{}")
        makers[0].kill()
        makers[0].wait()
        assert killed.is_dir() and alive.is_dir()
        mine = scratch.make("chainrule-units-", tmp_path)
        assert not killed.exists()
        assert alive.is_dir() and mine.is_dir()
        assert scratch.remove_abandoned("chainrule-units-", tmp_path) == []
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, mine.name])
        scratch.remove(mine)
        assert not mine.exists()
    finally:
        for maker in makers:
            maker.kill()
            maker.wait()
            maker.stdout.close()
