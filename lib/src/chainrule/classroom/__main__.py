"""Command line of the class deployment (``make hub``, ``make worker``).

``python -m chainrule.classroom setup [--root DIR] [--roster FILE]``
    accounts, groups, folders, exchange, gradebook database and configuration (as root).
``python -m chainrule.classroom start [--root DIR] [--workers N]``
    PostgreSQL, Redis, N grading workers and the JupyterHub, until interrupted (Ctrl-C).
``python -m chainrule.classroom services [--root DIR]``
    only PostgreSQL and Redis, until interrupted.
``python -m chainrule.classroom worker [--settings FILE] [--course-root DIR] [--name NAME]``
    one grading worker (on this or another machine; see the README), until stopped.
``python -m chainrule.classroom grade <assignment> [--student ID ...] [--course-root DIR]``
    grade everything submitted on the queue, with progress, feedback and exports.
``python -m chainrule.classroom export [--course-root DIR] [--out FILE]``
    the LMS grades file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from chainrule.classroom.settings import COURSE_ID, ClassSettings, Roster


def _settings(args: argparse.Namespace) -> ClassSettings:
    if getattr(args, "settings", None):
        return ClassSettings.read(args.settings)
    if getattr(args, "root", None):
        return ClassSettings.read(Path(args.root) / "class.json")
    return ClassSettings.read()


def app_for(settings: ClassSettings, course_root: Path | None, visibility: float | None = None):  # noqa: ANN201 - a Celery app
    """The Celery application of the course at ``course_root`` (its course id from its
    nbgrader configuration)."""
    from chainrule.classroom.tasks import make_app
    from chainrule.grading.config import CourseLayout, load_config

    root = course_root or settings.course_dir
    course_id = CourseLayout.from_config(load_config(root)).course_id
    timeout = visibility if visibility is not None else settings.visibility_timeout_s
    return make_app(settings.broker_url, settings.result_url, course_id, timeout, root)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chainrule.classroom", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    default_root = Path(f"/srv/{COURSE_ID}")

    setup = sub.add_parser("setup", help="accounts, folders, exchange, gradebook, configuration")
    setup.add_argument("--root", type=Path, default=default_root)
    setup.add_argument("--roster", type=Path, default=Path("hub/roster.json"))
    setup.add_argument("--course", type=Path, default=Path("."), help="the course repository")
    setup.add_argument("--hub-port", type=int, default=8000)

    for name in ("start", "services"):
        command = sub.add_parser(name, help=f"{name} until interrupted")
        command.add_argument("--root", type=Path, default=default_root)
        if name == "start":
            command.add_argument("--workers", type=int, default=2)

    worker = sub.add_parser("worker", help="one grading worker")
    worker.add_argument("--settings", type=Path)
    worker.add_argument("--course-root", type=Path)
    worker.add_argument("--name", default="worker")
    worker.add_argument("--concurrency", type=int, default=1)
    worker.add_argument("--visibility-timeout", type=float)

    grade = sub.add_parser("grade", help="grade an assignment on the queue")
    grade.add_argument("assignment")
    grade.add_argument("--settings", type=Path)
    grade.add_argument("--course-root", type=Path)
    grade.add_argument("--student", action="append", default=[])
    grade.add_argument("--timeout-per-submission", type=float, default=600.0)
    grade.add_argument("--memory-limit-mb", type=int, default=4096)
    grade.add_argument("--no-feedback", action="store_true")
    grade.add_argument("--no-sandbox", action="store_true")

    export = sub.add_parser("export", help="write the LMS grades file")
    export.add_argument("--settings", type=Path)
    export.add_argument("--course-root", type=Path)
    export.add_argument("--out", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, overrides = build_parser().parse_known_args(argv)
    if args.command == "setup":
        from chainrule.classroom.deploy import setup_class

        settings = setup_class(
            args.root, Roster.read(args.roster), args.course.resolve(), hub_port=args.hub_port
        )
        print(f"class set up in {settings.root}; start it with `make hub`")
        return 0
    if args.command in ("start", "services"):
        from chainrule.classroom.deploy import Deployment

        deployment = Deployment(_settings(args))
        workers = args.workers if args.command == "start" else 0
        return deployment.run_forever(hub=args.command == "start", workers=workers)
    settings = _settings(args)
    if args.command == "worker":
        from chainrule.classroom.tasks import run_worker

        app = app_for(settings, args.course_root, args.visibility_timeout)
        run_worker(app, args.name, args.concurrency)
        return 0
    if args.command == "grade":
        from chainrule.classroom.dispatch import grade_on_queue
        from chainrule.grading.queue import BatchOptions

        root = args.course_root or settings.course_dir
        options = BatchOptions(
            assignment=args.assignment,
            course_root=root,
            timeout_per_submission=args.timeout_per_submission or None,
            memory_limit_mb=args.memory_limit_mb or None,
            students=args.student,
            overrides=overrides,
            feedback=not args.no_feedback,
            sandbox=not args.no_sandbox,
        )
        result = grade_on_queue(app_for(settings, root), options)
        return 0 if result.all_graded else 3
    if args.command == "export":
        from chainrule.classroom.lms import write_lms_csv
        from chainrule.grading.config import load_config

        root = args.course_root or settings.course_dir
        out = write_lms_csv(load_config(root), args.out or root / "grades" / "lms-grades.csv")
        print(out)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
