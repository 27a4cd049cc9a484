"""Tables and numbers as the lessons print them, and the source a lesson shows."""

import pytest
from chainrule.course.widgets.source import show_source, source_of
from chainrule.course.widgets.tables import (
    html_table,
    markdown_cell,
    markdown_table,
    number,
    power_of_two,
    vector,
)


def test_tables():
    assert markdown_table(["a", "b"], [[1, 2]]).splitlines() == [
        "| a | b |",
        "|---|---|",
        "| 1 | 2 |",
    ]
    table = html_table(["a"], [[1], ["<b>"]])
    assert table.count("<tr>") == 3 and table.count("<th ") == 1 and "&lt;b&gt;" in table


def _cells(line):
    """The cells of one Markdown table row, split as GFM does: at every ``|`` not escaped."""
    import re

    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_a_bar_in_a_cell_stays_in_its_cell():
    rows = [["(1/|B|) Σ_i ∇ℓ_i", "[1, 2]", True], ["largest |x̄ − ȳ|", "0.5", False]]
    lines = markdown_table(["expression", "value", "equals ∇L"], rows).splitlines()
    assert [_cells(line) for line in lines[2:]] == [
        [r"(1/\|B\|) Σ_i ∇ℓ_i", "[1, 2]", "True"],
        [r"largest \|x̄ − ȳ\|", "0.5", "False"],
    ]
    assert markdown_cell("a \\| b") == "a \\| b"  # already escaped: left alone


def test_a_bar_in_math_becomes_vert_not_an_escaped_bar():
    # In MathJax \| is the norm ‖, so math gets \vert (and the norm bars \Vert) instead.
    assert (
        markdown_cell(r"$|x| \le \|g\|$ for |y|")
        == r"$\vert{}x\vert{} \le \Vert{}g\Vert{}$ for \|y\|"
    )
    assert markdown_cell("$$a|b$$") == r"$$a\vert{}b$$"


def test_columns_can_be_aligned():
    lines = markdown_table(["k", "bytes"], [[1, 2]], align=["left", "right"]).splitlines()
    assert lines[1] == "|:---|---:|"
    with pytest.raises(ValueError, match="2 columns but 1 alignments"):
        markdown_table(["k", "bytes"], [[1, 2]], align=["left"])


@pytest.mark.parametrize(
    ("value", "text"),
    [(2.0**21, "2^21"), (65504.0, "65504"), (16.0, "2^4"), (2.0, "2"), (0.5, "0.5")],
)
def test_powers_of_two_are_written_as_powers(value, text):
    assert power_of_two(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(2097152.0, "2097152"), (0.0123, "0.0123"), (1.2e-7, "1.20e-07"), (float("inf"), "inf")],
)
def test_numbers_without_needless_exponents(value, text):
    assert number(value) == text


def test_vectors():
    assert vector([0.123456, -1.2]) == "[0.1235, -1.2]"


def test_source_of_a_function_is_its_code():
    assert source_of(number).startswith("def number(")
    assert show_source(number).data.startswith("```python\ndef number(")
