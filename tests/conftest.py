"""Shared fixtures: small datasets in their real on-disk formats, and a CLI runner."""

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "helpers"
sys.path.insert(0, str(HELPERS))  # the tests import the helper scripts (imagenet_tree, the probes) by name

from forked_cli import ForkedCli, ForkedPopen, ServerGone, startup_change, what_runs  # noqa: E402  (on the path above)

# Tiny Shapes runs: seconds per epoch, still a real train/val/test pipeline.
# A quiet CPU run, on 2 DDP processes or on one plain process (no DDP: the training sampler shuffles by
# (seed, epoch) on every device count); the real-process tests compare the two.
CPU = [
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
DDP2 = ["--trainer.devices=2", "--trainer.strategy=ddp"]
ONE = ["--trainer.devices=1"]
TINY_SHAPES = ["--data.train_size=256", "--data.val_size=101", "--data.test_size=64", "--data.batch_size=32"]
# In-process runs of one epoch of two batches, quiet: a mistake's line, or a run folder, in a second.
TINY_RUN = [
    "--data.train_size=64",
    "--data.val_size=16",
    "--data.test_size=16",
    "--data.batch_size=32",
    "--trainer.max_epochs=1",
    "--trainer.enable_progress_bar=false",
]


def pytest_configure(config: pytest.Config) -> None:
    # The Ctrl-C tests send SIGINT as a terminal does. A suite started in the background of a shell script or
    # under nohup has SIGINT ignored, and every process it starts would inherit that and never see the
    # signal: the processes the tests start get it as a terminal's job does.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def cli_env(env: dict | None = None) -> dict[str, str]:
    """The environment of a subprocess the tests start: this process's, with ``env`` on top, and PYTHONPATH
    this checkout, then ``env``'s entries (tests/ for the probes), then the caller's own, kept: on a machine
    where a package sits on PYTHONPATH (a GPU image's jsonargparse) the subprocess still imports it."""
    env = dict(env or {})
    paths = [str(REPO), *env.pop("PYTHONPATH", "").split(os.pathsep)]
    paths += os.environ.get("PYTHONPATH", "").split(os.pathsep)
    pythonpath = os.pathsep.join(dict.fromkeys(p for p in paths if p))  # in order, once each
    return {**os.environ, "PYTHONUNBUFFERED": "1", **env, "PYTHONPATH": pythonpath}


# tests/helpers/ on the subprocess's path too: the probes and faults that tests pass as --trainer.callbacks.
WITH_PROBES = {"PYTHONPATH": str(HELPERS)}


def run_cli(
    args: list[str],
    cwd: Path,
    timeout: float = 240,
    env: dict | None = None,
    new_session: bool = False,
    input: str | None = None,
    module: str = "lit_ddp",
) -> subprocess.CompletedProcess:
    """``python -m lit_ddp ARGS`` (or ``python -m MODULE ARGS``: a generated project's package, in ``cwd``
    or on the ``PYTHONPATH`` of ``env``, on this checkout's lit_ddp) in a process of its own, in ``cwd``
    (made if missing), with ``cli_env(env)``; fails the test (not hangs) past ``timeout`` seconds.
    ``new_session``: the process starts a session (as a terminal's job does), so a signal to its group
    reaches the job and nothing else, and a timeout kills all of it. ``input``: its standard input (else
    this process's). Forked from this test process's server of commands where the environment allows
    (helpers/forked_cli.py)."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = cli_env(env)
    server = forked_cli_server()
    if server is not None and startup_change(env, server.env) is None:
        try:
            return server.run(args, cwd, env, timeout, new_session, module=module, input=input)
        except ServerGone:  # nothing was started: this process's commands run plainly from now on
            _forked_cli[0] = None
    command = [sys.executable, "-m", module, *args]
    child = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=new_session, stdin=None if input is None else subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = child.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        (os.killpg if new_session else os.kill)(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        raise subprocess.TimeoutExpired(command, timeout, out, err) from expired
    return subprocess.CompletedProcess(command, child.returncode, out, err)


_forked_cli: list[ForkedCli | None] = []


def forked_cli_server() -> ForkedCli | None:
    """This test process's server of forked commands (helpers/forked_cli.py), started at its first use; None
    where every command should be a new interpreter: ``LIT_DDP_TESTS_FORK=0``, or a CUDA device present."""
    if not _forked_cli:
        import torch

        usable = os.environ.get("LIT_DDP_TESTS_FORK", "1") != "0" and not torch.cuda.is_available()
        folder = Path(tempfile.mkdtemp(prefix="lit_ddp_cli_"))  # short: a socket's path has 107 bytes at most
        _forked_cli.append(ForkedCli(cli_env(), folder) if usable else None)
        if usable:
            atexit.register(_forked_cli[0].close)
    return _forked_cli[0]


def python(argv: list, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen([python, *argv], **kwargs)`` for ``argv`` = ``-m MODULE ...``, ``-c CODE ...`` or
    ``SCRIPT ...``: forked from this test process's server where the environment allows (as ``run_cli``),
    so that a helper process or a rank starts without importing torch again. Its parent is the server, not
    this process: a test of what a process's parent sees starts it with subprocess."""
    server = forked_cli_server()
    env = kwargs.get("env")
    if (
        server is not None
        and what_runs(argv) is not None
        and startup_change(env or dict(os.environ), server.env) is None
    ):
        try:
            return ForkedPopen(server, argv, **kwargs)
        except ServerGone:
            _forked_cli[0] = None
    return subprocess.Popen([sys.executable, *argv], **kwargs)


def run_python(
    argv: list, input: str | None = None, timeout: float | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """``subprocess.run([python, *argv], ...)`` through ``python()``: ``input``, ``timeout`` (the process is
    killed past it, and TimeoutExpired raised), ``capture_output``, ``check`` and Popen's arguments."""
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    check = kwargs.pop("check", False)
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with python(argv, **kwargs) as process:
        try:
            out, err = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    if check:
        result.check_returncode()
    return result


@pytest.fixture(autouse=True, scope="session")
def forked_kit_ranks():
    """The trust kit's ranks (``lit_ddp.testing.launch``), started from a test, are ``python()`` processes:
    forked from the server, not imported anew. What the kit reads of them (output, exit status, kill) is
    the same; a kit run inside a command (``doctor``) forks its ranks as any command's (forked_cli.py)."""
    from lit_ddp.testing import launch

    def popen(args, **kwargs) -> subprocess.Popen:
        if args[:1] == [sys.executable]:
            return python(args[1:], **kwargs)
        return subprocess.Popen(args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch, "subprocess", types.SimpleNamespace(**{**vars(subprocess), "Popen": popen}))
        yield


def ctrl_c_while_importing(module: str, *args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` given a Ctrl-C (SIGINT) inside its import of torch: the signal is sent once
    the process says it is there (helpers/import_gate.py), not after a guessed delay."""
    child = subprocess.Popen(
        [sys.executable, str(HELPERS / "import_gate.py"), module, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline() == "importing torch\n"
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def run_folder(root: Path, args: list[str]) -> Path:
    """The folder under ``root`` (the run's default_root_dir) that a CLI run with ``args`` logs into: its
    recipe's name (the first --config choosing the model or data), or lightning_logs without one, as the
    CLI names it (lit_ddp.preflight.experiment_name)."""
    from lit_ddp.preflight import experiment_name

    configs = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    return root / experiment_name(configs)


def last_ckpt(root: Path, args: list[str]) -> Path:
    """The one last.ckpt a CLI run with ``args`` under ``root`` wrote, in ``<run folder>/version_N``."""
    (path,) = run_folder(root, args).glob("version_*/checkpoints/last.ckpt")
    return path


def read_scalars(run_dir: Path) -> dict[str, list[float]]:
    """Every scalar tag in a TensorBoard run directory → its values in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def run_dirs(root: Path) -> list[Path]:
    """Run directories (each holds event files) under ``root``."""
    return sorted({p.parent for p in root.rglob("events.out.tfevents.*")})


def assert_single_run(root: Path) -> Path:
    """Exactly one run directory with one config.yaml and checkpoints; returns it."""
    runs = run_dirs(root)
    assert len(runs) == 1, runs
    run = runs[0]
    assert [p.relative_to(root) for p in root.rglob("config.yaml")] == [
        (run / "config.yaml").relative_to(root)
    ]
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    return run


# ---- shards and the runs the streaming tests compare with (tests/helpers/streaming_runs.py) --------


@pytest.fixture(scope="session")
def cifar_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CIFAR-10 folder (its parent's src/) as shards of ~16 samples."""
    from streaming_runs import make_cifar_shards

    return make_cifar_shards(tmp_path_factory.mktemp("cifar"))


@pytest.fixture(scope="session")
def streaming_reference(
    cifar_shards: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[int], Path]:
    """``reference(n)``: the folder of the uninterrupted 2-epoch run from ``cifar_shards`` on n processes
    (streaming_runs.PROCESSES: a global batch of 64), run on first use, once per session."""
    from streaming_runs import PROCESSES, fit

    root, made = tmp_path_factory.mktemp("reference"), {}

    def reference(processes: int) -> Path:
        if processes not in made:
            proc = fit(root / str(processes), cifar_shards, *PROCESSES[processes])
            assert proc.returncode == 0, proc.stderr[-3000:]
            made[processes] = root / str(processes)
        return made[processes]

    return reference


@pytest.fixture
def atexit_handlers(monkeypatch: pytest.MonkeyPatch) -> list:
    """What ``atexit.register`` is given while the test runs, in order (``unregister`` takes it back):
    for the checks that a process destroys its process group at exit, without registering it for real."""
    import atexit

    handlers: list = []
    monkeypatch.setattr(atexit, "register", handlers.append)
    monkeypatch.setattr(atexit, "unregister", lambda fn: handlers.remove(fn) if fn in handlers else None)
    return handlers
