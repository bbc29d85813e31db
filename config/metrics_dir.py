"""The directory where each process of a host counts its metrics (prometheus-client's
multiprocess mode, config/metrics.py), and emptying it before a host's services start:

    python -m config.metrics_dir reset
"""

import os
import sys
from pathlib import Path

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def reset(multiproc_dir: str | Path) -> None:
    """Empty the directory (creating it): the counts of a previous start must not add to this one's."""
    path = Path(multiproc_dir)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)


if __name__ == "__main__":
    if sys.argv[1:] != ["reset"]:
        sys.exit("usage: python -m config.metrics_dir reset")
    if not (directory := os.environ.get(MULTIPROC_ENV)):
        sys.exit(f"{MULTIPROC_ENV} is not set: a worker's pool processes would count where nobody reads")
    reset(directory)
