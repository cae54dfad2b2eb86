"""Run by test_forked_cli as ``python -m fork_probe ACTION``: reports what a process sees of itself."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys


def report(rank: int | None = None) -> None:
    print(json.dumps({
        "rank": rank,
        "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "path0": sys.path[0], "argv": sys.argv,
        "env": os.environ.get("FORK_PROBE"), "stdin": [os.fstat(0).st_dev, os.fstat(0).st_ino],
        "sid": os.getsid(0),
        "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "main_spec": sys.modules["__main__"].__spec__.name,
        "preloaded": "lit_ddp.cli" in sys.modules,  # what the server imported: a fork of it
    }), flush=True)  # fmt: skip


def spawned(rank: int) -> None:  # what a spawned process runs (ddp_spawn's ranks: the trainer's work)
    report(rank)


if __name__ == "__main__":
    action = sys.argv[1]
    if action == "report":
        report()
        print("to stderr\r\nline two", file=sys.stderr)
    elif action == "launch":  # as a launcher starts ranks: its own report, then theirs (one to a file)
        report()
        rank = [sys.executable, "-m", "fork_probe", "report"]
        subprocess.Popen(rank, env={**os.environ, "FORK_PROBE": "rank"}).wait()
        with open("rank.log", "w") as log:
            subprocess.Popen(rank, stdout=log, stderr=subprocess.STDOUT).wait()
        subprocess.Popen(rank).wait()
    elif action == "spawn":  # as ddp_spawn starts its ranks, one after the other here
        report()
        for rank in range(2):
            process = multiprocessing.get_context("spawn").Process(target=spawned, args=(rank,))
            process.start()
            process.join()
            if process.exitcode:
                sys.exit(process.exitcode)
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
