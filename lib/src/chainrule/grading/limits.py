"""A size cap on each output of an autograded notebook.

nbgrader's ``LimitOutput`` counts lines of stream output only: one ``print`` of a 50 MB string,
or a huge HTML repr, goes into the autograded notebook, the gradebook's formgrader view and the
feedback HTML whole. :class:`LimitOutputSize` runs right after it during autograde and cuts
every text output (stream text, ``text/*`` and JSON display data) to ``max_chars`` characters and
drops binary display data (images) larger than ``max_chars`` bytes of base64.
"""

from __future__ import annotations

from nbconvert.exporters.exporter import ResourcesDict
from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer

TRUNCATED = "\n... output truncated by the grader ({} characters) ..."


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with a note saying how long it was."""
    return text if len(text) <= limit else text[:limit] + TRUNCATED.format(len(text))


class LimitOutputSize(NbGraderPreprocessor):
    """Cut outputs bigger than ``max_chars``."""

    max_chars = Integer(100_000, help="largest output kept, in characters (-1 means no limit)").tag(
        config=True
    )

    def _limit_data(self, data: dict) -> None:
        for mime in list(data):
            value = data[mime]
            if not isinstance(value, str):
                continue
            if mime.startswith("text/") or mime.endswith("json"):
                data[mime] = _cut(value, self.max_chars)
            elif len(value) > self.max_chars:
                del data[mime]
                data.setdefault("text/plain", f"[{mime} output of {len(value)} bytes removed]")

    def preprocess_cell(
        self, cell: NotebookNode, resources: ResourcesDict, index: int
    ) -> tuple[NotebookNode, ResourcesDict]:
        """Cut the outputs of one code cell."""
        if self.max_chars < 0 or cell.cell_type != "code":
            return cell, resources
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                output.text = _cut(output.text, self.max_chars)
            elif "data" in output:
                self._limit_data(output.data)
        return cell, resources


def with_output_size_limit(preprocessors: list) -> list:
    """nbgrader's autograde preprocessors with :class:`LimitOutputSize` after ``LimitOutput``."""
    from nbgrader.preprocessors import LimitOutput

    result = [p for p in preprocessors if p is not LimitOutputSize]
    position = result.index(LimitOutput) + 1 if LimitOutput in result else len(result)
    result.insert(position, LimitOutputSize)
    return result
