"""Hidden test regions of a test cell: what the student sees and what stays with the grader.

nbgrader removes every line from a line containing ``BEGIN HIDDEN TESTS`` through the line
containing ``END HIDDEN TESTS`` when it releases an assignment, and puts them back when it
autogrades. This module splits a cell's source the same way, so that the grading pipeline can
compare a submission with what was released and strip the hidden region again from feedback.
"""

from __future__ import annotations

from dataclasses import dataclass

BEGIN_HIDDEN = "BEGIN HIDDEN TESTS"
END_HIDDEN = "END HIDDEN TESTS"


@dataclass(frozen=True)
class HiddenSplit:
    """A cell source split into its visible part and the lines of its hidden regions."""

    visible: str
    hidden_lines: tuple[str, ...]

    @property
    def has_hidden(self) -> bool:
        """Whether the source had at least one hidden region."""
        return bool(self.hidden_lines)


def split_hidden_tests(
    source: str, begin: str = BEGIN_HIDDEN, end: str = END_HIDDEN
) -> HiddenSplit:
    """Split ``source`` into the released text and the hidden lines (delimiters included).

    An unterminated region hides everything up to the end of the cell, which is the safe
    reading for feedback (nbgrader itself refuses to release such a cell).
    """
    visible: list[str] = []
    hidden: list[str] = []
    inside = False
    for line in source.split("\n"):
        if begin in line:
            inside = True
            hidden.append(line)
        elif end in line:
            inside = False
            hidden.append(line)
        elif inside:
            hidden.append(line)
        else:
            visible.append(line)
    return HiddenSplit("\n".join(visible), tuple(hidden))
