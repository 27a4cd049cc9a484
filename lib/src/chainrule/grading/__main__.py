"""Command line of the grading pipeline.

``python -m chainrule.grading batch <assignment> [--workers N] [--timeout-per-submission S]
[--memory-limit-mb M] [--student ID ...] [--config-file F] [--Class.trait=value ...]``
grades, flags, gives feedback, exports and summarises (exit 0 when every notebook was graded,
3 when some could not be, 2 when the assignment is not in the gradebook, 4 when there is no
sandbox and ``--no-sandbox`` was not given).

``python -m chainrule.grading validate <notebook.ipynb> [--course-root DIR]``
validates with nbgrader's Validator and exits 1 when a test fails (0 when all pass).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from chainrule.grading.child import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, start_fork_server

EXIT_USAGE = 2
EXIT_NOT_ALL_GRADED = 3
EXIT_NO_SANDBOX = 4


def _limit(text: str) -> float | None:
    value = float(text)
    return None if value <= 0 else value


def build_parser() -> argparse.ArgumentParser:
    """The ``batch`` and ``validate`` sub-commands."""
    parser = argparse.ArgumentParser(
        prog="python -m chainrule.grading",
        description="Instructor grading pipeline on top of nbgrader.",
        epilog="Unknown --Class.trait=value options are nbgrader config overrides, "
        "e.g. --Execute.timeout=30.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    overrides = (
        "Other --Class.trait=value options override nbgrader_config.py, e.g. --Execute.timeout=30."
    )
    batch = sub.add_parser(
        "batch", help="autograde, feedback and export all submissions", epilog=overrides
    )
    batch.add_argument("assignment")
    batch.add_argument("--course-root", type=Path, default=Path("."))
    batch.add_argument("--workers", type=int, default=1, help="parallel graders (default 1)")
    batch.add_argument(
        "--timeout-per-submission",
        type=_limit,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"wall-clock seconds per student, 0 for none (default {DEFAULT_TIMEOUT_S:g})",
    )
    batch.add_argument(
        "--memory-limit-mb",
        type=lambda t: int(t) or None,
        default=DEFAULT_MEMORY_MB,
        metavar="M",
        help="address-space limit of the grader and of each kernel, in MiB; 0 for none "
        f"(default {DEFAULT_MEMORY_MB})",
    )
    batch.add_argument("--student", action="append", default=[], help="grade only these")
    batch.add_argument("--config-file", action="append", default=[], help="extra nbgrader config")
    batch.add_argument("--out", type=Path, help="output folder (default grades/<assignment>)")
    batch.add_argument("--no-feedback", action="store_true", help="skip generate_feedback")
    batch.add_argument(
        "--no-sandbox",
        action="store_true",
        help="grade without the bubblewrap sandbox (where it cannot run); the summary then says "
        "the grades were not isolated from the students' code",
    )

    validate = sub.add_parser(
        "validate", help="validate a notebook; exit 1 when a test fails", epilog=overrides
    )
    validate.add_argument("notebook", type=Path)
    validate.add_argument("--course-root", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a sub-command; return its exit status."""
    args, overrides = build_parser().parse_known_args(argv)
    unknown = [o for o in overrides if not (o.startswith("--") and "." in o.split("=")[0])]
    if unknown:
        build_parser().error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "validate":
        from chainrule.grading.validate import validate_notebook

        return validate_notebook(args.notebook, args.course_root, overrides)
    # The grading children's fork server imports nbgrader and torch: started before this
    # process imports the batch (nbgrader too), the two run side by side.
    start_fork_server()
    from chainrule.grading.batch import BatchOptions, SandboxUnavailable, run_batch

    options = BatchOptions(
        assignment=args.assignment,
        course_root=args.course_root,
        workers=max(1, args.workers),
        timeout_per_submission=args.timeout_per_submission,
        memory_limit_mb=args.memory_limit_mb,
        students=args.student,
        config_files=args.config_file,
        overrides=overrides,
        out_dir=args.out,
        feedback=not args.no_feedback,
        sandbox=not args.no_sandbox,
    )
    try:
        result = run_batch(options)
    except LookupError as error:  # the assignment was never generated
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except SandboxUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_NO_SANDBOX
    return 0 if result.all_graded else EXIT_NOT_ALL_GRADED


if __name__ == "__main__":
    sys.exit(main())
