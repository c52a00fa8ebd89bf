"""The run store, second pass (issue 47), tried as an attacker would: every number of a finished
run's summary and every field of its meta is proven (an edit makes the run invalid, with its
reason), no name escapes the store, a broken meta.json is one line, threads are part of the run id
exactly when the ar match reads them, a stash verifies on restore, and a read-only store is one line."""

from __future__ import annotations

import errno
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments import store as store_cli
from viasd.errors import ConfigError
from viasd.harness import runner
from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.report.build import build_all, collect
from viasd.tracking import run_folder as run_folder_mod
from viasd.tracking.ids import config_hash, run_id_for
from viasd.tracking.proof import LEGACY_PROOFS, inspect
from viasd.tracking.results import publish, restore, stash
from viasd.tracking.store import RunStore, StoreReadOnly

CELL = ["pair=tiny-llama", "task=prompts", "seed=0", "task.n_examples=2", "generation.max_new_tokens=8"]
OLD_STORE = Path(__file__).parent / "fixtures" / "store_3180974"
BAD_NAMES = ["../../evil", "/tmp/evil", "a/b", "..", ".hidden", "a\0b", "x" * 300, "a b", "-rf"]


def _run(*overrides: str, cell: list[str] = CELL) -> dict:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return run(compose(config_name="config", overrides=[*cell, *overrides]))


@pytest.fixture
def ar_sd(runs_dir):
    ar, sd = _run("method=ar"), _run("method=sd")
    assert sd["ar_run_id"] == ar["run_id"]
    return ar, sd


def _numbers(d: dict, prefix: str = "") -> list[str]:
    """Every numeric (or boolean) field of a JSON object, nested keys joined by ``/``."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _numbers(v, f"{prefix}{k}/")
        elif isinstance(v, (int, float)) and k not in ("examples_lines",):
            out.append(prefix + k)
    return out


def _edit(d: dict, key: str) -> dict:
    """``d`` with the field ``key`` (nested by ``/``) changed to another value of its type."""
    d = json.loads(json.dumps(d))
    *path, last = key.split("/")
    node = d
    for p in path:
        node = node[p]
    v = node[last]
    node[last] = (not v) if isinstance(v, bool) else (v + 1 if isinstance(v, int) else v * 1.5 + 0.25)
    return d


def test_every_edited_summary_number_makes_the_run_invalid_and_unused(ar_sd, runs_dir, tmp_path):
    """Item 1: not only rejection_rate: each numeric field of the sd summary (counts, rates, quality
    metrics, speedups, timings), edited alone, makes the run invalid naming the checksum; the report
    does not read it and publish refuses it. The unedited file proves itself again."""
    _, sd = ar_sd
    folder = runs_dir / sd["run_id"]
    kept = (folder / "summary.json").read_text()
    summary = json.loads(kept)
    keys = _numbers(summary)
    assert {"rejection_rate", "speedup_vs_ar", "mean_accepted", "target_calls"} <= set(keys), keys
    for key in keys:
        (folder / "summary.json").write_text(json.dumps(_edit(summary, key)))
        v = inspect(folder)
        assert not v.finished and v.reason, key
        assert "record_sha256 differs" in v.reason or "is not its examples'" in v.reason or \
            "complete records" in v.reason, (key, v.reason)
    (folder / "summary.json").write_text(json.dumps({**summary, "rejection_rate": 0.0}))
    runs, _ = collect("table2", "smoke", RunStore(runs_dir), ["task=prompts", "method=sd"])
    assert not any(r.get("run_id") == sd["run_id"] for r in runs)
    with pytest.raises(ConfigError, match="not a finished valid run .*rejection_rate 0 is not its examples"):
        publish([sd["run_id"]], RunStore(runs_dir), tmp_path / "results")
    (folder / "summary.json").write_text(json.dumps({**summary, "record_sha256": "0" * 64}))
    assert "record_sha256 differs" in inspect(folder).reason
    (folder / "summary.json").write_text(kept)
    assert inspect(folder).finished
    # stripped of its checksum (read as a run older than it), its counters are recomputed from the examples
    bare = {k: v for k, v in summary.items() if k != "record_sha256"}
    for key in ("rejection_rate", "mean_accepted", "accepted", "drafted", "rejected", "rounds", "target_calls"):
        (folder / "summary.json").write_text(json.dumps(_edit(bare, key)))
        assert "is not its examples'" in inspect(folder).reason, key
    (folder / "summary.json").write_text(kept)


def test_a_store_listing_legacy_checksums_holds_its_old_runs_to_them(tmp_path):
    """Runs written before record_sha256 stay valid; where their store lists them in _proofs.json
    (as the committed results store does) an edited number, or a summary stripped of nothing but a
    field, is caught too."""
    store = tmp_path / "store"
    shutil.copytree(OLD_STORE, store)
    assert all(v.finished for v in RunStore(store).folders())
    from viasd.tracking.proof import _meta, record_sha256

    proofs = {v.path.name: record_sha256(v.summary, _meta(v.path)[0]) for v in RunStore(store).folders()}
    (store / LEGACY_PROOFS).write_text(json.dumps(proofs))
    assert all(v.finished for v in RunStore(store).folders())
    ar = next(store.glob("tiny-llama__ar__*"))
    summary = json.loads((ar / "summary.json").read_text())
    (ar / "summary.json").write_text(json.dumps({**summary, "total_s": 7}))  # not recomputable: the checksum
    assert "record_sha256 differs" in inspect(ar).reason
    # publishing an old run lists its checksum beside it in the results store
    results = tmp_path / "results"
    sd = next(OLD_STORE.glob("tiny-llama__sd__*")).name
    publish([sd], RunStore(OLD_STORE), results)
    assert sd in json.loads((results / LEGACY_PROOFS).read_text()) and inspect(results / sd).finished
    s = json.loads((results / sd / "summary.json").read_text())
    (results / sd / "summary.json").write_text(json.dumps({**s, "total_s": 0.5}))
    assert "record_sha256 differs" in inspect(results / sd).reason


def test_the_committed_results_store_proves_every_run_by_its_legacy_checksums():
    root = PROJECT_ROOT / "results" / "runs"
    listed = json.loads((root / LEGACY_PROOFS).read_text())
    verdicts = RunStore(root).folders()
    assert verdicts and all(v.finished for v in verdicts), [(v.path.name, v.reason) for v in verdicts if not v.finished]
    assert {v.path.name for v in verdicts if "record_sha256" not in v.summary} <= set(listed)


@pytest.mark.parametrize("key", ["pair.name", "task.name", "method.name"])
def test_no_name_escapes_the_store(runs_dir, tmp_path, key):
    """Item 2: a name with '..', '/', an absolute path, NUL, a space, a leading '-' or 300 characters,
    in any part of a run folder's name, is one ConfigError line naming the key and the rule; nothing is
    written anywhere."""
    cfg = {"pair": {"name": "tiny-llama"}, "method": {"name": "ar"}, "task": {"name": "prompts"}}
    for bad in BAD_NAMES:
        c = json.loads(json.dumps(cfg))
        c[key.split(".")[0]]["name"] = bad
        with pytest.raises(ConfigError, match=rf"^{key}=.* (is not a plain name|characters long)") as e:
            run_id_for(c)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:  # task and method names are checked by their registries first
        _run(f"{key}=../../evil")
    assert "\n" not in str(e.value) and (key != "pair.name" or "is not a plain name" in str(e.value))
    assert not runs_dir.exists() or not [p for p in runs_dir.rglob("*") if p.is_dir()]
    assert not (tmp_path.parent / "evil").exists() and not Path("/tmp/evil").exists()


def test_store_paths_stay_inside_for_every_entry_point(ar_sd, runs_dir, tmp_path, capsys):
    """A run id given to lock/open/publish/stash/restore that is not a plain name, or that leaves the
    store, is one line; lookups by such a name find nothing."""
    store = RunStore(runs_dir)
    for bad in ["../x__ar__t__0123456789", "/etc__ar__t__0123456789", "a\0b", "x" * 300]:
        with pytest.raises(ConfigError, match="run id"):
            store.lock(bad)
        with pytest.raises(ConfigError, match="run id"):
            store.open(bad, {})
    with pytest.raises(ConfigError, match="leaves the store"):
        store.path("../elsewhere")
    assert store.verdict("ar:humaneval") is None  # a selector, not a run id: a lookup finds nothing
    for cmd in (["publish", "../../evil", "--to", str(tmp_path / "res")], ["stash", "../../evil"],
                ["restore", "../../evil", "--from", str(tmp_path)]):
        with pytest.raises(SystemExit) as e:
            store_cli.main([*cmd, "--runs", str(runs_dir)])
        err = capsys.readouterr().err.splitlines()
        assert e.value.code == 2 and err[-1].startswith("error: ") and "../../evil" in err[-1], err


def test_a_flipped_or_truncated_meta_makes_its_run_invalid_with_one_line(ar_sd, runs_dir, tmp_path, capsys):
    """Item 3: a flipped value in meta.json (threads, runtime, cpu: what the report prices a run by)
    and a truncated meta.json each make the run invalid with one reason; the report lists it in one
    line and goes on (no JSONDecodeError traceback). A legacy run's truncated meta is invalid too."""
    ar, _ = ar_sd
    meta_file = runs_dir / ar["run_id"] / "meta.json"
    kept = meta_file.read_text()
    meta = json.loads(kept)
    for field, value in (("threads", 2), ("cpu", "another cpu"), ("runtime", {**meta["runtime"], "dtype": "bf16"})):
        meta_file.write_text(json.dumps({**meta, field: value}))
        assert "record_sha256 differs" in inspect(meta_file.parent).reason, field
    for broken in (kept[: len(kept) // 2], "[1, 2]", ""):
        meta_file.write_text(broken)
        v = inspect(meta_file.parent)
        assert not v.finished and v.reason.startswith("meta.json") and "\n" not in v.reason, v.reason
    capsys.readouterr()
    assert store_cli.main(["check", "--runs", str(runs_dir), "--results", "none"]) == 1
    assert "meta.json" in capsys.readouterr().out
    r = subprocess.run([sys.executable, "-m", "experiments.report", "--scale", "smoke", "--only", "table2",
                        "--out", str(tmp_path / "pf"), "--runs", str(runs_dir), "--results", "none",
                        "--override", "task=prompts", "method=sd"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT), "HOME": str(tmp_path),
                            "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}, timeout=300)
    assert "Traceback" not in r.stderr and "meta.json does not read" in r.stderr, r.stderr[-2000:]
    meta_file.write_text(kept)
    assert inspect(meta_file.parent).finished
    old = tmp_path / "old"
    shutil.copytree(OLD_STORE, old)
    m = next(old.glob("tiny-llama__ar__*")) / "meta.json"
    m.write_text(m.read_text()[:20])
    assert inspect(m.parent).reason.startswith("meta.json does not read")


def test_threads_enter_the_run_id_exactly_when_they_change_the_ar_match(runs_dir, capsys):
    """Item 4: threads=1 (the default) keeps every run id; threads=2 is another run (not a silent
    reuse of the threads=1 run), and the command printed for a missing ar baseline creates it."""
    base = {"pair": {"name": "p"}, "method": {"name": "ar"}, "task": {"name": "t"}}
    assert config_hash({**base, "threads": 1}) == config_hash(base)
    assert config_hash({**base, "threads": 2}) != config_hash({**base, "threads": 1})
    assert config_hash({**base, "threads": None}) != config_hash({**base, "threads": 1})
    one = _run("method=ar")
    two = _run("method=sd", "threads=2")
    assert two["run_id"] != _run("method=sd")["run_id"]  # not a reuse: its own run
    assert two.get("ar_run_id") is None  # the threads=1 ar is not its baseline
    build_all(runs_dir.parent / "pf", RunStore(runs_dir), "smoke", ["table2"], ["task=prompts", "method=sd", "threads=2"])
    src = json.loads((runs_dir.parent / "pf" / "smoke" / "table2.sources.json").read_text())
    (cmd,) = src["missing_ar"]
    assert "threads=2" in cmd
    capsys.readouterr()
    made = _run(*shlex.split(cmd)[3:], cell=[])
    assert "already finished" not in capsys.readouterr().out and made["run_id"] != one["run_id"]
    build_all(runs_dir.parent / "pf", RunStore(runs_dir), "smoke", ["table2"], ["task=prompts", "method=sd", "threads=2"])
    src = json.loads((runs_dir.parent / "pf" / "smoke" / "table2.sources.json").read_text())
    assert src["baselines"] == {two["run_id"]: made["run_id"]} and not src.get("missing_ar")


def test_a_changed_stash_does_not_restore(runs_dir, tmp_path, capsys):
    """Item 5: a stash carries the checksums of its files; an example (or the config/meta) changed in
    it, or a stash without them, is refused by restore with one line, and nothing is restored."""
    whole = _run("method=ar")
    rid = whole["run_id"]
    (runs_dir / rid / "summary.json").unlink()
    stash_dir = tmp_path / "unfinished"
    stash([rid], RunStore(runs_dir), stash_dir)
    ex = stash_dir / rid / "examples.jsonl"
    kept = ex.read_text()
    first = json.loads(kept.splitlines()[0])
    ex.write_text(json.dumps({**first, "new_tokens": first["new_tokens"] + 1}) + "\n" + "".join(
        ln + "\n" for ln in kept.splitlines()[1:]))
    other = tmp_path / "other"
    with pytest.raises(ConfigError, match="examples.jsonl is not the file that was stashed"):
        restore(stash_dir, RunStore(other))
    with pytest.raises(SystemExit) as e:
        store_cli.main(["restore", "--runs", str(other), "--from", str(stash_dir)])
    err = capsys.readouterr().err.splitlines()[-1]
    assert e.value.code == 2 and err.startswith("error: cannot restore") and "checksum differs" in err
    assert not (other / rid).exists()
    ex.write_text(kept)
    (stash_dir / rid / "stash.json").unlink()
    with pytest.raises(ConfigError, match="no stash.json"):
        restore(stash_dir, RunStore(other))
    stash([rid], RunStore(runs_dir), stash_dir)  # a stash that does not prove itself is replaced
    assert "restored" in restore(stash_dir, RunStore(other))[0][1]


def test_a_read_only_store_is_one_line(runs_dir, monkeypatch):
    """Item 6: EROFS/EACCES writing the store (faked at our own helpers, as root ignores chmod) is one
    StoreReadOnly line naming the store and the fix; no run folder is left."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(run_folder_mod, "atomic_write_text", read_only)
    monkeypatch.setattr(run_folder_mod, "append_text", read_only)
    try:
        with pytest.raises(StoreReadOnly, match=r"^cannot write .*config.yaml \(Read-only file system: the run "
                                                r"store .* is read-only for this user\); make it writable") as e:
            _run("method=ar")
        assert "\n" not in str(e.value) and not [p for p in runs_dir.iterdir() if p.is_dir()]
    finally:
        runner.FULL_STORES.clear()
    monkeypatch.undo()

    def no_lock(self, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    from viasd.tracking.lock import RunLock
    monkeypatch.setattr(RunLock, "try_acquire", no_lock)
    with pytest.raises(StoreReadOnly, match=r"^cannot write .* \(Permission denied: the run store"):
        RunStore(runs_dir).claim(RunStore(runs_dir).lock("a__ar__b__0123456789"), wait=False)
