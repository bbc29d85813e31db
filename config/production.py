"""The production commands: the one place the README's production section, `make run`'s supervisor
(config/stack.py) and the deployment test (tests/config/test_production.py) take them from.

    python -m config.production      # print them, as the README shows them

Each is a shell line with `$VARIABLES` from the environment (defaults below); `python` is the
interpreter of the virtualenv. Steps run once per release, in order; host steps on each host before
its services start; services run side by side.
Read without Django: printing them needs no settings.
"""

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from string import Template


@dataclass(frozen=True)
class Command:
    name: str
    line: str
    why: str


STEPS = [
    Command("migrate", "python manage.py migrate --noinput", "the database schema"),
    Command(
        "superuser",
        "python manage.py createsuperuser --noinput",
        "the first person: DJANGO_SUPERUSER_USERNAME, _PASSWORD, _EMAIL (once; it fails if taken)",
    ),
    Command(
        "profiles",
        "python manage.py load_profiles agents/profiles/default.json",
        "the agent profiles internal agents are added with (again after editing: it updates in place)",
    ),
]
# Each host's processes count their metrics into files in $PROMETHEUS_MULTIPROC_DIR (set it in
# every service's environment, config/metrics.py); what a previous start left there must go first.
HOST_STEPS = [
    Command(
        "metrics-dir",
        "python -m config.metrics_dir reset",
        "on each host before its services (re)start: empties $PROMETHEUS_MULTIPROC_DIR",
    ),
]
SERVICES = [
    Command(
        "web",
        "python -m daphne -b $WEB_HOST -p $WEB_PORT config.web:application",
        "web: stateless, run as many as you like",
    ),
    Command(
        "worker",
        "python -m celery -A config worker -l INFO -n $WORKER_NAME@%h --concurrency $WORKER_CONCURRENCY "
        "-Q $WORKER_QUEUES --without-mingle --without-gossip",
        "a worker: a distinct WORKER_NAME per worker on one host (w1, w2, ...), on as many hosts as you like",
    ),
    Command(
        "beat",
        "python -m celery -A config beat -l INFO --schedule $AGORA_DATA_DIR/celerybeat-schedule",
        "the reconciler's schedule: exactly one",
    ),
]
DEFAULTS = {
    "WEB_HOST": "0.0.0.0",
    "WEB_PORT": "8000",
    "WORKER_NAME": "w1",
    "WORKER_CONCURRENCY": "2",
    "WORKER_QUEUES": "celery",  # comma-separated; `celery` is where every task goes unless routed
}


def command(name: str) -> Command:
    return next(c for c in STEPS + HOST_STEPS + SERVICES if c.name == name)


def argv(name: str, env: Mapping[str, str]) -> list[str]:
    """The command as an argv, its variables taken from `env` (then DEFAULTS); `python` is this
    interpreter. A variable with neither (AGORA_DATA_DIR) must be set: KeyError otherwise."""
    values = {**DEFAULTS, **{k: v for k, v in env.items() if v}}
    words = [Template(word).substitute(values) for word in shlex.split(command(name).line)]
    return [sys.executable if words[0] == "python" else words[0], *words[1:]]


def render() -> str:
    """The commands as the README shows them."""
    lines = ["# once per release, in this order"]
    lines += [f"{c.line}  # {c.why}" for c in STEPS]
    lines += ["", "# on each host, every time its services start"]
    lines += [f"{c.line}  # {c.why}" for c in HOST_STEPS]
    lines += ["", "# the services, each under your process supervisor"]
    lines += [f"{c.line}  # {c.why}" for c in SERVICES]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
