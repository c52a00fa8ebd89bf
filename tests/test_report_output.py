"""Reports never change a tracked file unless asked (issue 64.4): a user's reports go to ``reports/<scale>/``
(gitignored) or ``--out``; ``--publish`` writes the committed ``paper_figures/<scale>/``; ``--check`` checks the
committed folder; a figure rebuilt from the same runs is the same bytes (no PDF creation date)."""

from __future__ import annotations

import subprocess

import pytest

import experiments.report as report
from viasd.paths import PROJECT_ROOT
from viasd.report.common import save_figure


@pytest.fixture
def built(monkeypatch, tmp_path):
    """``report.main`` with ``build_all`` recording the folder it was given (nothing is built)."""
    monkeypatch.chdir(tmp_path)
    seen = []
    monkeypatch.setattr(report, "build_all", lambda out, *a, **k: seen.append(out) or {})
    return seen


def test_a_users_report_goes_to_their_own_folder(built, capsys):
    assert report.main(["--scale", "local", "--only", "table2", "--runs", "runs", "--results", "none"]) == 0
    assert [str(p) for p in built] == ["reports"]
    assert "reports in reports/local/ (yours; --publish writes paper_figures/local/)" in capsys.readouterr().out
    assert report.main(["--only", "table2", "--runs", "runs", "--results", "none", "--out", "mine"]) == 0
    assert str(built[-1]) == "mine"


def test_publish_writes_the_committed_folder(built, capsys):
    assert report.main(["--scale", "cpu-large", "--only", "table2", "--runs", "runs", "--results", "none",
                        "--publish"]) == 0
    assert str(built[-1]) == "paper_figures"
    assert "(yours" not in capsys.readouterr().out
    assert report.main(["--publish", "--out", "x", "--runs", "runs", "--results", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --publish writes paper_figures/<scale>/") and err.count("\n") == 1


def test_check_checks_the_committed_folder(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(report, "check_main", lambda roots, *a: seen.append([str(r) for r in roots]) or 0)
    assert report.main(["--check"]) == 0
    assert seen == [["paper_figures", "bench_results"]]


def test_reports_folder_is_ignored_by_git():
    if subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=PROJECT_ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout (e.g. a source archive): .gitignore is not in force")
    r = subprocess.run(["git", "check-ignore", "-q", "reports/local/table2.md"], cwd=PROJECT_ROOT)
    assert r.returncode == 0, "reports/ must be gitignored"
    r = subprocess.run(["git", "check-ignore", "-q", "paper_figures/local/table2.md"], cwd=PROJECT_ROOT)
    assert r.returncode == 1


def test_a_figure_rebuilt_from_the_same_runs_is_the_same_bytes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def draw(out):
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([1, 2, 3], [3, 1, 2])
        return save_figure(fig, out, "fig", [{"run_id": "r", "ar": None, "ar_command": None}], [], "smoke")

    a, b = draw(tmp_path / "a"), draw(tmp_path / "b")
    for x, y in zip(a, b, strict=True):
        assert open(x, "rb").read() == open(y, "rb").read(), x
    pdf = (tmp_path / "a" / "fig.pdf").read_bytes()
    assert b"/CreationDate" not in pdf
