"""Imported once by the grading fork server, so that every grading child starts warm.

Importing nbgrader pulls in jupyter_server, nbconvert and SQLAlchemy: seconds of CPU that each
forked child would otherwise pay again. Nothing here starts a thread, a kernel or an event loop,
so forking after these imports is safe.
"""

import nbclient  # noqa: F401
import nbformat  # noqa: F401
import nbgrader.api  # noqa: F401
import nbgrader.converters  # noqa: F401
import nbgrader.coursedir  # noqa: F401
import nbgrader.utils  # noqa: F401

# Test cells run in the grader (chainrule.grading.execute), and some compute their references
# with torch: imported once here rather than in every grading child.
import torch  # noqa: E402, F401

import chainrule.course.checks  # noqa: E402, F401
import chainrule.grading.worker  # noqa: F401
import chainrule.judging.judge  # noqa: E402, F401
