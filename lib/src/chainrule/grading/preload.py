"""Imported once by the grading fork server, so that every grading child starts warm.

Importing nbgrader pulls in jupyter_server, nbconvert and SQLAlchemy: seconds of CPU that each
forked child would otherwise pay again. Nothing here starts a thread, a kernel or an event loop,
so forking after these imports is safe.

The fork server ends when the grader does, and then skips the interpreter's teardown: with
torch, nbgrader and SQLAlchemy loaded, tearing them down costs about a second of CPU and keeps
the grader's output open that long after it has exited. (The children it forks end with
``os._exit`` already, as multiprocessing ends every forked child.)
"""

import atexit
import multiprocessing.forkserver
import os
import sys

import IPython.core.inputtransformer2  # noqa: E402, F401
import nbclient  # noqa: F401
import nbformat  # noqa: F401
import nbgrader.api  # noqa: F401
import nbgrader.converters  # noqa: F401
import nbgrader.coursedir  # noqa: F401
import nbgrader.utils  # noqa: F401
import sqlalchemy.orm  # noqa: E402

# Test cells run in the grader (chainrule.grading.execute), and some compute their references
# with torch: imported once here rather than in every grading child.
import torch  # noqa: E402, F401
import torch.fx.experimental.symbolic_shapes  # noqa: E402, F401 - a first backward(gradient)'s

import chainrule.course.checks  # noqa: E402, F401

# What the first notebook of every child would otherwise pay again: the fork client of the
# sandbox, IPython's input transformation (the judge parses cells as IPython runs them), and
# SQLAlchemy's mapping of the gradebook's tables (configured on first query).
import chainrule.dist.forks  # noqa: E402, F401
import chainrule.grading.worker  # noqa: F401
import chainrule.judging.judge  # noqa: E402, F401

sqlalchemy.orm.configure_mappers()

# Validating a notebook's JSON and nbgrader's cell metadata builds their validators once.
import nbformat.v4  # noqa: E402
from nbgrader.nbgraderformat import MetadataValidator  # noqa: E402

_warm = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
nbformat.validate(_warm)
MetadataValidator().validate_nb(_warm)
sqlalchemy.create_engine("sqlite://").dispose()
del _warm


def _exit_without_teardown() -> None:
    """End the fork server at once (its only exit is its grader's end: nothing to flush)."""
    os._exit(0)


# Only in the fork server itself (``python -c "from multiprocessing.forkserver import main;
# main(...)"``), never in a process that imports this module for another reason.
if getattr(sys.modules["__main__"], "main", None) is multiprocessing.forkserver.main:
    atexit.register(_exit_without_teardown)
