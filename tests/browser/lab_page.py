"""What a person does in JupyterLab, as Playwright steps that wait on JupyterLab's own state.

``LabPage`` wraps one browser page on one ``LabServer``: open a file (in a fresh workspace, or
with File ▸ Open from Path… in the JupyterLab the page already shows), close every tab, wait for
the notebook's kernel to be idle (the status-bar kernel item, which reads "<kernel> | Idle" only
once the kernel is connected), run all cells from the Run menu, read error outputs, save, move a
slider, press nbgrader's Validate button and read the dialog, open the nbgrader menu's panels.
Nothing here sleeps for a fixed time: every wait is on something JupyterLab shows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from lab_server import LabServer
from playwright.sync_api import FrameLocator, Locator, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

# Cold kernels on two shared cores: be generous.
PAGE_TIMEOUT_MS = 90_000
RUN_ALL_TIMEOUT_MS = 240_000
VALIDATE_TIMEOUT_MS = 240_000
WIDGET_TIMEOUT_MS = 60_000
# Long waits poll the page every POLL_MS instead of on every animation frame.
POLL_MS = 200

# The code cells of the notebook in the current tab.
_CODE_CELLS = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell"

# A signature of every output in the notebook except the slider controls themselves: the
# widget's readout changes with the slider, the outputs it drives must change on their own.
_OUTPUTS_SIGNATURE_JS = """
() => {
  const parts = [];
  const current = '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-OutputArea';
  for (const area of document.querySelectorAll(current)) {
    const copy = area.cloneNode(true);
    copy.querySelectorAll('.widget-slider, .widget-readout, .widget-label')
        .forEach(node => node.remove());
    for (const img of copy.querySelectorAll('img')) parts.push('img:' + img.src);
    const text = copy.textContent.trim();
    if (text) parts.push('text:' + text);
  }
  return parts.join('\\n');
}
"""

# Error outputs of the notebook model, as the browser rendered them. JupyterLab renders an
# `error` output with the stderr MIME type, like a warning; IPython's traceback header
# ("... Traceback (most recent call last)") or a final "SomeError: message" line tells them apart.
_ERROR_LINE = re.compile(r"^\s*(\w+\.)*\w*(Error|Exception|Interrupt|Exit)\b.*", re.MULTILINE)


class LabPage:
    """One Playwright page on a running JupyterLab, with screenshots kept as a record."""

    def __init__(
        self,
        page: Page,
        server: LabServer,
        artifacts: Path,
        test_name: str,
        keeps_lab: bool = False,
    ) -> None:
        self.page = page
        self.keeps_lab = keeps_lab
        self.server = server
        self.artifacts = artifacts
        self.test_name = re.sub(r"[^\w.-]+", "_", test_name)
        self.screenshots: list[Path] = []
        page.set_default_timeout(PAGE_TIMEOUT_MS)

    # -- navigation and records ------------------------------------------------------------

    def goto(self, path: str) -> None:
        """Open ``/lab/tree/<path>`` (or ``/lab`` for "") in a fresh workspace."""
        target = f"/lab/tree/{path}" if path else "/lab"
        self.page.goto(self.server.url(f"{target}?reset"))
        self.page.locator("#jp-main-dock-panel").wait_for()
        self.page.locator("#jp-menu-panel .lm-MenuBar-itemLabel").first.wait_for()

    def record(self, label: str) -> Path:
        """Save a screenshot of the page as it is now under the artifacts folder."""
        index = len(self.screenshots) + 1
        path = self.artifacts / f"{self.test_name}__{index:02d}_{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.screenshots.append(path)
        return path

    # -- notebooks ---------------------------------------------------------------------------

    def shows_lab(self) -> bool:
        """Whether the page shows this server's JupyterLab, its menu bar loaded."""
        return self.page.url.startswith(self.server.base_url + "/lab") and (
            self.page.locator("#jp-menu-panel .lm-MenuBar-itemLabel").count() > 0
        )

    def open_notebook(self, path: str) -> Locator:
        """Open the notebook at ``path`` and wait until its kernel is connected and idle.

        The page loads JupyterLab afresh, on a fresh workspace; but a page kept from test to
        test (``keeps_lab``) that already shows JupyterLab opens it as a person opens another
        notebook, with File ▸ Open from Path… (loading JupyterLab costs seconds of CPU).
        """
        if self.keeps_lab and self.shows_lab():
            self.click_menu("File", "filebrowser:open-path")
            dialog = self.page.locator(".jp-Dialog")
            dialog.locator("input").fill(path)
            dialog.locator("input").press("Enter")
            dialog.wait_for(state="detached")
            self.page.locator(
                "#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel",
                has_text=re.compile(f"^{re.escape(Path(path).name)}$"),
            ).wait_for()
        else:
            self.goto(path)
        notebook = self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
        notebook.wait_for()
        self.wait_for_kernel_idle(Path(path).name)
        return notebook

    def close_all_tabs(self) -> None:
        """File ▸ Close All Tabs, discarding unsaved changes; wait until no document is open."""
        self.click_menu("File", "application:close-all")
        discard = self.page.locator(".jp-Dialog button.jp-Dialog-button", has_text="Discard")
        closed_or_asking = """() =>
            !document.querySelector('#jp-main-dock-panel .jp-Document')
            || [...document.querySelectorAll('.jp-Dialog button')]
                   .some(b => b.textContent.trim() === 'Discard')"""
        while True:
            self.page.wait_for_function(closed_or_asking, polling=POLL_MS)
            if not discard.count():
                return
            button = discard.first.element_handle()
            button.click()
            button.wait_for_element_state("hidden")

    def kernel_status_item(self, notebook_name: str) -> Locator:
        """The status bar's kernel item of the notebook called ``notebook_name``."""
        return self.page.locator(
            f'.jp-StatusBar-TextItem[title="Change kernel for {notebook_name}"]'
        )

    def wait_for_kernel_idle(self, notebook_name: str, timeout_ms: int = PAGE_TIMEOUT_MS) -> None:
        """Wait until the status bar shows the notebook's kernel as connected and idle."""
        item = self.kernel_status_item(notebook_name)
        item.wait_for(timeout=timeout_ms)
        self.page.wait_for_function(
            """el => { const t = el.textContent.trim();
                       return t.endsWith('| Idle') && !t.startsWith('No Kernel'); }""",
            arg=item.element_handle(),
            timeout=timeout_ms,
        )

    def click_menu(self, menu: str, command: str) -> None:
        """Open the main menu ``menu`` and click the item bound to ``command``."""
        self.page.locator(
            "#jp-menu-panel .lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(menu)}$")
        ).click()
        item = self.page.locator(f'.lm-Menu li.lm-Menu-item[data-command="{command}"]')
        item.wait_for()
        if "lm-mod-disabled" in (item.get_attribute("class") or ""):
            raise AssertionError(f"menu item {menu} ▸ {command} is disabled")
        item.click()

    def clear_all_outputs(self) -> None:
        """Edit ▸ Clear Outputs of All Cells; wait until no cell shows an output or a count."""
        self.click_menu("Edit", "editmenu:clear-all")
        self.page.wait_for_function(
            f"""() => {{
              const cells = [...document.querySelectorAll('{_CODE_CELLS}')];
              return cells.every(c => !/\\d/.test(c.querySelector('.jp-InputPrompt').textContent)
                                      && !c.querySelector('.jp-OutputArea-output'));
            }}""",
            polling=POLL_MS,
        )

    def run_all(self, notebook_name: str, timeout_ms: int = RUN_ALL_TIMEOUT_MS) -> list[str]:
        """Clear all outputs, then Run ▸ Run All Cells; wait until no cell is pending and the
        kernel is idle. Returns the input prompts of the non-empty code cells ("[3]:" once a
        cell has run, "[ ]:" for cells not reached).

        Clearing first means that an execution count seen afterwards comes from this run, not
        from outputs stored in the notebook.
        """
        self.clear_all_outputs()
        self.click_menu("Run", "runmenu:run-all")
        self.page.wait_for_function(
            f"""() => {{
              const cells = [...document.querySelectorAll('{_CODE_CELLS}')];
              const prompts = cells.map(c => c.querySelector('.jp-InputPrompt').textContent);
              if (prompts.some(p => p.includes('*'))) return false;
              return prompts.some(p => /\\[\\d+\\]/.test(p));
            }}""",
            timeout=timeout_ms,
            polling=POLL_MS,
        )
        self.wait_for_kernel_idle(notebook_name, timeout_ms)
        return self.page.evaluate(
            f"""() => [...document.querySelectorAll('{_CODE_CELLS}')]
                .filter(c => c.querySelector('.jp-InputArea-editor').textContent.trim() !== '')
                .map(c => c.querySelector('.jp-InputPrompt').textContent.trim())"""
        )

    def stderr_outputs(self) -> list[str]:
        """Text of every output rendered with the stderr MIME type (warnings and errors)."""
        return self.page.locator(
            ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-OutputArea-output"
            '[data-mime-type="application/vnd.jupyter.stderr"]'
        ).all_inner_texts()

    def error_outputs(self) -> list[str]:
        """Text of the rendered outputs that are errors (tracebacks), not warnings."""
        return [text for text in self.stderr_outputs() if looks_like_error(text)]

    def save(self, notebook_name: str) -> None:
        """File ▸ Save Notebook, then wait until the tab no longer shows unsaved changes."""
        self.click_menu("File", "docmanager:save")
        self.page.locator(
            ".lm-TabBar-tab.jp-mod-dirty", has_text=re.compile(f"^{re.escape(notebook_name)}$")
        ).wait_for(state="detached")

    def outputs_signature(self) -> str:
        """Images and text of every output area, without the slider controls themselves."""
        return self.page.evaluate(_OUTPUTS_SIGNATURE_JS)

    def nudge_slider(self, slider: Locator) -> tuple[str, str]:
        """Focus the slider's handle and press an arrow key once (right, or left at the
        maximum); wait for the slider to show the new value. Returns (old, new) values."""
        handle = slider.locator(".noUi-handle[role=slider]").first
        before = handle.get_attribute("aria-valuenow")
        at_maximum = float(before) >= float(handle.get_attribute("aria-valuemax"))
        handle.focus()
        handle.press("ArrowLeft" if at_maximum else "ArrowRight")
        self.page.wait_for_function(
            "([el, old]) => el.getAttribute('aria-valuenow') !== old",
            arg=[handle.element_handle(), before],
        )
        return before, handle.get_attribute("aria-valuenow")

    def has_unsaved_changes(self, notebook_name: str) -> bool:
        """Whether the notebook's tab shows the unsaved-changes mark."""
        return (
            self.page.locator(
                ".lm-TabBar-tab.jp-mod-dirty", has_text=re.compile(f"^{re.escape(notebook_name)}$")
            ).count()
            > 0
        )

    def live_widgets(self) -> list[Locator]:
        """The course's live widgets (:class:`chainrule.widgets.live_widget.LiveWidget`) in the
        current notebook, in page order."""
        return self.page.locator(
            ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .chainrule-live"
        ).all()

    def wait_for_widget_state(
        self, widget: Locator, before: str, notebook_name: str, timeout_ms: int = WIDGET_TIMEOUT_MS
    ) -> dict:
        """Wait until the widget's state record differs from ``before`` (its JSON text) and the
        kernel is idle; the record then: ``{"values": {...}, "error": "..."}``."""
        marker = widget.locator(".chainrule-state")
        try:
            self.page.wait_for_function(
                "([el, old]) => el.querySelector('.chainrule-state') &&"
                " el.querySelector('.chainrule-state').dataset.values !== old",
                arg=[widget.element_handle(), before],
                timeout=timeout_ms,
                polling=POLL_MS,
            )
        except PlaywrightTimeoutError:
            raise AssertionError(
                f"a widget of {notebook_name} did not recompute within {timeout_ms / 1000:.0f} s"
            ) from None
        self.wait_for_kernel_idle(notebook_name)
        return {
            "values": json.loads(marker.get_attribute("data-values") or "{}"),
            "error": marker.get_attribute("data-error") or "",
        }

    def widget_state(self, widget: Locator) -> str:
        """The JSON text of the values the widget shows now."""
        return widget.locator(".chainrule-state").get_attribute("data-values") or ""

    def wait_for_outputs_to_change(
        self, before: str, notebook_name: str, timeout_ms: int = WIDGET_TIMEOUT_MS
    ) -> str:
        """Wait until the outputs differ from ``before`` and are not empty, then for the
        kernel to be idle; the outputs' signature then. AssertionError if they never change."""
        try:
            self.page.wait_for_function(
                f"before => {{ const now = ({_OUTPUTS_SIGNATURE_JS})(); "
                "return now !== before && now.length > 0; }",
                arg=before,
                timeout=timeout_ms,
                polling=POLL_MS,
            )
        except PlaywrightTimeoutError:
            raise AssertionError(
                f"no output of {notebook_name} changed within {timeout_ms / 1000:.0f} s"
            ) from None
        self.wait_for_kernel_idle(notebook_name)
        return self.outputs_signature()

    # -- nbgrader --------------------------------------------------------------------------

    def validate(self) -> Locator:
        """Press nbgrader's Validate toolbar button; return the "Validation Results" dialog."""
        self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) jp-button.validate-button").click()
        dialog = self.page.locator(".jp-Dialog").filter(
            has=self.page.locator(".jp-Dialog-header", has_text="Validation Results")
        )
        dialog.wait_for(timeout=VALIDATE_TIMEOUT_MS)
        return dialog

    def close_dialog(self, dialog: Locator) -> None:
        dialog.locator("button.jp-Dialog-button").last.click()
        dialog.wait_for(state="detached")

    def open_nbgrader_panel(self, command: str, tab_label: str) -> Locator:
        """Nbgrader ▸ <panel>; wait for its tab to be the current one; return the panel."""
        self.click_menu("Nbgrader", command)
        tab = self.page.locator(
            "#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel",
            has_text=re.compile(f"^{re.escape(tab_label)}$"),
        )
        tab.wait_for()
        return self.page.locator("#jp-main-dock-panel .lm-DockPanel-widget:not(.lm-mod-hidden)")

    def formgrader_frame(self) -> FrameLocator:
        """The formgrader's page, which JupyterLab shows in an iframe."""
        return self.page.frame_locator(
            "#jp-main-dock-panel .lm-DockPanel-widget:not(.lm-mod-hidden) iframe"
        )


def looks_like_error(text: str) -> bool:
    """Whether a stderr output's text is an exception traceback rather than a warning."""
    if "Traceback (most recent call last)" in text:
        return True
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return bool(lines) and _ERROR_LINE.fullmatch(lines[-1]) is not None and ":" in lines[-1]
