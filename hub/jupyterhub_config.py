"""JupyterHub of the course for a class (``make hub``; set up by ``make hub-setup``).

Follows nbgrader's documented JupyterHub set-up for one course with several graders: the
students are the hub group ``nbgrader-<course>``, the instructors and the course's grader
account the group ``formgrade-<course>``; the formgrader is a hub service run by the grader
account from the course's folder, which only the ``formgrade-<course>`` group may open; every
server uses nbgrader's ``JupyterHubAuthPlugin`` to learn its user's courses from the hub.

Everything class-specific comes from the class's settings file (``$CHAINRULE_CLASS``, written
by ``python -m chainrule.classroom setup``) and its roster. Accounts are the machine's, logged
in with PAM; any other authenticator works the same (set ``c.JupyterHub.authenticator_class``
and keep the users' names equal to their nbgrader ids).
"""

import json
import sys
from pathlib import Path

from chainrule.classroom.deploy import PROXY, grader_env, venv_bin
from chainrule.classroom.settings import SETTINGS_ENV, ClassSettings

c = get_config()  # noqa: F821 - provided by traitlets

settings = ClassSettings.read()
roster = json.loads((settings.root / "roster.json").read_text())
instructors = sorted(roster["instructors"])
students = sorted(roster["students"])
course = settings.course_id
BIN = venv_bin()

# -- the hub, its proxy and its state -------------------------------------------------------------
c.JupyterHub.ip = settings.host
c.JupyterHub.port = settings.hub_port
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = settings.hub_port + 1
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.hub_port + 2}"
c.ConfigurableHTTPProxy.command = [str(PROXY)]
c.ConfigurableHTTPProxy.pid_file = str(settings.hub_dir / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{settings.hub_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(settings.hub_dir / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(settings.hub_dir / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True

# -- who may log in: the roster's accounts, with their system passwords (PAM) ---------------------
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = set(instructors) | set(students)

# -- each person's JupyterLab: the course's environment, run as their own account -----------------
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.http_timeout = 120
c.Spawner.start_timeout = 120
c.Spawner.environment = {
    "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
    "JUPYTER_CONFIG_PATH": str(settings.jupyter_config),
    "NBGRADER_EXCHANGE": str(settings.exchange),
}

# -- nbgrader's groups and roles ------------------------------------------------------------------
c.JupyterHub.load_groups = {
    "instructors": {"users": instructors},
    f"formgrade-{course}": {"users": [*instructors, settings.grader_account]},
    f"nbgrader-{course}": {"users": students},
}
c.JupyterHub.load_roles = [
    {"name": "instructor", "groups": ["instructors"], "scopes": ["admin:users", "admin:servers"]},
    # each server acts with its user's own permissions (nbgrader reads the user's groups)
    {"name": "server", "scopes": ["inherit"]},
    {
        "name": f"formgrade-{course}",
        "groups": [f"formgrade-{course}"],
        "scopes": [f"access:services!service={course}"],
    },
    {
        "name": f"nbgrader-{course}",
        "groups": [f"nbgrader-{course}"],
        "scopes": ["list:services", f"read:services!service={course}"],
    },
    # the formgrader keeps the hub's group of students in step with its gradebook
    {
        "name": f"grader-{course}",
        "services": [course],
        "scopes": ["list:users", "read:users", "read:groups", "groups"],
    },
]

# -- the formgrader: a service run by the grader account in the course's folder -------------------
c.JupyterHub.services = [
    {
        "name": course,
        "url": f"http://127.0.0.1:{settings.formgrader_port}",
        "command": [
            str(BIN / "jupyterhub-singleuser"),
            f"--ServerApp.root_dir={settings.grader_home}",
        ],
        "user": settings.grader_account,
        "cwd": str(settings.grader_home),
        "environment": {
            **grader_env(settings),
            "JUPYTERHUB_DEFAULT_URL": "/lab",
            SETTINGS_ENV: str(settings.path),
        },
        "oauth_no_confirm": True,
    }
]
print(f"JupyterHub of {course} from {sys.executable}; settings {Path(settings.path)}")
