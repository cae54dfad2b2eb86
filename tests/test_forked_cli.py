"""The tests' command runner (helpers/forked_cli.py): a forked command is the process a new interpreter
would be, as far as a command can tell, and its result reads as subprocess.run's."""

import json
import os
import subprocess
import sys

import pytest
from conftest import CPU, WITH_PROBES, cli_env, forked_cli_server, python, run_cli, run_python
from forked_cli import FRESH_RANKS, ForkedCli, ForkedPopen, ServerGone, startup_change


def shared_server() -> ForkedCli:
    """This process's server, which run_cli uses; the test is skipped where commands run plainly."""
    server = forked_cli_server()
    if server is None:
        pytest.skip("commands run as plain subprocesses here (LIT_DDP_TESTS_FORK=0, or a CUDA device)")
    return server


def probe(tmp_path, *args, env=None, timeout=60, **kwargs) -> subprocess.CompletedProcess:
    env = cli_env({**WITH_PROBES, **(env or {})})
    return shared_server().run(list(args), tmp_path, env, timeout=timeout, module="fork_probe", **kwargs)


def test_a_forked_command_has_its_own_process_folder_environment_and_main_module(tmp_path):
    result = probe(tmp_path, "report", env={"FORK_PROBE": "yes"})
    seen = json.loads(result.stdout)
    assert result.returncode == 0
    assert seen["pid"] not in (os.getpid(), shared_server().server.pid)
    assert seen["cwd"] == seen["path0"] == str(tmp_path)  # `python -m` puts the working folder first
    assert seen["env"] == "yes" and "FORK_PROBE" not in os.environ
    assert seen["argv"][1:] == ["report"] and seen["argv"][0].endswith("fork_probe.py")
    assert seen["main_spec"] == "fork_probe"  # what Lightning's launcher and multiprocessing read
    assert seen["sigint"] and seen["sid"] == os.getsid(0)
    assert seen["stdin"] == [os.fstat(0).st_dev, os.fstat(0).st_ino]  # this process's stdin, as inherited
    assert result.stderr == "to stderr\nline two\n"  # text mode's universal newlines, as subprocess's


def test_exit_codes_signals_and_tracebacks_read_as_subprocess_reports_them(tmp_path):
    assert probe(tmp_path, "exit", "3").returncode == 3
    assert probe(tmp_path, "signal").returncode == -15
    raised = probe(tmp_path, "raise")
    assert raised.returncode == 1 and raised.stderr.rstrip().endswith("ValueError: from the probe")


def test_a_new_session_and_a_timeout_that_kills_it(tmp_path):
    assert json.loads(probe(tmp_path, "report", new_session=True).stdout)["sid"] != os.getsid(0)
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        probe(tmp_path, "sleep", timeout=3, new_session=True)
    assert expired.value.output == "sleeping\n"
    with pytest.raises(subprocess.TimeoutExpired):  # its output closed early, its process still running
        probe(tmp_path, "sleep_closed", timeout=3)
    assert probe(tmp_path, "exit", "0").returncode == 0  # the server outlives its clients' timeouts


def test_the_first_ranks_a_command_starts_are_forks_and_the_commands_children(tmp_path):
    result = probe(tmp_path, "launch")
    command, first, third = (json.loads(line) for line in result.stdout.splitlines())
    second = json.loads((tmp_path / "rank.log").read_text().splitlines()[0])
    assert result.returncode == 0 and result.stderr == "to stderr\nline two\n" * 2
    assert (tmp_path / "rank.log").read_text().endswith("to stderr\nline two\n")  # stderr=STDOUT, to a file
    assert first["ppid"] == second["ppid"] == third["ppid"] == command["pid"]  # the fault monitor reads it
    assert first["env"] == "rank" and first["cwd"] == first["path0"] == str(tmp_path)
    assert first["argv"] == command["argv"][:1] + ["report"] and first["main_spec"] == "fork_probe"
    assert first["sigint"] and first["sid"] == command["sid"]
    assert [first["preloaded"], second["preloaded"], third["preloaded"]] == [True, True, False]  # 2 spares


def test_ddp_spawns_ranks_are_forks_and_a_fresh_ranks_command_gets_new_interpreters(tmp_path):
    forked = probe(tmp_path, "spawn")
    fresh = probe(tmp_path, "spawn", env={FRESH_RANKS: "1"})
    assert forked.returncode == fresh.returncode == 0, forked.stderr + fresh.stderr
    command, *ranks = (json.loads(line) for line in forked.stdout.splitlines())
    assert [rank["ppid"] for rank in ranks] == [command["pid"]] * 2 and all(r["preloaded"] for r in ranks)
    assert [rank["rank"] for rank in ranks] == [0, 1]  # what the spawned function was handed
    assert not any(json.loads(line)["preloaded"] for line in fresh.stdout.splitlines()[1:])


def test_a_python_process_the_tests_start_is_forked_and_reads_as_popen(tmp_path):
    shared_server()
    env = cli_env(WITH_PROBES)
    module = run_python(["-m", "fork_probe", "report"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert module.returncode == 0 and json.loads(module.stdout)["preloaded"]
    assert module.stderr == "to stderr\nline two\n"
    exits = "import sys; print(sys.argv, sys.path[0]); sys.exit(3)"
    code = run_python(["-c", exits, "x"], capture_output=True)
    assert (code.returncode, code.stdout) == (3, b"['-c', 'x'] \n")
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:], sys.path[0], input())\n")
    ran = run_python([str(script), "a"], input="typed", capture_output=True, text=True, check=True)
    assert ran.stdout == f"__main__ ['a'] {tmp_path} typed\n"
    sleeping = python(["-m", "fork_probe", "sleep"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    assert isinstance(sleeping, ForkedPopen) and sleeping.stdout.readline() == "sleeping\n"
    assert sleeping.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.wait(timeout=0.5)
    sleeping.terminate()
    assert sleeping.wait(timeout=30) == -15 and sleeping.poll() == -15
    sleeping.stdout.close()


def test_a_server_that_has_ended_is_reported_before_anything_runs(tmp_path):
    server = ForkedCli(cli_env(), tmp_path, preload="json")
    server.server.kill()
    server.server.wait()
    with pytest.raises(ServerGone):  # run_cli then runs the command as a plain subprocess
        server.run(["fit"], tmp_path, cli_env(), timeout=10)
    server.close()


def test_what_only_a_new_interpreter_reads_makes_a_plain_subprocess():
    base = {"PATH": "/bin", "PYTHONPATH": "a"}
    assert startup_change({**base, "PYTHONPATH": "a:b", "AWS_REGION": "x"}, base) is None
    assert startup_change({**base, "PYTHONWARNINGS": "error"}, base) == "PYTHONWARNINGS"
    assert startup_change({**base, "OMP_NUM_THREADS": "1"}, base) == "OMP_NUM_THREADS"


def test_lit_ddp_forked_says_what_a_new_interpreter_says(tmp_path):
    args = ["fit", *CPU, "--trainer.devices=0"]
    shared_server()
    forked = run_cli(args, tmp_path)
    plain = subprocess.run([sys.executable, "-m", "lit_ddp", *args], cwd=tmp_path, env=cli_env(),
                           capture_output=True, text=True, timeout=240)  # fmt: skip
    assert (forked.returncode, forked.stdout, forked.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert forked.returncode == 2 and forked.stderr.startswith("lit_ddp: error: --trainer.devices=0")
