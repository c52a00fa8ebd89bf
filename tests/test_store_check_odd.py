"""``experiments.store check`` lists an odd folder as invalid and goes on (issue 62 item 4): a
folder whose name is not a plain run id (``my copy``, ``-rf``) or a run folder symlinked out of
the store used to stop the whole listing with one error line."""

from __future__ import annotations

import shutil
from pathlib import Path

from experiments import store as store_cli
from viasd.tracking.proof import INVALID
from viasd.tracking.store import RunStore, valid_runs

OLD_STORE = Path(__file__).parent / "fixtures" / "store_3180974"
AR = "tiny-llama__ar__prompts__b12058ab6d"


def _store(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(OLD_STORE, runs)
    shutil.copytree(runs / AR, runs / "my copy")
    shutil.copytree(runs / AR, runs / "-rf")
    outside = tmp_path / "elsewhere"
    shutil.move(str(runs / "tiny-llama__sd__prompts__1571de53f9"), str(outside))
    (runs / "tiny-llama__sd__prompts__1571de53f9").symlink_to(outside, target_is_directory=True)
    return runs, outside


def test_check_lists_odd_folders_as_invalid_and_goes_on(tmp_path, capsys):
    runs, outside = _store(tmp_path)
    assert store_cli.main(["check", "--runs", str(runs), "--results", "none"]) == 1
    out = capsys.readouterr().out
    assert f"run store {runs}: 4 finished runs, 0 being written, 0 unfinished, 0 empty, 3 invalid" in out
    assert "  invalid       my copy: the folder name is not a plain name" in out
    assert "  invalid       -rf: the folder name is not a plain name" in out
    assert (f"  invalid       tiny-llama__sd__prompts__1571de53f9: a symbolic link (to {outside.resolve()}), "
            "not a run folder of this store") in out
    store = RunStore(runs)
    assert {v.path.name for v in store.invalid_runs()} == {"my copy", "-rf", "tiny-llama__sd__prompts__1571de53f9"}
    assert all(v.state == INVALID for v in store.invalid_runs())
    assert AR in {r["run_id"] for r in valid_runs(store)}  # the readers go on past them too
    assert "tiny-llama__sd__prompts__1571de53f9" not in {r["run_id"] for r in valid_runs(store)}


def test_move_aside_moves_an_odd_folder_and_a_link_not_its_target(tmp_path, capsys):
    runs, outside = _store(tmp_path)
    aside = tmp_path / "aside"
    assert store_cli.main(["check", "--runs", str(runs), "--results", "none", "--move-aside", str(aside)]) == 0
    out = capsys.readouterr().out
    assert f"moved to {aside / 'my copy'}" in out and f"moved to {aside / '-rf'}" in out
    assert (aside / "tiny-llama__sd__prompts__1571de53f9").is_symlink()
    assert (outside / "summary.json").is_file()  # the link's target is left where it was
    assert sorted(p.name for p in runs.iterdir()) == sorted(p.name for p in OLD_STORE.iterdir()
                                                           if p.name != "tiny-llama__sd__prompts__1571de53f9")
    assert store_cli.main(["check", "--runs", str(runs), "--results", "none"]) == 0
