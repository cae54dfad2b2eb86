"""The README teaches in at most 300 lines, every relative link in it and in docs/ resolves, and measured
figures live in docs/, not in lit_ddp's code (at most 3 left there)."""

import re
from pathlib import Path
from urllib.parse import unquote

from conftest import REPO

# A markdown link or image: [text](target) / ![alt](target), target without spaces.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A measured figure: a number and a unit of time, rate or share ("0.35 ms", "~3 µs", "5120 img/s", "20 %",
# "9.8 s"), the number not part of a name or a longer number ("m2s", "v1.5s" do not count).
FIGURE = re.compile(
    r"(?<![\w.])~?\d[\d,]*(?:\.\d+)?\s?(?:ms|µs|us|ns|img/s|images/s|samples/s|%|s|seconds)(?![\w/])"
)
MAX_FIGURES_IN_CODE = 3


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)  # links in code blocks are code
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def figures_in_code() -> list[str]:
    found = []
    for path in sorted((REPO / "lit_ddp").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{path.relative_to(REPO)}:{number}: {m.group()}" for m in FIGURE.finditer(line)]
    return found


def test_the_readme_is_at_most_300_lines() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def test_the_readme_opens_with_the_two_set_up_commands() -> None:
    block = (REPO / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    install_and_run = "pip install -e . && python -m lit_ddp fit"
    assert commands == [install_and_run, 'pip install -e ".[dev]" && python -m pytest']


def test_every_relative_link_resolves() -> None:
    broken = []
    for path in markdown_files():
        for target in relative_links(path):
            file = unquote(target.split("#", 1)[0])
            if file and not (path.parent / file).exists():
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_the_link_check_sees_links_and_skips_urls_and_code(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("[a](x.md#s) ![i](img.png) [u](https://e.org) [t](#top)\n```\n[c](code.md)\n```\n")
    assert relative_links(page) == ["x.md#s", "img.png"]


def test_the_figure_pattern_finds_measured_figures_only() -> None:
    line = "~0.3 ms per step, ~3 %, 5120 img/s, 9.8 s, 3 µs; not m2s, conv2d, 3 steps, v1.5"
    assert [m.group() for m in FIGURE.finditer(line)] == ["~0.3 ms", "~3 %", "5120 img/s", "9.8 s", "3 µs"]


def test_measured_figures_live_in_docs_not_in_code() -> None:
    found = figures_in_code()
    assert len(found) <= MAX_FIGURES_IN_CODE, "\n".join(found)


def test_the_map_of_the_tests_names_every_test_file() -> None:
    """tests/README.md is how a newcomer finds the tests of a module or a command: a file left off is lost."""
    listed = set(re.findall(r"`(test_\w+\.py)`", (REPO / "tests" / "README.md").read_text()))
    files = {path.name for path in (REPO / "tests").glob("test_*.py")}
    assert not files - listed, f"add to tests/README.md: {sorted(files - listed)}"
    assert not listed - files, f"gone, still in tests/README.md: {sorted(listed - files)}"
