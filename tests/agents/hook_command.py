"""A hook command for the tests: it does what its options say, in this order, then prints.

--stdin-to FILE     write the event JSON it was given on stdin to FILE
--count FILE        append a line to FILE (how many times it ran)
--pid FILE          write its pid to FILE
--child FILE        start a child that sleeps 60 s, its pid in FILE
--times FILE        write "start end" (wall clock) around its sleep to FILE
--sleep S           sleep S seconds (stopping early if its parent dies: no orphan outlives a test)
--hang-unless FILE  if FILE does not exist, create it and sleep 60 s; otherwise go on
--wait-for FILE     wait until FILE exists (a gate the test opens), at most 60 s
--print TEXT        print TEXT on stdout
--exit N            exit with status N
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def nap(seconds: float) -> None:
    parent, deadline = os.getppid(), time.monotonic() + seconds
    while time.monotonic() < deadline and os.getppid() == parent:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("--stdin-to", "--count", "--pid", "--child", "--times", "--hang-unless", "--wait-for", "--print"):
        parser.add_argument(option)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--exit", type=int, default=0)
    args = parser.parse_args()
    event = sys.stdin.read()
    if args.stdin_to:
        Path(args.stdin_to).write_text(event)
    if args.count:
        with Path(args.count).open("a") as f:
            f.write("ran\n")
    if args.child:
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
        child = subprocess.Popen(sleeper, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        Path(args.child).write_text(str(child.pid))
    if args.pid:
        Path(args.pid).write_text(str(os.getpid()))
    if args.hang_unless and not Path(args.hang_unless).exists():
        Path(args.hang_unless).write_text("hung once")
        nap(60)
    if args.wait_for:
        parent, deadline = os.getppid(), time.monotonic() + 60
        while not Path(args.wait_for).exists() and time.monotonic() < deadline and os.getppid() == parent:
            time.sleep(0.02)
    start = time.time()
    nap(args.sleep)
    if args.times:
        Path(args.times).write_text(f"{start} {time.time()}")
    if args.print is not None:
        print(args.print)
    sys.exit(args.exit)


if __name__ == "__main__":
    main()
