"""Links inside an ImageFolder tree's class folders that lead into another class's folder.

A class's images are the files under its folder, links followed (folder_index.py, as torchvision's
ImageFolder). A link in ``train/cat/`` to a file or folder under ``train/dog/`` (or ``val/dog/``) so gives a
dog's image the label ``cat``, and the same image is also a ``dog`` through its own folder: the tree
contradicts itself, and nothing says so. ``shard`` refuses such a tree in one line naming the link; links
to anywhere else (a pool of files outside the tree, the same class in another split) are followed.
"""

import os
from collections.abc import Iterator
from pathlib import Path

from lit_ddp.data.folder_index import class_key, find_classes, is_junk
from lit_ddp.errors import UserError


def _links_under(top: str) -> Iterator[str]:
    """Every link under folder ``top`` (not followed), junk left out; the entry types come from the folder
    listing, so files cost no stat."""
    pending = [top]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if is_junk(entry.name):
                    continue
                if entry.is_symlink():
                    yield entry.path
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)


def _owner(path: str, classes: dict[str, str]) -> str | None:
    """The resolved class folder that holds resolved ``path``, if any."""
    while True:
        if path in classes:
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def check_class_links(root: Path, splits: tuple[str, ...]) -> None:
    """Refuse a link under ``root/<split>/<class>/`` (the class folder itself included) that resolves into
    the folder of a class of another name."""
    folders = [(root / s / name, class_key(name)) for s in splits for name in find_classes(root / s)]
    classes: dict[str, str] = {}
    for folder, name in folders:
        if not folder.is_symlink():
            classes[os.path.realpath(folder)] = name
    for folder, name in folders:
        links = [str(folder)] if folder.is_symlink() else []
        for link in [*links, *_links_under(str(folder))]:
            owner = _owner(os.path.realpath(link), classes)
            if owner is not None and classes[owner] != name:
                raise UserError(
                    f"{link} is a link into {owner}, the folder of class {classes[owner]}, from class {name}:"
                    f" its images would be labelled {name} here and {classes[owner]} there; replace the link"
                    " by a copy if both labels are right, or remove it"
                )
