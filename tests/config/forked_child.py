"""A child for tests/config/test_forkserver.py: writes what it was given and what it runs as, as
JSON, to its log, then exits with the code its first argument names (or waits, for `wait`); an
interpreter's exit then says so, as its atexit handlers run."""

import atexit
import json
import os
import sys
import time

if __name__ == "__main__":
    atexit.register(print, "atexit ran")
    print(json.dumps({
        "probe": os.environ.get("AGORA_PROBE"), "cwd": os.getcwd(), "session": os.getsid(0), "pid": os.getpid(),
        "argv": sys.argv[1:], "stdin": sys.stdin.read(), "main": __name__,
    }))  # fmt: skip
    if sys.argv[1] == "wait":
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
