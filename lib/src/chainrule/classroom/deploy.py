"""Set up and run the course for a class on one machine (``make hub``).

:func:`setup_class` (``python -m chainrule.classroom setup``, as root) makes, under the class's
folder (``/srv/autograd-distributed`` by default):

- the settings (``class.json``, :mod:`.settings`) and the roster (``roster.json``);
- the groups ``formgrade-<course>`` and ``nbgrader-<course>``, the grader account
  ``grader-<course>`` (home ``grader/``) and an account per person of the roster (homes under
  ``home/``, mode 0700), with passwords;
- the course folder ``grader/<course>/`` (mode 0750, the graders' group): the repository's
  ``source/`` and its ``nbgrader_config.py`` (as ``course_config.py``), and an
  ``nbgrader_config.py`` that loads it and then the class's settings (:func:`class_config`:
  the PostgreSQL gradebook, the exchange, nbgrader's ``JupyterHubAuthPlugin``, owner checks);
- the exchange (:mod:`.exchange`);
- the Jupyter configuration of every account's server (``jupyter/``: the course's nbgrader
  settings without the gradebook, the exchange, no formgrader in students' servers, no news
  pop-ups) and of the formgrader service (``jupyter-graders/``: the queue's Autograde);
- the PostgreSQL cluster and gradebook, with the assignments generated into it.

:class:`Deployment` (``python -m chainrule.classroom start``) then runs PostgreSQL, Redis, the
grading workers and JupyterHub (``hub/jupyterhub_config.py`` of the repository), and stops them
all on Ctrl-C or :meth:`Deployment.stop`.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chainrule.classroom import accounts
from chainrule.classroom.exchange import prepare_exchange
from chainrule.classroom.services import PostgresServer, RedisServer, wait_for_port
from chainrule.classroom.settings import SETTINGS_ENV, ClassSettings, Roster

#: The repository this module is installed from (editable install: ``lib/src/chainrule/...``).
REPO = Path(__file__).resolve().parents[4]
HUB_CONFIG = REPO / "hub" / "jupyterhub_config.py"
PROXY = REPO / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
#: The command of the servers JupyterHub spawns for each account.
SINGLE_USER = "jupyterhub-singleuser"
ASSIGNMENTS = ("check_yourself", "sharded", "training", "pipeline")

#: JupyterLab settings of every account: no news or update pop-ups over the notebook.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    }
}


def venv_bin() -> Path:
    """The ``bin/`` of the environment the hub, the servers and the workers run from."""
    return Path(sys.executable).parent


def class_config(c: Any, settings_path: str | Path) -> None:
    """The class's part of the course's nbgrader configuration (called at the end of the
    course folder's ``nbgrader_config.py``)."""
    settings = ClassSettings.read(settings_path)
    c.CourseDirectory.course_id = settings.course_id
    c.CourseDirectory.db_url = settings.db_url
    c.Exchange.root = str(settings.exchange)
    c.Exchange.path_includes_course = True
    c.ExchangeCollect.check_owner = True
    c.ExchangeFactory.submit = "chainrule.classroom.exchange.PrivateSubmit"
    c.Authenticator.plugin_class = "nbgrader.auth.JupyterHubAuthPlugin"


def student_config(c: Any, exchange: str) -> None:
    """The nbgrader configuration of every account's own server: the course's settings (what
    validation runs with), the exchange, and no gradebook."""
    c.Exchange.root = exchange
    c.Exchange.path_includes_course = True
    c.ExchangeFactory.submit = "chainrule.classroom.exchange.PrivateSubmit"
    c.Authenticator.plugin_class = "nbgrader.auth.JupyterHubAuthPlugin"


def _course_config_text(settings: ClassSettings) -> str:
    return (
        '"""The course on the class\'s JupyterHub (written by `python -m chainrule.classroom '
        'setup`):\nthe course\'s own settings, then the class\'s."""\n\n'
        "c = get_config()  # noqa: F821\n"
        f"load_subconfig({str(settings.course_dir / 'course_config.py')!r})  # noqa: F821\n\n"
        "from chainrule.classroom.deploy import class_config  # noqa: E402\n\n"
        f"class_config(c, {str(settings.path)!r})\n"
    )


def _student_config_text(settings: ClassSettings) -> str:
    return (
        '"""nbgrader settings of every server of the class (written by `python -m '
        'chainrule.classroom setup`)."""\n\n'
        "import os\n\n"
        "c = get_config()  # noqa: F821\n"
        f"load_subconfig({str(settings.jupyter_config / 'course_config.py')!r})  # noqa: F821\n\n"
        "from chainrule.classroom.deploy import student_config  # noqa: E402\n\n"
        f'student_config(c, os.environ.get("NBGRADER_EXCHANGE", {str(settings.exchange)!r}))\n'
    )


def write_jupyter_configs(settings: ClassSettings, course: Path) -> None:
    """``jupyter/`` (every account's servers) and ``jupyter-graders/`` (the formgrader)."""
    everyone = settings.jupyter_config
    (everyone / "labconfig").mkdir(parents=True, exist_ok=True)
    shutil.copy(course / "nbgrader_config.py", everyone / "course_config.py")
    (everyone / "nbgrader_config.py").write_text(_student_config_text(settings))
    (everyone / "jupyter_server_config.json").write_text(
        json.dumps(
            {"ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": False}}}
        )
    )
    disabled = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment"]
    (everyone / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {name: True for name in disabled}})
    )
    graders = settings.root / "jupyter-graders"
    graders.mkdir(exist_ok=True)
    (graders / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "ServerApp": {
                    "jpserver_extensions": {
                        "chainrule.classroom.formgrader": True,
                        "nbgrader.server_extensions.formgrader": True,
                    }
                }
            }
        )
    )
    for folder in (everyone, graders):
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def write_lab_settings(login: str, home: Path) -> None:
    for relative, values in LAB_SETTINGS.items():
        path = home / ".jupyter" / "lab" / "user-settings" / relative
        accounts.write_as(login, path, json.dumps(values))


def make_course_folder(settings: ClassSettings, course: Path) -> None:
    """The course folder: ``source/``, the course's configuration, the class's on top."""
    folder = settings.course_dir
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "source").exists():
        shutil.rmtree(folder / "source")
    shutil.copytree(
        course / "source",
        folder / "source",
        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
    )
    shutil.copy(course / "nbgrader_config.py", folder / "course_config.py")
    (folder / "nbgrader_config.py").write_text(_course_config_text(settings))
    # the formgrader service starts in the grader's home: nbgrader reads its config there
    (settings.grader_home / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"load_subconfig({str(folder / 'nbgrader_config.py')!r})  # noqa: F821\n"
    )
    accounts.chown_tree(settings.grader_home, settings.grader_account, settings.formgrade_group)
    folder.chmod(0o750)


def grader_env(settings: ClassSettings) -> dict[str, str]:
    """The environment of the grader account's processes (formgrader, nbgrader commands)."""
    return {
        "PATH": f"{venv_bin()}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": str(settings.grader_home),
        "USER": settings.grader_account,
        SETTINGS_ENV: str(settings.path),
        "NBGRADER_EXCHANGE": str(settings.exchange),
        "JUPYTER_CONFIG_PATH": str(settings.root / "jupyter-graders"),
    }


def as_grader(
    settings: ClassSettings, args: Sequence[str], timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run a command as the grader account in the course folder (an nbgrader command)."""
    return subprocess.run(
        ["runuser", "-u", settings.grader_account, "--", *args],
        cwd=settings.course_dir,
        env=grader_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def generate_assignments(settings: ClassSettings, assignments: Sequence[str]) -> None:
    """``nbgrader generate_assignment`` of each assignment, as the grader, into the gradebook."""
    for assignment in assignments:
        result = as_grader(
            settings, [str(venv_bin() / "nbgrader"), "generate_assignment", assignment, "--force"]
        )
        if result.returncode != 0 or "| ERROR]" in result.stderr:
            raise RuntimeError(f"generate_assignment {assignment} failed:\n{result.stderr}")


def stop_leftovers(settings: ClassSettings, roster: Roster) -> list[str]:
    """Stop what an earlier run of a class left running under the course's accounts (a hub
    that crashed leaves its single-user servers and the formgrader behind; they hold the
    accounts, and their ports, and would serve last run's files): every process of the
    grader account, and the single-user servers of the roster's people (nothing else of
    theirs: an instructor's account may be their own login). Returns the accounts stopped."""
    stopped = []
    people = [*roster.instructors, *roster.students]
    for login, command in [(settings.grader_account, None), *[(p, SINGLE_USER) for p in people]]:
        try:
            pwd.getpwnam(login)
        except KeyError:
            continue
        if accounts.stop_processes(login, command):
            stopped.append(login)
    return stopped


def setup_class(
    root: Path,
    roster: Roster,
    course: Path = REPO,
    passwords: Mapping[str, str] | None = None,
    hub_port: int = 8000,
    assignments: Sequence[str] = ASSIGNMENTS,
    **ports: int,
) -> ClassSettings:
    """Set the class up (see the module docstring); its settings.

    ``passwords``: each login's password; a login without one gets a random password, written
    to ``<root>/passwords.txt`` (root only) for the instructor to hand out.
    """
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    if (root / "class.json").exists():
        settings = ClassSettings.read(root / "class.json")
    else:
        settings = ClassSettings(root=root, hub_port=hub_port, **ports)  # type: ignore[arg-type]
    settings.homes.mkdir(exist_ok=True)
    settings.homes.chmod(0o755)
    for folder in (settings.hub_dir, settings.logs):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o700)
    stop_leftovers(settings, roster)
    accounts.ensure_group(settings.formgrade_group)
    accounts.ensure_group(settings.students_group)
    accounts.ensure_account(
        settings.grader_account,
        f"Grader {settings.course_id}",
        settings.grader_home,
        [settings.formgrade_group],
        home_mode=0o750,
        shell=accounts.NOLOGIN,
    )
    settings.write()
    shutil.chown(settings.path, "root", settings.formgrade_group)
    (root / "roster.json").write_text(
        json.dumps({"instructors": roster.instructors, "students": roster.students}, indent=1)
    )
    handed_out = {}
    people = [(login, name, settings.formgrade_group) for login, name in roster.instructors.items()]
    people += [(login, name, settings.students_group) for login, name in roster.students.items()]
    for login, name, group in people:
        password = (passwords or {}).get(login)
        if password is None:
            password = handed_out[login] = secrets.token_urlsafe(9)
        home = settings.homes / login
        accounts.ensure_account(login, name, home, [group], password=password)
        write_lab_settings(login, home)
    if handed_out:
        path = root / "passwords.txt"
        path.write_text("".join(f"{login} {pw}\n" for login, pw in handed_out.items()))
        path.chmod(0o600)
    # every account runs the course's environment: its folder and its interpreter's
    accounts.readable_by_everyone(venv_bin())
    accounts.readable_by_everyone(Path(sys.executable).resolve())
    make_course_folder(settings, course)
    prepare_exchange(
        settings.exchange, settings.course_id, settings.grader_account, settings.formgrade_group
    )
    write_jupyter_configs(settings, course)
    postgres = Deployment(settings).postgres
    postgres.start()
    postgres.ensure_gradebook(settings.database, settings.db_password)
    generate_assignments(settings, assignments)
    return settings


def teardown_class(settings: ClassSettings) -> None:
    """Remove the class's accounts, groups and folder (tests; a class that ends). What a hub
    left running under the accounts is stopped first (:func:`stop_leftovers`): a hub stopped
    with SIGKILL, after its formgrader took too long to end, never stops its servers, and an
    account that runs a process cannot be removed."""
    roster = Roster.read(settings.root / "roster.json")
    stop_leftovers(settings, roster)
    for login in [*roster.instructors, *roster.students, settings.grader_account]:
        accounts.remove_account(login)
    for group in (settings.formgrade_group, settings.students_group):
        accounts.remove_group(group)
    shutil.rmtree(settings.root, ignore_errors=True)


class Deployment:
    """The class's running parts: PostgreSQL, Redis, grading workers and JupyterHub."""

    def __init__(self, settings: ClassSettings) -> None:
        self.settings = settings
        self.postgres = PostgresServer(settings.postgres_dir, settings.host, settings.postgres_port)
        self.redis = RedisServer(
            settings.redis_dir, settings.host, settings.redis_port, settings.redis_password
        )
        self.workers: dict[str, subprocess.Popen] = {}
        self.hub: subprocess.Popen | None = None

    def start_services(self) -> None:
        self.postgres.start()
        self.redis.start()

    def start_worker(
        self,
        name: str,
        course_root: Path | None = None,
        visibility_timeout_s: float | None = None,
    ) -> subprocess.Popen:
        """One grading worker, a process group of its own, logging to ``logs/<name>.log``."""
        args = [sys.executable, "-m", "chainrule.classroom", "worker"]
        args += ["--settings", str(self.settings.path), "--name", name]
        if course_root is not None:
            args += ["--course-root", str(course_root)]
        if visibility_timeout_s is not None:
            args += ["--visibility-timeout", str(visibility_timeout_s)]
        env = dict(os.environ, PATH=f"{venv_bin()}:{os.environ.get('PATH', '')}")
        env["NBGRADER_EXCHANGE"] = str(self.settings.exchange)
        log = open(self.settings.logs / f"{name}.log", "ab")  # noqa: SIM115 - the worker's
        self.workers[name] = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        return self.workers[name]

    def start_hub(self) -> None:
        """JupyterHub with the repository's ``hub/jupyterhub_config.py``; wait until its login
        page answers."""
        if not PROXY.exists():
            raise RuntimeError(
                f"{PROXY} is missing: install the proxy with `npm ci --prefix {PROXY.parents[2]}`"
            )
        env = dict(os.environ, PATH=f"{venv_bin()}:{os.environ.get('PATH', '')}")
        env[SETTINGS_ENV] = str(self.settings.path)
        env.pop("NBGRADER_EXCHANGE", None)
        log = open(self.settings.logs / "jupyterhub.log", "ab")  # noqa: SIM115 - the hub's
        self.hub = subprocess.Popen(
            [str(venv_bin() / "jupyterhub"), "-f", str(HUB_CONFIG)],
            cwd=self.settings.hub_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_for_port(self.settings.host, self.settings.hub_port, timeout_s=120)
        self._wait_for_login_page()

    def _wait_for_login_page(self) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.hub is not None and self.hub.poll() is not None:
                raise RuntimeError(f"JupyterHub exited:\n{self.log_tail('jupyterhub')}")
            try:
                with urllib.request.urlopen(f"{self.settings.hub_url}/hub/login", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.3)
        raise RuntimeError(
            f"JupyterHub's login page did not answer:\n{self.log_tail('jupyterhub')}"
        )

    def log_tail(self, name: str, lines: int = 80) -> str:
        path = self.settings.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def start(self, hub: bool = True, workers: int = 2) -> None:
        self.start_services()
        for index in range(workers):
            self.start_worker(f"worker{index + 1}")
        if hub:
            self.start_hub()

    @staticmethod
    def _end(process: subprocess.Popen, timeout: float = 30) -> None:
        """SIGTERM to the process group, then SIGKILL to what is left of it."""
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def stop_worker(self, name: str) -> None:
        self._end(self.workers.pop(name))

    def stop(self) -> None:
        """Stop everything this deployment started (the hub stops the servers it spawned)."""
        if self.hub is not None:
            self._end(self.hub)
            self.hub = None
        for name in list(self.workers):
            self.stop_worker(name)
        self.redis.stop()
        self.postgres.stop()

    def run_forever(self, hub: bool = True, workers: int = 2) -> int:
        """Start, print where the hub is, and stop on Ctrl-C or SIGTERM."""
        stop = {"now": False}

        def interrupt(signum: int, frame: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, interrupt)
        try:
            self.start(hub=hub, workers=workers)
            if hub:
                print(f"JupyterHub of {self.settings.course_id}: {self.settings.hub_url}/")
            print(f"{workers} grading worker(s); logs in {self.settings.logs}; Ctrl-C stops all")
            while not stop["now"]:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
        return 0
