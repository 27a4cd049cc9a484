"""The course for a whole class: JupyterHub, a private exchange, a PostgreSQL gradebook, and
grading spread over machines by a task queue.

One machine serves the course to a class through a JupyterHub (:mod:`.deploy`); the students
and instructors are accounts of that machine; each student's JupyterLab has the nbgrader and
widget extensions; the instructors' formgrader is a hub service run by the course's grader
account, following nbgrader's documented JupyterHub set-up (groups ``formgrade-<course>`` and
``nbgrader-<course>``, ``JupyterHubAuthPlugin``). The parts:

- :mod:`.settings`: where a class lives and how its services are reached (one JSON file).
- :mod:`.services`: PostgreSQL (the gradebook) and Redis (the task queue's broker), started
  from Debian's packages for the class.
- :mod:`.accounts`: the Linux accounts and groups of the roster.
- :mod:`.exchange`: nbgrader's own exchange with permissions no student can read through.
- :mod:`.tasks`: the Celery application and its one task, grading one submission
  (:mod:`chainrule.grading.queue` does the grading itself).
- :mod:`.dispatch`: a batch of submissions sent to the queue, followed to the end with a
  progress display and an estimate of the time left, then feedback and exports.
- :mod:`.formgrader`: the formgrader's Autograde through the queue, and the batch page.
- :mod:`.lms`: the grades as a CSV file a learning-management system imports.

``python -m chainrule.classroom`` (``make hub``, ``make worker``) runs them.
"""
