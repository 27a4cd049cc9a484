"""The code a lesson's point rests on, shown on the page.

``show_source(copy_to_ranks)`` displays the function's own source as a highlighted code block,
so a lesson that uses a library function also shows what it does. Only short functions belong
on a page; a lesson that needs a longer mechanism builds it in its own cells.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def source_of(*functions: Callable[..., Any]) -> str:
    """The source of each function (decorators and docstring included), one after another."""
    return "\n\n".join(inspect.getsource(f).rstrip() for f in functions)


def show_source(*functions: Callable[..., Any]) -> Any:
    """The source of the functions as a Markdown code block (the value of a cell)."""
    from IPython.display import Markdown

    return Markdown(f"```python\n{source_of(*functions)}\n```")
