"""Shared test settings for the library: hypothesis kept cheap (and derandomized in CI, where
``CI`` is set: the same examples on every run), float64 torch, a seeded rng."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "chainrule",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
    print_blob=True,
)
settings.load_profile("chainrule")


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in this process for the test, as in a kernel or a
    terminal, even where the suite was started with SIGINT ignored (a background job of a
    non-interactive shell inherits SIG_IGN, and Python then installs no handler)."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture
def rng():
    """A numpy generator with a fixed seed, fresh for each test."""
    return np.random.default_rng(12345)


def _sweep(widget):
    """Move every control of a LiveWidget to both ends (every option of a dropdown), one at a
    time; after each move the widget must show the new values (no stale state) and a readable
    picture. Yields (control name, value) after each move, for the test's own checks."""
    import json
    import re

    from chainrule.course.widgets.live_widget import figure_png, smallest_text_px

    for name, control in widget.controls.items():
        if hasattr(control, "options"):
            ends = (
                [value for _, value in control.options]
                if control.options and isinstance(control.options[0], tuple)
                else list(control.options)
            )
        elif hasattr(control, "min"):
            ends = [control.min, control.max]
        else:
            continue
        for value in ends:
            control.value = value
            match = re.search(r'data-values="([^"]*)"', widget.table.value)
            assert match, "the table does not say which values it shows"
            shown = json.loads(match.group(1).replace("&quot;", '"'))
            current = {k: getattr(v, "__name__", v) for k, v in widget.values().items()}
            assert shown == current, (name, value, shown)
            if widget.plot is not None and not widget.error:
                figure = widget.render_figure(widget.last_result)
                assert smallest_text_px(figure, figure_png(figure)) >= 9, (name, value)
            yield name, value


@pytest.fixture
def sweep():
    """See :func:`_sweep`."""
    return _sweep
