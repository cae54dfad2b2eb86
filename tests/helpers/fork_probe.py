"""Run by test_forked_cli as ``python -m fork_probe ACTION``: reports what a process sees of itself."""

import json
import os
import signal
import sys

if __name__ == "__main__":
    action = sys.argv[1]
    if action == "report":
        print(json.dumps({
            "pid": os.getpid(), "cwd": os.getcwd(), "path0": sys.path[0], "argv": sys.argv,
            "env": os.environ.get("FORK_PROBE"), "stdin": [os.fstat(0).st_dev, os.fstat(0).st_ino],
            "sid": os.getsid(0),
            "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "main_spec": sys.modules["__main__"].__spec__.name,
        }))  # fmt: skip
        print("to stderr\r\nline two", file=sys.stderr)
    elif action == "exit":
        sys.exit(int(sys.argv[2]))
    elif action == "signal":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "raise":
        raise ValueError("from the probe")
    elif action == "sleep":
        print("sleeping", flush=True)
        signal.pause()
    elif action == "sleep_closed":  # its output closed, still running
        os.close(1)
        os.close(2)
        signal.pause()
