r"""lit_ddp's command line (fit, validate, test, predict) with this project's network and data as the
default, and its classes known by short name (``--model.net=Net``, ``--data=MyDataModule``):

    python -m {{ cookiecutter.package_name }} fit
    python -m {{ cookiecutter.package_name }} fit \
        --config configs/default.yaml --config configs/presets/cpu_ddp.yaml  # 2 CPU processes
    python -m {{ cookiecutter.package_name }} fit \
        --trainer.devices=8 --trainer.strategy=ddp
    torchrun --nproc_per_node=8 -m {{ cookiecutter.package_name }} fit \
        --trainer.devices=8 --trainer.strategy=ddp
    sbatch scripts/sbatch_single_node.sh
"""

from lit_ddp.entry import starting

with starting(f"python -m {__package__}"):  # a Ctrl-C during the seconds of import: one line, exit 130
    from lit_ddp.cli import main as lit_ddp_main

    from .data import MyDataModule
    from .models import Net

# What runs when the command line names no --model / --data: configs/default.yaml spells it out.
MODEL = {
    "class_path": "lit_ddp.models.ImageClassifier",
    "init_args": {"net": {"class_path": f"{Net.__module__}.{Net.__name__}"}},
}


def main(args: list[str] | None = None) -> None:
    """The command line; ``args`` in place of sys.argv (the tests' ``lit_ddp.testing.resolved_config``)."""
    lit_ddp_main(args, model=MODEL, data=MyDataModule, prog=f"python -m {__package__}")


if __name__ == "__main__":
    main()
