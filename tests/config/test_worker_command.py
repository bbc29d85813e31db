"""The worker command (config/production.py), as `make run` and production build it: how many
processes, which queues."""

from config import production


def worker_options(argv: list[str]) -> tuple[str, str, str]:
    return argv[argv.index("-n") + 1], argv[argv.index("--concurrency") + 1], argv[argv.index("-Q") + 1]


def test_the_worker_takes_its_concurrency_and_several_queues_from_the_environment() -> None:
    argv = production.argv("worker", {"WORKER_NAME": "w2", "WORKER_CONCURRENCY": "8", "WORKER_QUEUES": "celery,bulk"})

    assert argv[1:5] == ["-m", "celery", "-A", "config"] and argv[5] == "worker"
    assert worker_options(argv) == ("w2@%h", "8", "celery,bulk")


def test_without_them_it_runs_two_processes_on_the_default_queue() -> None:
    assert worker_options(production.argv("worker", {"WORKER_QUEUES": ""})) == ("w1@%h", "2", "celery")
