"""The list of image files of an ImageFolder split, made once per tree state and kept as numpy arrays.

At ImageNet's size (1.28 M files) three things about that list matter:

* **Its form.** A Python ``list[tuple[str, int]]`` is 2.6 M objects whose reference counts DataLoader workers
  write whenever they touch one, so each forked worker slowly copies the whole list into its own memory
  (pytorch/pytorch#13246). ``SampleIndex`` keeps the paths as one bytes buffer plus offsets, and the labels
  as an int64 array: reading a path writes to none of their pages, so no worker copies anything.
* **Its cost.** Listing is ``os.scandir`` per class folder with no per-file path objects; the buffer is
  built by joins, one encode and one search for separators.
* **Who makes it.** Every rank listing the tree itself is N scans of the same folders. ``load_or_scan``
  keeps the listing in a cache file, keyed on the split's path and checked against the tree's state; the
  data module lists in ``prepare_data`` (local rank 0 only) and every rank reads that file in ``setup``.

A class's images are the image files in its folder and in that folder's sub-folders at any depth, as
torchvision's ``ImageFolder`` takes them. The tree's state is ``(st_mtime_ns, st_ctime_ns, st_ino)`` of the
split folder, of each class folder and of each of their sub-folders. Adding, removing or renaming a file
changes its folder's mtime and ctime; adding or removing a class folder changes the split folder's (a
sub-folder, its parent's); replacing a folder changes its inode. ctime cannot be set back by tools that
restore mtimes (``rsync -a``, ``tar``, ``touch -d``). Editing a file in place changes none of these, and
need not: the listing holds names, not contents. A cached listing is used only while every one of these
values is unchanged; otherwise the tree is listed again.

A folder changed within ``SETTLE_NS`` of the listing may have changed again within the same timestamp tick
(one or two seconds on some file systems) without its timestamps moving: it is recorded as unknown, so
later runs list again, while the ranks of the run that listed it share that listing (``trusted_since``), so
they agree.
"""

import hashlib
import json
import os
import time
import unicodedata
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from torchvision.datasets.folder import IMG_EXTENSIONS

from lit_ddp.writes import WriteError, atomic_file

# torchvision's image extensions and .gif (decoded as its first frame): "every image file".
IMAGE_EXTENSIONS = (*IMG_EXTENSIONS, ".gif")
FORMAT = 2  # of the cache file; part of its name, so a new format never reads an old file (1: no sub-folders)
MAGIC = b"LITDDPIX"
SETTLE_NS = 2_000_000_000  # folders changed this close to the listing are not trusted by later runs


def is_junk(name: str) -> bool:
    """Hidden entries and macOS archive litter, never a class or an image: ``.DS_Store``, ``._x.JPEG``
    (AppleDouble files: resource forks with an image's name), ``__MACOSX/`` (unzipped Finder archives)."""
    return name.startswith(".") or name == "__MACOSX"


def find_classes(root: Path | str) -> list[str]:
    """Sorted class folder names under ``root`` as on disk: ImageFolder's order, so label i means the same
    everywhere."""
    if not os.path.isdir(root):
        return []
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries if e.is_dir() and not is_junk(e.name))


def loose_images(root: Path | str) -> list[str]:
    """Sorted names of the image files directly in ``root``, beside its class folders: they have no class,
    so no listing holds them (as torchvision's ``ImageFolder``), and the data module says so."""
    if not os.path.isdir(root):
        return []
    with os.scandir(root) as entries:
        return sorted(
            e.name
            for e in entries
            if not is_junk(e.name) and e.name.lower().endswith(IMAGE_EXTENSIONS) and not e.is_dir()
        )


def class_key(name: str) -> str:
    """A class folder's name as compared between splits: NFC, so that ``café`` written by macOS (NFD: ``e``
    and a combining accent) is the same class as ``café`` written elsewhere (one code point)."""
    return unicodedata.normalize("NFC", name)


def classes_train_lacks(root: Path | str, unknown: Sequence[str]) -> str:
    """The line for class folders of ``root`` (val/ or test/) that train/ beside it lacks, which no label
    of the model stands for."""
    names = ", ".join(map(ascii, unknown[:5])) + (", ..." if len(unknown) > 5 else "")
    train = os.path.join(os.path.dirname(os.path.normpath(root)), "train")
    return (
        f"{root} has class folders that train/ lacks ({names}): the classes are the folders of {train};"
        f" add each there with its training images, or move it out of {root}"
    )


def left_out_note(others: Sequence[str], shown: int = 6) -> str:
    """What a listing says of the files it left out for their extension (not hidden; ``Thumbs.db``, a
    ``.heic`` phone photo, a ``.jfif`` download): how many of each extension, each with one path, so that
    images in a format lit_ddp does not read are not lost without a word. "" when there are none."""
    if not others:
        return ""
    first: dict[str, str] = {}
    tally = Counter()
    for path in others:
        ext = os.path.splitext(path)[1].lower() or "no extension"
        first.setdefault(ext, path)
        tally[ext] += 1
    kinds = [f"{ext} {n:,} ({first[ext]})" for ext, n in tally.most_common()]
    listed = ", ".join(kinds[:shown]) + (", ..." if len(kinds) > shown else "")
    return (
        f"; {len(others):,} other file(s) left out: {listed}. Only {', '.join(IMAGE_EXTENSIONS)} files are"
        " read as images: convert any image among them to .jpg or .png"
    )


class SampleIndex(Sequence):
    """(path, label) pairs held in three numpy arrays: ``blob`` (the paths relative to ``root``, each
    followed by a NUL byte, file-system encoded), ``offsets`` (n + 1 starts in ``blob``) and ``labels``
    (n int64). Indexing gives ``(path, label)`` like torchvision's ``ImageFolder.samples``."""

    def __init__(self, root: str, blob: np.ndarray, offsets: np.ndarray, labels: np.ndarray) -> None:
        if len(offsets) != len(labels) + 1:
            raise ValueError(f"{len(offsets)} offsets for {len(labels)} labels: expected one more")
        self.root = root  # "" or a folder path ending in os.sep
        self.blob, self.offsets, self.labels = blob, offsets, labels

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[str, int]], root: str = "") -> "SampleIndex":
        paths = [p for p, _ in pairs]
        blob = os.fsencode("".join(p + "\0" for p in paths))
        lengths = np.fromiter((len(os.fsencode(p)) + 1 for p in paths), np.int64, len(paths))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        labels = np.fromiter((y for _, y in pairs), np.int64, len(pairs))
        return cls(root, np.frombuffer(blob, np.uint8), offsets, labels)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, index: int) -> str:
        if index < 0:
            index += len(self)
        start, end = int(self.offsets[index]), int(self.offsets[index + 1]) - 1  # less the NUL
        return self.root + os.fsdecode(self.blob[start:end].tobytes())

    def __getitem__(self, index: int) -> tuple[str, int]:  # type: ignore[override]
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        return self.path(index), int(self.labels[index])

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return (self[i] for i in range(len(self)))

    @property
    def nbytes(self) -> int:
        return self.blob.nbytes + self.offsets.nbytes + self.labels.nbytes


# ---- listing ----------------------------------------------------------------------------------------


def _state(path: str) -> list[int]:
    """What changes when a folder's entries change (module docstring)."""
    st = os.stat(path)
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _list_class(root: str, name: str) -> tuple[list[str], list[tuple[str, list[int]]] | None, list[str]]:
    """The image files of class folder ``root/name`` and of its sub-folders at any depth, as torchvision's
    ImageFolder takes them (symbolic links followed, each folder once, so a link back up cannot loop):
    "class/a\\0class/sub/b\\0" chunks, one per folder, sorted by folder then name; each folder's
    path (relative to ``root``, the class folder's first) with its state, read before it is listed: a
    change inside a sub-folder moves only that folder's timestamps. None for the states if a folder
    vanished during the scan. Junk (is_junk) is neither descended into nor listed. Last, the paths of the
    files left out for their extension (``left_out_note``)."""
    chunks: list[tuple[str, str]] = []
    others: list[str] = []
    states: list[tuple[str, list[int]]] | None = []
    seen, pending = set(), [name]
    while pending:
        rel = pending.pop()
        try:
            st = os.stat(os.path.join(root, rel))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(os.path.join(root, rel)) as it:
                entries = list(it)
            # is_file() and is_dir() read the entry's type from the directory listing: no stat on ext4, xfs,
            # NFS (but for a symbolic link, which is followed). A folder of files only is one pass.
            files = [e.name for e in entries if e.is_file()]
            dirs, dangling = [], []
            if len(files) < len(entries):
                dirs = [e.name for e in entries if not e.is_file() and e.is_dir()]
                # A link to a file that is gone is listed, so it is reported as unreadable (as it is when it
                # breaks after the listing was cached), not left out without a word.
                dangling = [e.name for e in entries if e.is_symlink() and not e.is_file() and not e.is_dir()]
        except FileNotFoundError:  # removed since it was found: list it as empty, keep nothing
            states = None
            continue
        if states is not None:
            states.append((rel, [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]))  # as _state
        pending += [os.path.join(rel, d) for d in sorted(dirs, reverse=True) if not is_junk(d)]
        # Hidden files are junk (is_junk: "__MACOSX" has no image extension); a dead link is never left out.
        images, left = [n for n in dangling if n[0] != "." and n.lower().endswith(IMAGE_EXTENSIONS)], []
        for n in files:
            if n[0] != ".":
                (images if n.lower().endswith(IMAGE_EXTENSIONS) else left).append(n)
        others += [os.path.join(rel, n) for n in left]
        if images:  # "class/a\0class/b\0": the joins write the prefix, no string per file in Python
            prefix = rel + os.sep
            chunks.append((rel, prefix + ("\0" + prefix).join(sorted(images)) + "\0"))
    return [chunk for _, chunk in sorted(chunks)], states, sorted(others)


def scan_split(
    root: str,
) -> tuple[list[str], list[str], list[list[int]] | None, list[str], np.ndarray, np.ndarray, np.ndarray]:
    """List ``root/<class>/`` and its sub-folders' image files: (class folders, their sub-folders (paths
    relative to ``root``), the state of root, of the class folders and of the sub-folders in that order,
    the files left out for their extension, blob, offsets, folder index per file), sorted by class folder,
    then by folder and name; paths in the blob and of the files left out are relative to ``root``. Each
    folder's state is read before the folder is listed, so a change during the scan shows as a changed
    state later. The state is None if a folder vanished during the scan."""
    try:
        root_state: list[int] | None = _state(root)
    except OSError:
        root_state = None
    folders = find_classes(root)
    chunks, counts, class_states, sub_states, complete = [], [], [], [], root_state is not None
    others: list[str] = []
    for name in folders:
        found, states, left_out = _list_class(root, name)
        chunks += found
        others += left_out
        counts.append(sum(chunk.count("\0") for chunk in found))
        if states is None:
            complete = False
        else:
            class_states.append(states[0][1])  # the class folder's, listed first
            sub_states += states[1:]
    blob = np.frombuffer(os.fsencode("".join(chunks)), np.uint8)
    ends = np.flatnonzero(blob == 0) + 1  # a NUL byte never occurs inside a UTF-8 or fs-encoded name
    offsets = np.concatenate([np.zeros(1, np.int64), ends.astype(np.int64)])
    folder_of_file = np.repeat(np.arange(len(folders), dtype=np.int32), counts)
    subfolders = [rel for rel, _ in sub_states]
    state = [root_state, *class_states, *(s for _, s in sub_states)] if complete else None
    return folders, subfolders, state, others, blob, offsets, folder_of_file


# ---- the cache file ---------------------------------------------------------------------------------
# MAGIC, header length (uint64), JSON header, then blob, offsets (int64) and folder index (int32), each at
# a 64-byte boundary.


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lit_ddp" / "image_index"


def cache_file(cache_dir: Path, root: str) -> Path:
    key = hashlib.blake2b(os.fsencode(os.path.abspath(root)), digest_size=10).hexdigest()
    return cache_dir / f"{key}.v{FORMAT}.idx"


def _aligned(n: int) -> int:
    return -(-n // 64) * 64


def _write(path: Path, header: dict, arrays: list[np.ndarray]) -> None:
    layout, at = [], 0
    for a in arrays:
        layout.append([at, str(a.dtype), len(a)])
        at = _aligned(at + a.nbytes)
    text = json.dumps({**header, "arrays": layout}).encode()
    start = _aligned(16 + len(text))
    # Readers see the old file or the whole new one, never a partial one (writes.py).
    with atomic_file(path, "the file list", elsewhere="--data.index_cache") as f:
        f.write(MAGIC + len(text).to_bytes(8, "little") + text)
        for a, (offset, _, _) in zip(arrays, layout, strict=True):
            f.seek(start + offset)
            f.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def _read_header(path: Path) -> tuple[dict, int] | None:
    """The header and where the arrays start, or None for a missing, foreign or damaged file."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            if len(head) < 16 or head[:8] != MAGIC:
                return None
            size = int.from_bytes(head[8:], "little")
            return json.loads(f.read(size)), _aligned(16 + size)
    except (OSError, ValueError):
        return None


def _read_arrays(path: Path, header: dict, start: int) -> list[np.ndarray] | None:
    """The arrays, read into this process's memory (not memory-mapped: a forked worker's first touch of a
    mapped file page would count as its own memory), or None if the file is shorter than its header says."""
    try:
        size = path.stat().st_size
        arrays = []
        for offset, dtype, n in header["arrays"]:
            if start + offset + n * np.dtype(dtype).itemsize > size:
                return None
            arrays.append(np.fromfile(path, dtype, n, offset=start + offset))
        return arrays
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _prune(cache_dir: Path, keep: Path) -> None:
    """Delete the cache files of folders that no longer exist (test trees, moved data sets)."""
    for other in cache_dir.glob("*.idx"):
        found = _read_header(other) if other != keep else ({"root": "."}, 0)
        if found is None or not os.path.isdir(found[0].get("root", "")):
            other.unlink(missing_ok=True)


# ---- load or scan -----------------------------------------------------------------------------------


class SplitListing:
    """One split's listing: its class folders (as on disk), the files, and where it came from."""

    def __init__(
        self, root: str, folders: list[str], arrays: list[np.ndarray], source: str, others: Sequence[str] = ()
    ) -> None:
        self.root, self.folders = root, folders
        self.blob, self.offsets, self.folder_of_file = arrays
        self.source = source  # "listed" (this process scanned the tree) or "cache" (read a listing)
        self.others = list(others)  # files left out for their extension, known where listed (left_out_note)

    def __len__(self) -> int:
        return len(self.folder_of_file)

    def samples(self, label_of_folder: Sequence[int]) -> SampleIndex:
        """The (path, label) index, label = ``label_of_folder[class folder's position in self.folders]``."""
        lut = np.asarray(label_of_folder, dtype=np.int64)
        labels = lut[self.folder_of_file] if len(self) else np.zeros(0, np.int64)
        return SampleIndex(os.path.join(self.root, ""), self.blob, self.offsets, labels)


def _unchanged(header: dict, root: str, trusted_since: float | None) -> bool:
    if header.get("root") != root or header.get("extensions") != list(IMAGE_EXTENSIONS):
        return False
    if trusted_since is not None and header.get("listed_at", 0) >= trusted_since:
        return True  # listed during this run (by local rank 0): every rank uses that same listing
    watched = [*header.get("folders", []), *header.get("subfolders", [])]
    folders = [root] + [os.path.join(root, f) for f in watched]
    saved = header.get("state") or []
    if len(saved) != len(folders):
        return False
    try:  # a class folder added or removed changes the root's state, checked first
        return all(s is not None and s == _state(f) for s, f in zip(saved, folders, strict=True))
    except OSError:
        return False


def load_or_scan(
    root: str | Path, cache_dir: Path | None, trusted_since: float | None = None
) -> tuple[SplitListing, str | None]:
    """The listing of ``root``: from ``cache_dir`` if the listing there is still valid, else scanned now and
    written there. ``trusted_since``: a listing made at or after this ``time.time()`` is used without
    checking the tree (the data module passes its creation time: a listing local rank 0 made in this run).
    Returns the listing and, if the cache could not be written, why."""
    root = os.path.abspath(root)
    path = cache_file(cache_dir, root) if cache_dir is not None else None
    found = _read_header(path) if path is not None else None
    if found is not None and _unchanged(found[0], root, trusted_since):
        arrays = _read_arrays(path, *found)
        if arrays is not None:
            return SplitListing(root, found[0]["folders"], arrays, "cache"), None
    listed_at, started = time.time(), time.time_ns()
    folders, subfolders, state, others, *arrays = scan_split(root)
    listing = SplitListing(root, folders, arrays, "listed", others)
    if path is None:
        return listing, None
    # A folder changed near the listing may change again within its timestamps' tick, unseen: recorded as
    # unknown (None), so that later runs list it again.
    if state is not None:
        state = [s if abs(started - max(s[0], s[1])) > SETTLE_NS else None for s in state]
    header = {"root": root, "extensions": list(IMAGE_EXTENSIONS), "folders": folders, "listed_at": listed_at}
    header["subfolders"] = subfolders
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, {**header, "state": state or []}, arrays)
        _prune(path.parent, keep=path)
    except WriteError as err:
        return listing, f"{err.os_error.strerror or type(err.os_error).__name__}: {err.path}"
    except OSError as err:
        return listing, f"{type(err).__name__}: {err}"
    return listing, None
