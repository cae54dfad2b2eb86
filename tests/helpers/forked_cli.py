"""``python -m lit_ddp ARGS`` for the tests, without paying for the imports on every command.

A test that runs the command line waits about ten seconds for torch, Lightning and torchmetrics to import
before the command reads its first argument, and the suite runs hundreds of them. Here one server process
per pytest worker imports ``lit_ddp.cli`` once, then forks a child per command. The child is a real process
of its own (its own pid, environment, working folder, file descriptors 0-2, signal handling, exit status and
interpreter shutdown) running ``lit_ddp``'s ``__main__`` as ``python -m lit_ddp`` would; only the import of
modules that import nothing process-wide (a rule test_architecture enforces) is shared.

The first two processes a command starts as ``python -m MODULE | -c CODE | SCRIPT`` (Lightning's ``ddp``
launcher, the trust kit) or through multiprocessing's ``spawn`` (``ddp_spawn``) are forked too: before the
command runs a line, it forks two idle copies of itself (spares), and its ``subprocess.Popen`` and
multiprocessing's spawn hand such a process to a spare. The rank is then the command's child, as a new
interpreter would be (the fault monitor's parent watch reads that), and its ``Popen`` waits, polls and kills
it as usual. Further ranks, torchrun's, and those of a command run with ``LIT_DDP_TESTS_FRESH_RANKS=1`` are
new interpreters. ``ForkedPopen`` is the same for a process a test starts: the server forks it.

What the fork cannot give is what an interpreter reads before its first line: ``PYTHON*`` variables other
than PYTHONPATH, and the thread-library variables libgomp reads when it loads. A command whose environment
changes one of those runs as a plain subprocess; so does every command when ``LIT_DDP_TESTS_FORK=0`` or a
CUDA device is present (a CUDA test runs exactly the user's process).

    python tests/helpers/forked_cli.py SOCKET lit_ddp.cli   # the server; prints "ready" once it listens
    python tests/helpers/forked_cli.py --client SOCKET ARGV  # python ARGV, forked by that server
"""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import json
import multiprocessing.util
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Read by an interpreter or a thread library before the command's first line, so a fork cannot change them.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "LD_", "MALLOC_")
FORK_SAFE = {"PYTHONPATH", "PYTHONUNBUFFERED"}  # sys.path is set per child; stdio is unbuffered in both


def startup_change(env: dict[str, str], base: dict[str, str]) -> str | None:
    """The first variable that ``env`` sets unlike ``base`` and that only a new interpreter reads."""
    for key in sorted(set(env) | set(base)):
        if key.startswith(STARTUP_PREFIXES) and key not in FORK_SAFE and env.get(key) != base.get(key):
            return key
    return None


# ---------------------------------------------------------------------------------------------- the server


def _child(request: dict, fds: list[int], base_path: list[str]) -> None:
    """In the forked child: become ``python -m lit_ddp ARGS`` in the request's folder and environment."""
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    # Before the command runs a line: clean copies, each closing the command's ends of the earlier ones'.
    for _ in range(SPARES):
        _Spare.idle.append(_Spare(base_path, [spare.conn for spare in _Spare.idle]))
    subprocess.Popen = _RankPopen
    multiprocessing.util.spawnv_passfds = _spawn_rank
    _become(request, base_path)


def _become(request: dict, base_path: list[str]) -> None:
    """Run what ``python -m MODULE ARGS``, ``python SCRIPT ARGS`` or ``python -c CODE ARGS`` runs, here, in
    the request's folder and environment; never returns."""
    import importlib
    import runpy
    import types

    _enter(request)
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    # As python does: the script's folder (or the working one) first, then PYTHONPATH, then its own.
    script = request.get("script")
    first = os.path.dirname(os.path.abspath(script)) if script else os.getcwd()
    sys.path[:] = [first, *dict.fromkeys(extra), *(p for p in base_path if p not in extra)]
    importlib.invalidate_caches()
    if request.get("module"):
        sys.argv = ["-m", *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    elif script:
        sys.argv = [script, *request["args"]]
        runpy.run_path(script, run_name="__main__")
    else:
        sys.path[0] = ""  # as `python -c`
        sys.argv = ["-c", *request["args"]]
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    sys.exit(0)


def what_runs(argv: list[str]) -> dict | None:
    """What ``python ARGV`` runs, as a request's fields (module, script or code, and args), or None for a
    command line a fork cannot give (interpreter options such as -u or -W)."""
    argv = [os.fspath(a) for a in argv]
    if argv[:1] == ["-m"] and len(argv) > 1:
        return dict(module=argv[1], args=argv[2:])
    if argv[:1] == ["-c"] and len(argv) > 1:
        return dict(code=argv[1], args=argv[2:])
    if argv and not argv[0].startswith("-"):
        return dict(script=argv[0], args=argv[1:])
    return None


def _enter(request: dict) -> None:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])


# ---------------------------------------------------------------------------------------------- the ranks

SPARES = 2  # a 2-process run's ranks: ddp starts one, ddp_spawn two, the trust kit's 2-process launch two
FRESH_RANKS = "LIT_DDP_TESTS_FRESH_RANKS"  # set in a command's environment: its ranks are new interpreters
# Signals a job's process group gets (a Ctrl-C, a scheduler's stop): an idle spare is no process of the job's.
JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SPAWN_MAIN = "from multiprocessing.spawn import spawn_main"
# Linux passes at most 253 descriptors in one message; ddp_spawn passes one per tensor it shares (dozens)
MAX_FDS = 253
STARTUP_ENV: dict[str, str] = {}  # the server's environment before its imports: its spares' too


class _Spare:
    """An idle fork of a command, made before it runs a line, waiting to become a process the command starts
    (a rank); it ends with the command (the end of its socket) if the command starts none."""

    idle: list[_Spare] = []

    def __init__(self, base_path: list[str], close: list[socket.socket]) -> None:
        ours, theirs = socket.socketpair()
        self.pid = os.fork()
        if self.pid:
            theirs.close()
            self.conn = ours
            return
        for conn in (ours, *close):
            conn.close()
        _Spare.idle.clear()  # the earlier spares are the command's, not this one's
        handlers = {s: signal.signal(s, signal.SIG_IGN) for s in JOB_SIGNALS}
        message, fds = b"", []
        while not message.endswith(b"\n"):
            part, received, _, _ = socket.recv_fds(theirs, 1 << 20, MAX_FDS)
            if not part:  # the command ended without starting a rank
                os._exit(0)
            message, fds = message + part, fds + received
        theirs.close()
        for s, handler in handlers.items():
            signal.signal(s, handler)
        request = json.loads(message)
        _place(fds, request["targets"])
        if request["kind"] == "python":
            _become(request, base_path)
        _enter(request)
        sys.argv = request["argv"]  # as `python -c CODE ARGS` sets it: spawn_main reads it
        exec(request["code"], {"__name__": "__main__"})  # spawn_main: it exits with the process's code
        sys.exit(0)

    @classmethod
    def take(cls, env: dict[str, str]) -> _Spare | None:
        """An idle spare for a process of this environment, if one is left and can become it."""
        if env.get(FRESH_RANKS) or not cls.idle or startup_change(env, STARTUP_ENV) is not None:
            return None
        try:
            return cls.idle.pop()  # atomic: the trust kit starts its launches from two threads
        except IndexError:
            return None

    def start(self, request: dict, fds: list[int], targets: list[int]) -> int:
        message = json.dumps({**request, "targets": targets}).encode() + b"\n"
        socket.send_fds(self.conn, [message], fds)
        self.conn.close()
        return self.pid


def _place(fds: list[int], targets: list[int]) -> None:
    """Each received descriptor at the number it had (or was meant to have) in the command's child."""
    floor = max([*targets, *fds, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(moved, targets, strict=True):
        os.dup2(fd, target)
        os.close(fd)


# What a spare can take of Popen's arguments: the rest (a preexec_fn, a new session, ...) start a process.
PLAIN = {"env", "cwd", "stdin", "stdout", "stderr", "text", "universal_newlines", "encoding", "errors"}
# Popen._execute_child's arguments after ``args``, by name: it is called with them in this order.
CHILD_ARGS = list(inspect.signature(subprocess.Popen._execute_child).parameters)[2:]


def _stdio(child: dict) -> dict[int, int]:
    """The descriptors Popen made for the child's standard streams (the others are inherited)."""
    ends = (child["p2cread"], child["c2pwrite"], child["errwrite"])
    return {target: fd for target, fd in enumerate(ends) if fd != -1}


def _pipes(child: dict) -> list[int]:
    return [child[k] for k in ("p2cread", "p2cwrite", "c2pread", "c2pwrite", "errread", "errwrite")]


def _where(child: dict) -> dict:
    """The folder and environment Popen was asked to start the child in (default: this process's)."""
    env = dict(os.environ if child["env"] is None else child["env"])
    return dict(cwd=os.fspath(child["cwd"] or os.getcwd()), env=env)


class _RankPopen(subprocess.Popen):
    """``subprocess.Popen`` in a forked command: ``[python, -m MODULE | -c CODE | SCRIPT, ARGS]``
    (Lightning's ``ddp`` launcher, the trust kit's ranks, a benchmark's variants) becomes a spare while one
    is left."""

    def __init__(self, args, *rest, **kwargs) -> None:
        self._spare = self._runs = None
        plain = not rest and set(kwargs) <= PLAIN
        if plain and isinstance(args, list | tuple) and list(args[:1]) == [sys.executable]:
            self._runs = what_runs(args[1:])
        if self._runs is not None:
            self._spare = _Spare.take(dict(os.environ if kwargs.get("env") is None else kwargs["env"]))
        super().__init__(args, *rest, **kwargs)

    def _execute_child(self, args, *rest) -> None:
        if self._spare is None:
            return super()._execute_child(args, *rest)
        child = dict(zip(CHILD_ARGS, rest, strict=False))
        request = dict(kind="python", **self._runs, **_where(child))
        stdio = _stdio(child)
        self.pid = self._spare.start(request, list(stdio.values()), list(stdio))
        self._child_created = True
        self._close_pipe_fds(*_pipes(child))


_spawnv_passfds = multiprocessing.util.spawnv_passfds


def _spawn_rank(path: str, args: list[str], passfds: list[int]) -> int:
    """multiprocessing's start of a ``spawn`` process (``ddp_spawn``'s ranks): a spare while one is left."""
    at = next((i for i, a in enumerate(args) if isinstance(a, str) and a.startswith(SPAWN_MAIN)), None)
    spare = _Spare.take(dict(os.environ)) if at is not None and len(passfds) <= MAX_FDS else None
    if spare is None:
        return _spawnv_passfds(path, args, passfds)
    request = dict(kind="spawn", code=args[at], argv=["-c", *args[at + 1 :]])
    request |= dict(cwd=os.getcwd(), env=dict(os.environ))
    return spare.start(request, list(passfds), list(passfds))


def serve(path: str, preload: str) -> None:
    """Import ``preload`` (the command's modules), then fork one child per request until the test worker
    goes away."""
    import gc
    import importlib

    STARTUP_ENV.update(os.environ)  # what its interpreter started with (an import may set more)
    importlib.import_module(preload)  # the seconds this server exists to pay once

    gc.freeze()  # the imported objects stay out of each child's collections: their pages stay shared

    env_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in env_paths]  # without this script's folder
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes the selector
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "worker")
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            if key.data == "worker" and not os.read(sys.stdin.fileno(), 4096):
                for pid in waiting:  # the pytest worker is gone: so are its commands
                    os.kill(pid, signal.SIGKILL)
                return
            if key.data == "child":
                os.read(wake_r, 4096)
                while waiting:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    if pid in waiting:
                        _reply(waiting.pop(pid), {"status": os.waitstatus_to_exitcode(status)}, close=True)
            if key.data == "accept":
                conn, _ = listener.accept()
                try:
                    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                    while part := conn.recv(1 << 20):  # the rest of the request, up to the client's shutdown
                        message += part
                    request = json.loads(message)
                except (OSError, ValueError):  # a client gone mid-request: nothing was started for it
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for sock in (listener, conn, *waiting.values()):
                        sock.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _child(request, fds, base_path)  # exits through SystemExit, never returns
                for fd in fds:
                    os.close(fd)
                waiting[pid] = conn
                _reply(conn, {"pid": pid})


def _reply(conn: socket.socket, message: dict, close: bool = False) -> None:
    """A line to the client; a client that has gone (its test failed or timed out) is not an error here."""
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(message).encode() + b"\n")
    if close:
        conn.close()


# ---------------------------------------------------------------------------------------------- the client


class ForkedCli:
    """One server per test process, started at the first command and gone with the process."""

    def __init__(self, env: dict[str, str], folder: Path, preload: str = "lit_ddp.cli") -> None:
        self.env = env
        self.path = str(folder / "cli.sock")
        command = [sys.executable, __file__, self.path, preload]
        self.server = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self.server.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the forked-CLI server did not start (exit {self.server.wait()})")

    @classmethod
    def client(cls, path: str) -> ForkedCli:
        """A client of the server listening at ``path``, from a process the tests started (``--client``)."""
        client = cls.__new__(cls)
        client.env, client.path, client.server = dict(os.environ), path, None
        return client

    def close(self) -> None:
        """End the server (its children have ended with their tests) and remove its socket's folder."""
        self.server.stdin.close()
        self.server.wait(timeout=30)
        shutil.rmtree(Path(self.path).parent, ignore_errors=True)

    def start(self, request: dict, stdio: list[int]) -> socket.socket:
        """Hand the server a request and the descriptors of the process's standard streams; the
        connection it answers on (the pid, then the exit status). ServerGone: nothing was started."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
        except OSError as err:  # the server has ended (killed for memory, say): the caller runs it plainly
            conn.close()
            raise ServerGone(str(err)) from err
        socket.send_fds(conn, [json.dumps(request).encode()], stdio)
        conn.shutdown(socket.SHUT_WR)
        return conn

    def run(
        self,
        args: list[str],
        cwd: Path,
        env: dict[str, str],
        timeout: float,
        new_session: bool = False,
        module: str = "lit_ddp",
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """As ``subprocess.run([python, -m, MODULE, *args], capture_output=True, text=True, input=...,
        timeout=...)``; ``new_session`` as Popen's ``start_new_session``, and then a timeout kills the whole
        session."""
        command = [sys.executable, "-m", module, *args]
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        request = dict(args=list(args), cwd=str(cwd), env=env, new_session=new_session, module=module)
        if input is not None:  # the text, then the end of the file, as a pipe (a prompt's answers)
            stdin, typed = os.pipe()
            with os.fdopen(typed, "w") as pipe:  # a prompt's few lines: within a pipe's buffer
                pipe.write(input)
        else:
            stdin = 0 if _is_open(0) else os.open(os.devnull, os.O_RDONLY)  # what a subprocess inherits
        try:
            conn = self.start(request, [stdin, out_w, err_w])
        except ServerGone:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w) if stdin == 0 else (out_w, err_w, stdin):
                os.close(fd)
        pid = _read(conn, "pid")
        kill = os.killpg if new_session else os.kill
        deadline = time.monotonic() + timeout
        try:
            out, err, timed_out = _read_until_closed(out_r, err_r, deadline)
            try:  # the command may end after it closed its output, as communicate() waits for that too
                status = None if timed_out else _read(conn, "status", deadline - time.monotonic())
            except TimeoutError:
                timed_out = True
            if timed_out:
                with contextlib.suppress(ProcessLookupError):
                    kill(pid, signal.SIGKILL)
                _read(conn, "status")
        except BaseException:  # a test stopped meanwhile (pytest-timeout, Ctrl-C): so is its command
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)
            raise
        finally:
            conn.close()
            os.close(out_r)
            os.close(err_r)
        if timed_out:
            raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(command, status, out, err)


class ForkedPopen(subprocess.Popen):
    """``subprocess.Popen([python, *ARGV], ...)`` whose process the server forks: its pipes, ``communicate``,
    ``poll``, ``wait``, ``send_signal`` and ``returncode`` are Popen's. What differs: the process is the
    server's child, not this one's (``os.waitpid`` does not see it)."""

    def __init__(self, server: ForkedCli, argv: list[str], **kwargs) -> None:
        self._server, self._request = server, what_runs(argv)
        if self._request is None:
            raise ValueError(f"a fork cannot run python {' '.join(map(str, argv))}")
        super().__init__([sys.executable, *argv], **kwargs)

    def _execute_child(self, args, *rest) -> None:
        child = dict(zip(CHILD_ARGS, rest, strict=False))
        stdio = _stdio(child)
        inherited = [n for n in range(3) if n not in stdio]
        stdio |= {n: n if _is_open(n) else os.open(os.devnull, os.O_RDWR) for n in inherited}
        request = {**self._request, **_where(child), "new_session": bool(child["start_new_session"])}
        try:
            self._conn = self._server.start(request, [stdio[n] for n in range(3)])
            self.pid = _read(self._conn, "pid")
        finally:
            for n in inherited:
                if stdio[n] != n:
                    os.close(stdio[n])
            self._close_pipe_fds(*_pipes(child))
        self._child_created = True

    def _internal_poll(self, *args, **kwargs) -> int | None:
        if self.returncode is None and _ready(self._conn):
            self._ended(_read(self._conn, "status"))
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        if self.returncode is None:
            try:
                self._ended(_read(self._conn, "status", timeout))
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def _ended(self, status: int) -> None:
        self.returncode = status
        self._conn.close()


def _ready(conn: socket.socket) -> bool:
    with selectors.DefaultSelector() as selector:
        selector.register(conn, selectors.EVENT_READ)
        return bool(selector.select(0))


class ServerGone(RuntimeError):
    """The server of forked commands no longer answers."""


def _read(conn: socket.socket, field: str, timeout: float | None = None) -> int:
    """The server's next line, one JSON object holding ``field``; TimeoutError past ``timeout`` seconds."""
    conn.settimeout(None if timeout is None else max(timeout, 0.01))
    line = b""
    while not line.endswith(b"\n"):
        part = conn.recv(1)
        if not part:
            raise RuntimeError(f"the forked-CLI server ended before it sent the command's {field}")
        line += part
    return json.loads(line)[field]


def _read_until_closed(out_r: int, err_r: int, deadline: float) -> tuple[str, str, bool]:
    """Both pipes read to their end, as ``communicate`` does (the command's own children may hold them), or
    up to ``deadline``: (stdout, stderr, whether the deadline came first)."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            ready = selector.select(max(left, 0))
            if not ready and left <= 0:
                break
            for key, _ in ready:
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
        timed_out = bool(selector.get_map())
    return _text(b"".join(chunks[out_r])), _text(b"".join(chunks[err_r])), timed_out


def _text(data: bytes) -> str:
    """Decoded as subprocess's text mode does: the locale's encoding, universal newlines."""
    import locale

    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def forked(path: str, argv: list[str]) -> int:
    """``python ARGV`` forked by the server at ``path``, with this process's standard streams, folder and
    environment (a plain subprocess where the server has gone); its exit status, as a shell reports it."""
    try:
        process = ForkedPopen(ForkedCli.client(path), argv)
    except ServerGone:
        process = subprocess.Popen([sys.executable, *argv])
    status = process.wait()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    if sys.argv[1] == "--client":  # python forked_cli.py --client SOCKET ARGV: a stand-in's `python ARGV`
        sys.exit(forked(sys.argv[2], sys.argv[3:]))
    serve(*sys.argv[1:])
