"""Packs the project template into wheels, so `lit-ddp new` works from an installed package.

The template's single source is this repository's root (cookiecutter.json, hooks/ and the
{{cookiecutter.project_slug}}/ tree of the project's own files): build_py copies it into
lit_ddp/_template/ of the wheel. Source checkouts and editable installs read the root directly.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
TEMPLATE_ITEMS = ("cookiecutter.json", "hooks", "{{cookiecutter.project_slug}}")
# lit_ddp's presets and cluster scripts: the template's hook writes the project's from them (one source).
SHARED_ITEMS = ("configs/presets", "configs/resnet_imagenet.yaml", "scripts")


class BuildPyWithTemplate(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "lit_ddp" / "_template"
        for item in (*TEMPLATE_ITEMS, *SHARED_ITEMS):
            src = ROOT / item
            if src.is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
                shutil.copytree(src, dest / item, ignore=ignore, dirs_exist_ok=True)
            elif src.is_file():
                (dest / item).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / item)


setup(cmdclass={"build_py": BuildPyWithTemplate})
