"""benchmarks/harness.py: the order of the interleaved rounds, the summary's figures, and the record."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from harness import interleaved, summarize, write_results  # noqa: E402


def test_variants_take_turns_and_the_order_flips_every_round() -> None:
    calls: list[str] = []
    figures = {"a": itertools.count(10), "b": itertools.count(20)}

    def variant(name: str):
        def run() -> float:
            calls.append(name)
            return next(figures[name])

        return run

    samples = interleaved({"a": variant("a"), "b": variant("b")}, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert samples == {"a": [10.0, 11.0, 12.0], "b": [20.0, 21.0, 22.0]}


def test_summary_gives_median_spread_and_ratio_of_medians_to_the_first_variant() -> None:
    summary = summarize({"before": [100.0, 90.0, 110.0, 105.0], "after": [200.0, 150.0, 190.0, 210.0]})
    assert summary["before"] == {
        "median": 102.5,
        "min": 90.0,
        "max": 110.0,
        "n": 4,
        "ratio": 1.0,
        "round_ratio_median": 1.0,
        "round_ratio_min": 1.0,
        "round_ratio_max": 1.0,
    }
    after = summary["after"]
    assert (after["median"], after["min"], after["max"]) == (195.0, 150.0, 210.0)
    assert after["ratio"] == pytest.approx(195.0 / 102.5)
    # per-round ratios 2.0, 1.667, 1.727, 2.0: the median is the mean of the middle two
    assert after["round_ratio_median"] == pytest.approx((190 / 110 + 2.0) / 2)
    assert (after["round_ratio_min"], after["round_ratio_max"]) == (pytest.approx(150 / 90), 2.0)


def test_nothing_to_summarize_is_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        summarize({"a": []})
    with pytest.raises(ValueError):
        interleaved({"a": lambda: 1.0}, rounds=0)


def test_the_record_says_which_command_commit_and_machine_gave_the_figures(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "result.json"
    code = (
        f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); from harness import write_results;"
        f" write_results({str(out)!r}, {{'summary': {{'a': {{'median': 1.0}}}}}})"
    )
    subprocess.run([sys.executable, "-c", code, "--flag"], check=True, cwd=REPO, timeout=60)
    record = json.loads(out.read_text())
    assert record["summary"] == {"a": {"median": 1.0}}
    assert record["command"].endswith("-c --flag")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    assert record["commit"].split("+")[0] == head.strip()
    assert record["machine"]["cpus"] >= 1 and record["machine"]["python"]


def test_a_copied_tree_names_its_commit_through_bench_commit(tmp_path: Path, monkeypatch) -> None:
    # A working tree copied to a GPU machine can carry a .git of an older commit: the name given wins.
    monkeypatch.setenv("BENCH_COMMIT", "0123abc")
    assert write_results(tmp_path / "r.json", {"x": 1})["commit"] == "0123abc"


def test_write_results_returns_what_it_wrote(tmp_path: Path) -> None:
    written = write_results(tmp_path / "r.json", {"x": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == written and written["x"] == 1


@pytest.mark.timeout(240)
def test_an_ab_benchmark_records_both_checkouts_through_the_harness(tmp_path: Path) -> None:
    """ab_checkouts.py's val_jpeg on this checkout against itself, a few tiny JPEGs: the harness's record."""
    out = tmp_path / "ab.json"
    args = [str(REPO), str(REPO), "--measure", "val_jpeg", "--images", "6", "--width", "64"]
    args += ["--height", "48", "--size", "32"]
    args += ["--val-resize", "40", "--batch-size", "3", "--rounds", "2", "--dir", str(tmp_path / "jpegs")]
    script = str(REPO / "benchmarks" / "ab_checkouts.py")
    subprocess.run([sys.executable, script, *args, "--out", str(out)], check=True, timeout=220, cwd=tmp_path)
    record = json.loads(out.read_text())
    assert set(record["samples"]) == {"before", "after"} and record["images"] == 6
    assert all(len(v) == 2 and min(v) > 0 for v in record["samples"].values())
    assert record["summary"]["before"]["ratio"] == 1.0 and "ab_checkouts.py" in record["command"]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("variant", ["lit_ddp", "callbacks"])
def test_an_ab_benchmark_of_the_step_runs_each_checkouts_own_lit_ddp(tmp_path: Path, variant: str) -> None:
    """ab_checkouts.py's step measure on this checkout against itself, a few steps: steps/s for each side,
    from a fresh process that imported lit_ddp from that checkout (the run asserts it), for what ``fit``
    trains and for the default callbacks around a bare step (``--variant``)."""
    out = tmp_path / "ab.json"
    args = [str(REPO), str(REPO), "--measure", "step", "--steps", "4", "--warmup", "2", "--rounds", "1"]
    script = str(REPO / "benchmarks" / "ab_checkouts.py")
    args += ["--variant", variant, "--out", str(out)]
    subprocess.run([sys.executable, script, *args], check=True, timeout=220, cwd=tmp_path)
    record = json.loads(out.read_text())
    assert set(record["samples"]) == {"before", "after"} and record["variant"] == variant
    assert all(len(v) == 1 and min(v) > 0 for v in record["samples"].values())
