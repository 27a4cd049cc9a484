"""Tables and numbers as the lessons print them, and the source a lesson shows."""

import pytest
from chainrule.widgets.source import show_source, source_of
from chainrule.widgets.tables import html_table, markdown_table, number, power_of_two, vector


def test_tables():
    assert markdown_table(["a", "b"], [[1, 2]]).splitlines() == [
        "| a | b |",
        "|---|---|",
        "| 1 | 2 |",
    ]
    table = html_table(["a"], [[1], ["<b>"]])
    assert table.count("<tr>") == 3 and table.count("<th ") == 1 and "&lt;b&gt;" in table


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
