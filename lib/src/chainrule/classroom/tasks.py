"""The grading queue: a Celery application with one task, grading one student's submission.

The broker is Redis (:class:`~chainrule.classroom.services.RedisServer`); every message is JSON
(never pickle: nothing a broker client sends can run code in a worker). A job is acknowledged
only when it is over (``acks_late``), so a worker that dies in the middle of one leaves it in
the queue:

- when a worker's grading process dies (killed, out of memory), Celery's main process sees it
  and puts the job back at once (``reject_on_worker_lost``);
- when the whole worker dies (its machine stops), the job goes back after the broker's
  *visibility timeout*, longer than any job can take (:attr:`ClassSettings.visibility_timeout_s`);
  the other workers' periodic sweep returns it to the queue.

Either way another worker grades it again from the start, and since the shared gradebook is
written once, at the end, by a write that gives the same rows when repeated
(:func:`chainrule.grading.queue.grade_job`), the grade is recorded once. A worker takes one job
at a time (``prefetch_multiplier = 1``), so a dead worker holds at most that one.

Each course has a queue and Redis keys of its own (``grading.<course>``, key prefix
``<course>:``), so two courses on one broker never see each other's jobs.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from pathlib import Path
from typing import Any

from celery import Celery, Task
from celery.signals import worker_process_init

TASK_NAME = "chainrule.grade_submission"
#: Seconds a job may run before Celery kills it, on top of the job's own per-submission limit
#: (which the grading child enforces first).
HARD_LIMIT_MARGIN_S = 300
#: Seconds a finished job's result stays in Redis.
RESULT_EXPIRES_S = 7 * 24 * 3600


def queue_name(course_id: str) -> str:
    """The course's queue."""
    return f"grading.{course_id}"


def make_app(
    broker_url: str,
    result_url: str,
    course_id: str,
    visibility_timeout_s: float,
    course_root: str | Path | None = None,
) -> Celery:
    """The course's Celery application (``course_root``: where a worker's copy of the course
    is; only workers need it)."""
    app = Celery(f"chainrule-{course_id}", broker=broker_url, backend=result_url)
    prefix = f"{course_id}:"
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_default_queue=queue_name(course_id),
        task_track_started=True,
        result_expires=RESULT_EXPIRES_S,
        result_extended=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        broker_transport_options={
            "visibility_timeout": visibility_timeout_s,
            "global_keyprefix": prefix,
            "unacked_restore_interval": 5,
            "unacked_restore_throttle": 1,
        },
        result_backend_transport_options={"global_keyprefix": prefix},
        chainrule_course_root=str(course_root) if course_root else None,
        chainrule_course_id=course_id,
    )
    app.task(name=TASK_NAME, bind=True)(grade_submission)
    return app


@worker_process_init.connect
def _may_start_children(**_: Any) -> None:
    """Let a pool process start the grading child with the standard library's
    ``multiprocessing``: Celery's pool (billiard) marks its processes as daemons, which may not
    have children, and gives them an authentication key of its own type, which the fork server
    refuses to send. The grading child kills its own process tree
    (:func:`chainrule.grading.child.run_limited`), so nothing is left behind."""
    process: Any = multiprocessing.current_process()
    process.daemon = False
    key: Any = multiprocessing.process
    process._config["authkey"] = key.AuthenticationString(os.urandom(32))


def attempt_key(course_id: str, task_id: str) -> str:
    """The Redis key counting how often a job was started."""
    return f"{course_id}:attempts:{task_id}"


def grade_submission(self: Task, job: dict[str, Any]) -> dict[str, Any]:
    """Grade one submission on this worker (:func:`chainrule.grading.queue.grade_job`); the
    result says which worker graded it and at which attempt."""
    from chainrule.grading.queue import grade_job

    conf = self.app.conf
    worker = self.request.hostname or socket.gethostname()
    client = self.app.backend.client
    key = attempt_key(conf.chainrule_course_id, self.request.id)
    attempt = int(client.incr(key))
    client.expire(key, RESULT_EXPIRES_S)
    self.update_state(state="STARTED", meta={"worker": worker, "attempt": attempt})
    result = grade_job(conf.chainrule_course_root, job, worker=worker)
    result["attempt"] = attempt
    return result


def run_worker(app: Celery, name: str, concurrency: int = 1, loglevel: str = "INFO") -> None:
    """Run a worker in this process until it is stopped (``SIGTERM``: finish the job in hand)."""
    app.worker_main(
        [
            "worker",
            f"--hostname={name}@{socket.gethostname()}",
            f"--concurrency={concurrency}",
            "--pool=prefork",
            f"--queues={app.conf.task_default_queue}",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
