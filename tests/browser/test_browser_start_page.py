"""The start page a student opens first renders its title and working links to the lessons."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

import nbformat
import pytest
from lab_page import LabPage
from lab_server import LabServer
from playwright.sync_api import Locator

pytestmark = [pytest.mark.browser, pytest.mark.slow]

START = "course/00_start.ipynb"
MARKDOWN_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def markdown_of(notebook_path: Path) -> str:
    """All markdown cells of a notebook, in order."""
    notebook = nbformat.read(notebook_path, as_version=4)
    return "\n\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")


def plain(markdown_text: str) -> str:
    """Markdown inline text without its emphasis and code marks, spaces collapsed."""
    return " ".join(re.sub(r"[*_`]", "", markdown_text).split())


def rendered_link(rendered: Locator, text: str, href: str) -> Locator:
    """The rendered anchor of the markdown link [text](href) of the start page.

    JupyterLab rewrites a relative link to the file's server address, /files/<path>?_xsrf=...
    """
    target = posixpath.normpath(posixpath.join(posixpath.dirname(START), href))
    return rendered.locator(f'a[href*="/files/{target}"]', has_text=plain(text))


def test_start_page_renders_title_and_lesson_links(lab: LabPage, lab_server: LabServer) -> None:
    markdown = markdown_of(lab_server.root / START)
    title = re.search(r"^#\s+(.+)$", markdown, re.MULTILINE)
    assert title, f"{START} has no '# title' heading"
    lesson_links = [
        (text, href) for text, href in MARKDOWN_LINK.findall(markdown) if href.endswith(".ipynb")
    ]
    assert lesson_links, f"{START} links to no lesson notebook"
    for _, href in lesson_links:
        assert (lab_server.root / "course" / href).is_file(), f"{START} links to missing {href}"

    lab.goto(START)
    rendered = lab.page.locator(".jp-Notebook .jp-MarkdownOutput")
    heading = rendered.locator("h1").first
    heading.wait_for()
    assert plain(heading.inner_text().replace("¶", "")) == plain(title.group(1))
    for text, href in lesson_links:
        assert rendered_link(rendered, text, href).count() >= 1, f"[{text}]({href}) not rendered"
    lab.record("start_page")

    text, href = lesson_links[0]
    rendered_link(rendered, text, href).first.click()
    lesson_tab = lab.page.locator(
        "#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel",
        has_text=re.compile(f"^{re.escape(Path(href).name)}$"),
    )
    lesson_tab.wait_for()
    lab.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").first.wait_for()
    lab.record("first_lesson_link")
