"""nbgrader configuration of the course (read by every nbgrader command and by JupyterLab's
nbgrader extensions; start them from this folder)."""

import os

import nbgrader

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

COURSE_ROOT = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "autograd-distributed"
c.CourseDirectory.root = COURSE_ROOT
# Files under source/<assignment>/ that must not reach the students.
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints",
    "*.pyc",
    "__pycache__",
    "feedback",
    ".pytest_cache",
]

# The exchange: a folder on this machine by default (one-machine set-up, see the README); a
# multi-user deployment points NBGRADER_EXCHANGE at a shared folder such as /srv/nbgrader/exchange.
# The default folder is made on first use: nbgrader fails on a missing exchange, and the student's
# Assignment List would say "Error fetching courses!" instead of that nothing is released yet.
EXCHANGE = os.environ.get("NBGRADER_EXCHANGE", os.path.join(COURSE_ROOT, "exchange"))
if "NBGRADER_EXCHANGE" not in os.environ:
    os.makedirs(EXCHANGE, exist_ok=True)
c.Exchange.root = EXCHANGE
c.Exchange.path_includes_course = True

# Student versions: what a removed solution is replaced with.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Grading: every cell gets a time limit and is interrupted when it runs over.
c.Execute.timeout = 60
c.Execute.interrupt_on_timeout = True
c.Execute.startup_timeout = 120

# A submission that prints without end cannot flood the gradebook or the feedback.
c.LimitOutput.max_lines = 200
c.LimitOutput.max_traceback = 60

# Test cells a student edited are restored from the gradebook; deleted ones are added back
# (chainrule.grading.restore.RestoreCells: nbgrader 0.9's own insertion can stop with a KeyError).
# A student autograde adds to the gradebook gets names (chainrule.grading.students.NameStudents:
# the account's full name, else the id), not the formgrader's "None, None".
c.OverwriteCells.add_missing_cells = True
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "chainrule.grading.restore.RestoreCells",
    "chainrule.grading.students.NameStudents",
    "nbgrader.preprocessors.CheckCellMetadata",
]

# Validate reports a syntax error or a cell over its time limit on the tests it breaks, naming
# the cell (chainrule.grading.execute.ValidatingExecute in place of nbgrader's Execute).
from chainrule.grading.execute import use_validating_execute  # noqa: E402

use_validating_execute()

# Pages rendered from notebooks (the formgrader's submissions, the feedback) typeset LaTeX with the
# MathJax and STIX-Web fonts that the jupyter-server-mathjax package serves, found from the page's
# own address, never from a CDN: nbconvert's base template folder is looked up here first
# (lib/src/chainrule/grading/templates/base/mathjax.html.j2), after nbgrader's own templates.
import chainrule.grading  # noqa: E402

NBGRADER_EXTENSIONS = os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions")
c.HTMLExporter.extra_template_basedirs = [
    os.path.join(NBGRADER_EXTENSIONS, "formgrader", "templates"),
    os.path.join(os.path.dirname(chainrule.grading.__file__), "templates"),
]

# Feedback without hidden tests, also from `nbgrader generate_feedback` and the formgrader
# (nbgrader itself copies hidden tests into the feedback).
c.GenerateFeedback.preprocessors = [
    "chainrule.grading.feedback.StripHiddenTests",
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
# On one machine every submission is owned by the same OS user; don't warn about it at collect.
c.ExchangeCollect.check_owner = False
