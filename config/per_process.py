"""One instance of something per process: made at first use, and made anew in a forked child (a
Celery pool process), where the parent's threads and connections do not exist."""

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """Call it for this process's instance (`make()` at the first call in each process)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self.make = make
        self.lock = threading.Lock()
        self.pid = 0
        self.instance: T | None = None

    def __call__(self) -> T:
        with self.lock:
            if self.instance is None or self.pid != os.getpid():
                self.instance, self.pid = self.make(), os.getpid()
            return self.instance

    def made(self) -> T | None:
        """This process's instance if it has one, without making it."""
        return self.instance if self.pid == os.getpid() else None
