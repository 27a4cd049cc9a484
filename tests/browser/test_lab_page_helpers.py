"""The page helper's reading of stderr outputs: tracebacks are errors, warnings are not.

JupyterLab renders an error output and a warning with the same stderr MIME type, so the
browser tests tell them apart by text; these cases are what a kernel prints for each.
"""

from __future__ import annotations

import pytest
from lab_page import looks_like_error

RUNTIME_ERROR = """---------------------------------------------------------------------------
ZeroDivisionError                         Traceback (most recent call last)
Cell In[1], line 1
----> 1 1/0

ZeroDivisionError: division by zero"""

SYNTAX_ERROR = """  Cell In[2], line 1
    def f(:
          ^
SyntaxError: invalid syntax"""

INTERRUPT = """KeyboardInterrupt: """

USER_WARNING = """/tmp/ipykernel_13444/3054585930.py:5: UserWarning: a harmless warning
  warnings.warn('a harmless warning')"""

DEPRECATION_WARNING = """/lib/m.py:12: DeprecationWarning: ValueError: will be raised later
  old_function()"""


@pytest.mark.parametrize("text", [RUNTIME_ERROR, SYNTAX_ERROR, INTERRUPT])
def test_tracebacks_are_errors(text):
    assert looks_like_error(text)


@pytest.mark.parametrize("text", [USER_WARNING, DEPRECATION_WARNING, "", "loss 0.25\n"])
def test_warnings_and_plain_stderr_are_not_errors(text):
    assert not looks_like_error(text)
