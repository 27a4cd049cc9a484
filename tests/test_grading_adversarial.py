"""A class that tries every way we know to forge a grade, graded with the batch command.

The course has two notebooks: ``arith`` (numpy, the course's checks, a hidden test) and
``ranks`` (the student's collective run on simulated ranks and, in the hidden test, on two
real gloo processes inside the sandbox). Every cheat attacks ``arith`` with a wrong or missing
answer and solves ``ranks`` honestly, so the only points it deserves are the 2 of ``ranks``.
The class is graded with two workers, then graded again; the tests read what the batches left.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import chainrule.grading.batch as batch
import nbformat
import psutil
import pytest
from chainrule.grading import BatchOptions, run_batch
from chainrule.grading.gradebooks import snapshot
from grading_course import _meta, _notebook, answer, cell_of, delete_cell, make_course, submit

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

HIDDEN = "hidden_probe_k3v"  # appears only inside hidden tests
SOLUTION_MARK = "solution_mark_z8"  # appears only inside the instructor's solutions
RUN_ID = uuid.uuid4().hex[:10]
ESCAPE_MARK = f"chainrule-escape-{RUN_ID}"
PWNED = Path(f"/tmp/judge-ran-student-code-{RUN_ID}")

SETUP = (
    "import numpy as np\n\nfrom chainrule import dist\n"
    "from chainrule.course.checks import expect_close"
)
SCALE = (
    f"def scale(x, k):\n    {SOLUTION_MARK} = k\n    return {SOLUTION_MARK} * np.asarray(x, float)"
)
NORM = "def norm(x):\n    return float(np.sqrt(np.sum(np.square(x))))"
SPMD_SUM = "def spmd_sum(x):\n    return dist.all_reduce(np.asarray(x, float))"


def _solution(grade_id: str, code: str) -> nbformat.NotebookNode:
    lines = code.split("\n")
    body = "\n".join(
        ["    ### BEGIN SOLUTION", *["    " + ln for ln in lines[1:]], "    ### END SOLUTION"]
    )
    return nbformat.v4.new_code_cell(f"{lines[0]}\n{body}", metadata=_meta(grade_id, solution=True))


def _locked(grade_id: str, source: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source, metadata=_meta(grade_id))


def _test(grade_id: str, source: str, points: float) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source, metadata=_meta(grade_id, grade=True, points=points))


def adversarial_notebooks() -> dict[str, nbformat.NotebookNode]:
    """``arith``: scale (2 points) and norm (1 point); ``ranks``: spmd_sum (2 points)."""
    arith = _notebook(
        [
            _locked("setup", SETUP),
            _solution("scale", SCALE),
            _test(
                "test_scale",
                'expect_close(scale([1.0, 2.0], 3.0), [3.0, 6.0], "scale([1, 2], 3)")\n'
                "### BEGIN HIDDEN TESTS\n"
                f"{HIDDEN} = np.random.default_rng(7).standard_normal(5)\n"
                f'expect_close(scale({HIDDEN}, -2.5), -2.5 * {HIDDEN}, "scale on a hidden case")\n'
                "### END HIDDEN TESTS",
                points=2,
            ),
            _solution("norm", NORM),
            _test(
                "test_norm",
                'assert abs(norm([3.0, 4.0]) - 5.0) < 1e-12, "norm([3, 4]) should be 5"',
                points=1,
            ),
        ]
    )
    ranks = _notebook(
        [
            _locked("setup", SETUP),
            _solution("spmd_sum", SPMD_SUM),
            _locked(
                "helpers",
                "from chainrule.course.checks import in_student_kernel\n\n\n"
                "@in_student_kernel\n"
                "def run_sum(values, backend):\n"
                "    return dist.run(lambda: spmd_sum(values[dist.rank()]), len(values), "
                "backend=backend)",
            ),
            _test(
                "test_sum",
                "values = [np.array([1.0, 2.0]), np.array([10.0, -4.0]), np.array([0.5, 0.25])]\n"
                "for p, result in enumerate(run_sum(values, 'sim')):\n"
                '    expect_close(result, sum(values), f"spmd_sum on rank {p} of 3")\n'
                "### BEGIN HIDDEN TESTS\n"
                f"{HIDDEN} = [np.arange(3.0), np.ones(3)]\n"
                f"for p, result in enumerate(run_sum({HIDDEN}, 'gloo')):\n"
                f'    expect_close(result, sum({HIDDEN}), f"spmd_sum on gloo rank {{p}}")\n'
                "### END HIDDEN TESTS",
                points=2,
            ),
        ]
    )
    return {"arith": arith, "ranks": ranks}


GOOD = {"scale": SCALE, "norm": NORM, "spmd_sum": SPMD_SUM}
GOOD_ALT = {
    "scale": "def scale(x, k):\n    return np.multiply(x, k, dtype=float)",
    "norm": "def norm(x):\n    return float(np.linalg.norm(np.asarray(x, float)))",
    "spmd_sum": "def spmd_sum(x):\n    total = np.asarray(x, float).copy()\n"
    "    return dist.all_reduce(total, op=dist.ReduceOp.SUM)",
}


def attacks(root: Path) -> dict[str, dict]:
    """Each cheat: the code of its ``scale`` cell (and ``norm``), extra files, extra cells."""
    course = str(root)
    return {
        "transformer": dict(
            scale='get_ipython().input_transformers_post.append(lambda lines: ["pass\\n"])'
        ),
        "rebind": dict(
            scale="def scale(x, k):\n    return np.zeros(3)\n"
            "expect_close = lambda *a, **k: None\n"
            "import chainrule.course.checks as checks\n"
            "checks.expect_close = lambda *a, **k: None\n"
            "checks._close = lambda *a, **k: True\n"
            "np.allclose = lambda *a, **k: True\n"
            "import builtins\nbuiltins.abs = lambda value: 0.0",
            norm="def norm(x):\n    return 0.0",
        ),
        "anything": dict(
            scale="class Anything:\n"
            "    def __eq__(self, other): return True\n"
            "    def __sub__(self, other): return self\n"
            "    def __abs__(self): return 0.0\n"
            "    def __float__(self): return 0.0\n"
            "    def __array__(self, *a, **k): return np.zeros(2)\n"
            "def scale(x, k):\n    return Anything()",
            norm="def norm(x):\n    return Anything()",
        ),
        "exit": dict(scale="import os\nos._exit(0)"),
        "sys_exit": dict(scale="import sys\nsys.exit(0)"),
        "killer": dict(
            scale="import os, signal\nos.kill(1, signal.SIGKILL)\nos.killpg(0, signal.SIGKILL)"
        ),
        "shadow": dict(
            files={
                "chainrule/__init__.py": "",
                "chainrule/checks.py": "def expect_close(*a, **k):\n    pass\n",
                "numpy/__init__.py": "allclose = lambda *a, **k: True\n",
            }
        ),
        "reader": dict(
            scale="import glob, json, os\n"
            f"print(sorted(os.listdir('/')), glob.glob('{course}/**', recursive=True)[:50])\n"
            f"for path in ['{course}/source/tiny/arith.ipynb', '{course}/gradebook.db',\n"
            f"             '{course}/submitted/victim/tiny/arith.ipynb']:\n"
            "    try:\n        print(open(path, errors='replace').read()[:3000])\n"
            "    except OSError as error:\n        print('cannot read', path, error)\n"
            f"exec(json.load(open('{course}/source/tiny/arith.ipynb'))['cells'][1]['source'])"
        ),
        "writer": dict(
            scale="import glob, os, sqlite3\n"
            f"for path in glob.glob('{course}/**/gradebook*.db', recursive=True) + "
            f"['{course}/gradebook.db']:\n"
            "    try:\n        db = sqlite3.connect(path)\n"
            "        db.execute('UPDATE grade SET auto_score = 100')\n        db.commit()\n"
            "    except Exception as error:\n        print('gradebook', path, error)\n"
            f"for path in glob.glob('{course}/submitted/victim/tiny/*.ipynb') + "
            f"['{course}/submitted/victim/tiny/arith.ipynb']:\n"
            "    try:\n        open(path, 'w').write('{}')\n"
            "    except Exception as error:\n        print('victim', path, error)\n"
            "try:\n"
            f"    os.makedirs('{course}/source/tiny/planted', exist_ok=True)\n"
            f"    open('{course}/source/tiny/planted/__init__.py', 'w').write('x')\n"
            "except Exception as error:\n    print('source', error)\n"
            "def scale(x, k):\n    return x"
        ),
        "escape": dict(
            scale="import os, subprocess, sys\n"
            "env = {k: v for k, v in os.environ.items() if k != 'JPY_PARENT_PID'}\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
            f"'{ESCAPE_MARK}'], start_new_session=True, env=env)\n"
            "def scale(x, k):\n    return x"
        ),
        "rlimit": dict(
            scale="import resource\n"
            "for limit in [resource.getrlimit(resource.RLIMIT_AS)[1], resource.RLIM_INFINITY]:\n"
            "    try:\n        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
            "    except ValueError as error:\n        print(error)\n"
            "hog = bytearray(6 * 2**30)\n" + SCALE
        ),
        "printer": dict(
            scale="print('Success! All tests passed.')\nprint('test_scale: 2 / 2 points')\n"
            "def scale(x, k):\n    return x"
        ),
        "symlink": dict(
            links={
                "leak.ipynb": f"{course}/source/tiny/arith.ipynb",
                "source": f"{course}/source",
            },
            scale="import os\nfor name in ('leak.ipynb', 'source/tiny/arith.ipynb'):\n"
            "    if os.path.exists(name):\n        print(open(name).read())",
        ),
        "forged": dict(
            forged=True,
            scale="def scale(x, k):\n    return x",
        ),
        # Hard links to the instructor's notebook and the gradebook: the same files under names
        # of the student's (the snapshot leaves them out, whoever owns them).
        "hardlink": dict(
            hardlinks={
                "mine.ipynb": f"{course}/source/tiny/arith.ipynb",
                "book.db": f"{course}/gradebook.db",
            },
            scale="import os\nfor name in ('mine.ipynb', 'book.db'):\n"
            "    if os.path.exists(name):\n        print(open(name, errors='replace').read())\n"
            "def scale(x, k):\n    return x",
        ),
        # RAM-backed folders filled past their size, and a user namespace of its own (to map
        # itself to root and mount what it likes): each refused, and said so.
        "ramdisk": dict(
            scale="import os, subprocess\nchunk = b'x' * 2**20\n"
            "for folder in ('/dev/shm', '/tmp'):\n"
            "    written = 0\n"
            "    try:\n"
            "        with open(os.path.join(folder, 'fill'), 'wb') as handle:\n"
            "            for _ in range(4096):\n"
            "                handle.write(chunk)\n                written += 1\n"
            "    except OSError as error:\n"
            "        print('RAMDISK', folder, 'full after', written, 'MiB:', error.strerror)\n"
            "run = subprocess.run(['unshare', '--user', '--map-root-user', 'id', '-u'],\n"
            "                     capture_output=True, text=True)\n"
            "print('USERNS', run.returncode, run.stdout.strip(), run.stderr.strip()[:200])\n"
            "def scale(x, k):\n    return x",
        ),
        # Every function that runs in the kernel recorded, with its code's file and source:
        # what the tests send must be data and the student's own code, never test code.
        "recorder": dict(
            scale="import inspect, sys\nseen = set()\n"
            "def record(frame, event, arg):\n"
            "    code = frame.f_code\n"
            "    if event == 'call' and code not in seen:\n"
            "        seen.add(code)\n"
            "        try:\n"
            "            print('RECORDED', code.co_filename, inspect.getsource(code))\n"
            "        except (OSError, TypeError):\n"
            "            print('RECORDED', code.co_filename)\n"
            "sys.setprofile(record)\n"
            "def scale(x, k):\n    return x",
        ),
        # The tests' helpers (the setup cell defines expect_close) deleted, and checks of the
        # student's own that pass anything.
        "deleted_helpers": dict(
            delete=["setup"],
            prepend="import numpy as np\n\ndef expect_close(*args, **kwargs):\n    return None",
            scale="def scale(x, k):\n    return x",
        ),
        # The same helpers moved below the tests, the student's no-op checks above them.
        "moved_helpers": dict(
            move_to_end=["setup"],
            prepend="import numpy as np\n\ndef expect_close(*args, **kwargs):\n    return None",
            scale="def scale(x, k):\n    return x",
        ),
    }


CHEATS = (
    "transformer",
    "rebind",
    "anything",
    "exit",
    "sys_exit",
    "killer",
    "shadow",
    "reader",
    "writer",
    "escape",
    "rlimit",
    "printer",
    "symlink",
    "forged",
    "deleted_helpers",
    "moved_helpers",
    "hardlink",
    "ramdisk",
    "recorder",
)
#: Cheats whose arith notebook must not be graded at all (a limit cut it short).
NOT_GRADED = {"rlimit"}


def _forge(nb: nbformat.NotebookNode) -> None:
    """Add cells that claim to be test cells: one with a real test's id, one with a new id."""
    code = f"open({str(PWNED)!r}, 'w').write('the grader ran code of the student')"
    for grade_id, points in (("test_scale", 2), ("bonus", 100)):
        meta = _meta(grade_id, grade=True, points=points)
        nb.cells.insert(1, nbformat.v4.new_code_cell(code, metadata=meta))


def _edit(
    solutions: dict[str, str],
    attack: dict | None = None,
    delete: tuple[str, str] | None = None,
):
    def edit(notebooks: dict[str, nbformat.NotebookNode]) -> None:
        for nb in notebooks.values():
            for cell in nb.cells:
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
                if grade_id in solutions:
                    cell.source = solutions[grade_id]
        if attack:
            for grade_id in ("scale", "norm"):
                if grade_id in attack:
                    answer(notebooks["arith"], grade_id, attack[grade_id])
            if attack.get("forged"):
                _forge(notebooks["arith"])
            arith = notebooks["arith"]
            for grade_id in attack.get("delete", []):
                delete_cell(arith, grade_id)
            for grade_id in attack.get("move_to_end", []):
                moved = cell_of(arith, grade_id)
                arith.cells.remove(moved)
                arith.cells.append(moved)
            if "prepend" in attack:
                arith.cells.insert(0, nbformat.v4.new_code_cell(attack["prepend"]))
        if delete:
            delete_cell(notebooks[delete[0]], delete[1])

    return edit


def _rearranged(notebooks: dict[str, nbformat.NotebookNode]) -> None:
    """An honest student who moved the setup cell below the tests, deleted the helpers of
    ``ranks`` and added cells of their own: graded as the instructor's notebook."""
    _edit(GOOD)(notebooks)
    arith, ranks = notebooks["arith"], notebooks["ranks"]
    setup = cell_of(arith, "setup")
    arith.cells.remove(setup)
    arith.cells.append(setup)
    arith.cells.insert(2, nbformat.v4.new_code_cell("print(scale([1.0], 2.0))"))
    delete_cell(ranks, "helpers")
    ranks.cells.append(nbformat.v4.new_code_cell("total = 0"))


def _tree_digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (links as links) with its content hash; a file with other
    names (the ``hardlink`` cheat's link to the gradebook, which grading writes) by its name
    only."""
    digest = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            digest[key] = "link:" + os.readlink(path)
        elif path.is_file() and path.stat().st_nlink > 1:
            digest[key] = "hard link"
        elif path.is_file():
            digest[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def _watched(root: Path) -> dict[str, dict[str, str]]:
    return {name: _tree_digest(root / name) for name in ("submitted", "source", "release")}


def _grade(root: Path) -> tuple:
    stream = io.StringIO()
    options = BatchOptions(
        "tiny", root, workers=2, timeout_per_submission=240, memory_limit_mb=1536
    )
    result = run_batch(options, stream=stream)
    book = snapshot(f"sqlite:///{root / 'gradebook.db'}", "autograd-distributed", "tiny")
    return result, book, stream.getvalue()


# The temporary folder of this module's batches (where each makes its kernels' folders): set
# by the fixture, so that what the checks look for is this class's, whatever else runs.
BATCH_TMP: list[Path] = []


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = make_course(
        tmp_path_factory.mktemp("adversarial") / "course",
        cell_timeout=20,
        notebooks=adversarial_notebooks,
    )
    root = course.root
    blank_arith = {k: v for k, v in GOOD.items() if k == "spmd_sum"}
    for name, attack in attacks(root).items():
        folder = submit(course, name, _edit(blank_arith, attack))
        for relative, text in attack.get("files", {}).items():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_text(text)
        for relative, target in attack.get("links", {}).items():
            (folder / relative).symlink_to(target)
        for relative, target in attack.get("hardlinks", {}).items():
            os.link(target, folder / relative)
    submit(course, "good", _edit(GOOD))
    submit(course, "good_alt", _edit(GOOD_ALT))
    submit(course, "victim", _edit(GOOD))
    submit(course, "deleted", _edit(GOOD, delete=("arith", "test_norm")))
    # the cell before test_sum is a locked helper: nbgrader 0.9 stops with KeyError: 'helpers'
    submit(course, "deleted_after_helper", _edit(GOOD, delete=("ranks", "test_sum")))
    submit(course, "rearranged", _rearranged)
    before = _watched(root)
    BATCH_TMP.append(Path(tempfile.mkdtemp(prefix="adversarial-", dir="/tmp")))  # short: sockets
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            batch,
            "workspaces_folder",
            lambda: Path(tempfile.mkdtemp(prefix="chainrule-kernels-", dir=BATCH_TMP[0])),
        )
        first = _grade(root)
        after_first = _watched(root)
        time.sleep(2)
        second = _grade(root)
    yield root, before, after_first, first, second
    shutil.rmtree(BATCH_TMP[0], ignore_errors=True)


def _scores(book: dict, student: str) -> dict[str, float | None]:
    return {name: nb["score"] for name, nb in book[student]["notebooks"].items()}


def test_good_students_get_the_instructor_solutions_score(graded):
    _, _, _, (result, book, _), _ = graded
    rows = {row.outcome.student: row for row in result.rows}
    for student in ("good", "good_alt", "victim", "deleted", "deleted_after_helper", "rearranged"):
        assert rows[student].total == rows[student].max_score == 5, rows[student].outcome.to_dict()
        assert not rows[student].outcome.flagged, rows[student].outcome.to_dict()
    assert rows["deleted"].outcome.status.startswith("graded: locked cells restored")
    assert rows["deleted_after_helper"].outcome.status.startswith("graded: locked cells restored")
    rearranged = rows["rearranged"].outcome.status
    assert "moved setup" in rearranged and "deleted helpers" in rearranged, rearranged


def test_no_cheat_earns_a_point_it_did_not_earn_and_every_cheat_is_flagged(graded):
    _, _, _, (result, book, _), _ = graded
    outcomes = {o.student: o for o in result.outcomes}
    for student in CHEATS:
        scores = _scores(book, student)
        arith = next(nb for nb in outcomes[student].notebooks if nb.name == "arith")
        if student in NOT_GRADED:
            assert arith.failed, (student, arith.to_dict())
        else:
            assert scores["arith"] == 0, (student, scores, arith.to_dict())
        assert scores["ranks"] == 2, (student, scores)
        assert arith.failed or arith.flags, (student, arith.to_dict())
        assert not outcomes[student].status.startswith("graded"), outcomes[student].status


def test_tests_that_could_not_run_as_written_say_so(graded):
    _, _, _, (result, _, printed), _ = graded
    outcomes = {o.student: o for o in result.outcomes}
    arith = next(nb for nb in outcomes["transformer"].notebooks if nb.name == "arith")
    assert arith.not_as_written, arith.to_dict()
    assert "tests did not run as written" in outcomes["transformer"].status
    assert "tests did not run as written" in printed
    for student in ("exit", "killer"):  # a kernel that dies is named for what it is
        arith = next(nb for nb in outcomes[student].notebooks if nb.name == "arith")
        assert arith.kernel_died, (student, arith.to_dict())
        assert "kernel died" in outcomes[student].status


def test_submitted_source_and_release_are_untouched(graded):
    _, before, after_first, _, _ = graded
    assert after_first == before
    assert "planted/__init__.py" not in "".join(after_first["source"])


def test_nothing_the_kernel_started_survives_and_no_student_code_ran_in_the_grader(graded):
    assert not PWNED.exists()
    (batch_tmp,) = BATCH_TMP
    survivors = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if ESCAPE_MARK in cmdline or str(batch_tmp) in cmdline:  # a kernel's sockets are there
            survivors.append(cmdline)
    assert survivors == []
    assert list(batch_tmp.iterdir()) == []  # each batch removed its kernels' folders


def test_nothing_leaks_into_feedback(graded):
    root = graded[0]
    pages = list((root / "feedback").rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        text = page.read_text()
        for secret in (HIDDEN, SOLUTION_MARK, "BEGIN HIDDEN TESTS", "### BEGIN SOLUTION"):
            own = ("good", "victim", "deleted", "deleted_after_helper", "rlimit", "rearranged")
            if secret == SOLUTION_MARK and page.parts[-3] in own:
                continue  # their own solution holds the mark
            assert secret not in text, (page, secret)
    feedback_files = [p.name for p in (root / "feedback" / "symlink" / "tiny").iterdir()]
    assert "leak.ipynb" not in feedback_files and "source" not in feedback_files


def test_links_in_a_submission_are_left_out_and_reported(graded):
    _, _, _, (result, _, _), _ = graded
    symlink = next(o for o in result.outcomes if o.student == "symlink")
    reasons = " ".join(r for nb in symlink.notebooks for r in nb.files)
    assert "leak.ipynb (a symbolic link) was left out" in reasons
    assert "files to look at" in symlink.status


def test_hard_links_are_left_out_and_read_nothing(graded):
    root, _, _, (result, _, _), _ = graded
    outcome = next(o for o in result.outcomes if o.student == "hardlink")
    reasons = " ".join(r for nb in outcome.notebooks for r in nb.files)
    assert "mine.ipynb" in reasons and "book.db" in reasons, reasons
    assert "files to look at" in outcome.status
    nb = nbformat.read(root / "autograded" / "hardlink" / "tiny" / "arith.ipynb", 4)
    printed = "".join(o.get("text", "") for o in cell_of(nb, "scale").outputs)
    assert HIDDEN not in printed and "SQLite" not in printed, printed[:500]
    for folder in ("autograded", "feedback"):
        assert not list((root / folder / "hardlink").rglob("mine.ipynb")), folder
        assert not list((root / folder / "hardlink").rglob("book.db")), folder


def test_ram_backed_folders_are_bounded_and_no_user_namespace_can_be_made(graded):
    root = graded[0]
    nb = nbformat.read(root / "autograded" / "ramdisk" / "tiny" / "arith.ipynb", 4)
    printed = "".join(o.get("text", "") for o in cell_of(nb, "scale").outputs)
    full = dict(
        (line.split()[1], int(line.split()[4]))
        for line in printed.splitlines()
        if line.startswith("RAMDISK")
    )
    # Each bounded at a quarter of the 1536 MB limit, far below the 4 GiB it tried.
    assert full.keys() == {"/dev/shm", "/tmp"} and max(full.values()) <= 1536 // 4, printed
    (userns,) = [line for line in printed.splitlines() if line.startswith("USERNS")]
    assert userns.split()[1] != "0", userns  # unshare failed: no nested user namespace


def test_the_kernel_runs_no_test_code(graded):
    """Everything that ran in the recorder's kernel while the tests ran: the student's code,
    the course's kernel-side library and Python's own, never a line of a test cell."""
    root = graded[0]
    nb = nbformat.read(root / "autograded" / "recorder" / "tiny" / "arith.ipynb", 4)
    printed = "".join(str(o.get("text", "")) for cell in nb.cells for o in cell.get("outputs", []))
    assert "RECORDED" in printed
    for secret in (HIDDEN, "expect_close(scale(", "scale on a hidden case"):
        assert secret not in printed, secret


def test_the_regrade_is_identical(graded):
    _, _, _, (first, book1, _), (second, book2, _) = graded
    assert book1 == book2
    statuses = [{o.student: o.status for o in r.outcomes} for r in (first, second)]
    assert statuses[0] == statuses[1]


def test_the_kernels_saw_only_their_own_files(graded):
    root = graded[0]
    nb = nbformat.read(root / "autograded" / "reader" / "tiny" / "arith.ipynb", 4)
    printed = "".join(o.get("text", "") for o in cell_of(nb, "scale").outputs)
    assert "cannot read" in printed and HIDDEN not in printed
    assert str(root / "source") not in printed.split("cannot read")[0]
