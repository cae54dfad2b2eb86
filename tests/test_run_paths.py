"""The paths and environment the CUDA tests (test_cuda.py, test_cuda_resnet.py) rely on, checked on the
CPU with their own helpers: run folders (``<recipe>/version_N``), a working folder that does not exist yet,
and a PYTHONPATH that keeps the caller's entries. CI has no GPU: these fail there when a CUDA test would go
stale."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY_SHAPES, WITH_PROBES, cli_env, last_ckpt, read_scalars, run_cli
from test_cuda import assert_the_recipe_trained, cli_args, lenet_recipe_args

CPU = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.enable_progress_bar=false"]


def test_subprocesses_keep_the_callers_pythonpath_after_this_checkout(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", str(REPO)]))
    env = cli_env(WITH_PROBES)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), str(REPO / "tests" / "helpers"), "/opt/site"]
    monkeypatch.delenv("PYTHONPATH")
    assert cli_env()["PYTHONPATH"] == str(REPO)
    seen = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.path)"], env=env, capture_output=True, text=True
    )
    assert "/opt/site" in seen.stdout


@pytest.mark.slow
def test_the_cuda_tests_command_lines_run_on_cpu_where_they_look(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"  # a package on the caller's PYTHONPATH, as a GPU image's own
    site.mkdir()
    (site / "caller_probe.py").write_text(
        "import lightning\n\n\nclass Seen(lightning.Callback):\n"
        "    def on_fit_start(self, trainer, pl_module):\n        print('caller_probe: seen', flush=True)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    # A recipe (--config): the run logs to <recipe>/version_N, as the ResNet CUDA test's does.
    args = [f"--config={REPO / 'configs' / 'lenet_shapes.yaml'}", *TINY_SHAPES, "--trainer.max_epochs=1"]
    root = tmp_path / "fit"  # not made here: run_cli makes the working folder, as the predict run's
    result = run_cli(cli_args(root, "fit", *args, "--trainer.callbacks+=caller_probe.Seen", device=CPU), root)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "caller_probe: seen" in result.stdout
    ckpt = last_ckpt(root, args)
    assert ckpt.relative_to(root).parts[:1] == ("lenet_shapes",)
    assert len(read_scalars(ckpt.parent.parent)["val/acc"]) == 1
    # The EMA test's predict run, in a folder of its own that nobody made.
    out = tmp_path / "predict"
    result = run_cli(
        cli_args(out, "predict", *TINY_SHAPES, f"--ckpt_path={ckpt}", device=CPU), out, env=WITH_PROBES
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert list(out.rglob("predictions.csv"))


@pytest.mark.slow
def test_the_lenet_recipe_test_runs_its_command_line_on_cpu(tmp_path: Path) -> None:
    """test_cuda.py's run of the LeNet recipe through the CLI, on the CPU (cuda_graph: auto trains as usual
    there): its config, data, probe and the outcomes it reads."""
    # A smaller CIFAR than the GPU's, and no stack dump: a loaded 2-core machine is slow, not stuck.
    recipe = lenet_recipe_args(tmp_path / "data", per_batch=128, stuck_s=3600)
    result = run_cli(cli_args(tmp_path, "fit", *recipe, device=CPU), tmp_path, timeout=900, env=WITH_PROBES)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert_the_recipe_trained(tmp_path, result.stdout + result.stderr)
