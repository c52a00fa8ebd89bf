"""viasd.utils.fs: atomic writes leave the old file or the new one (never a temp file), and the
file lock excludes a second holder, ending in one ConfigError line after its timeout."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from viasd.errors import ConfigError
from viasd.utils import fs


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_atomic_write_text_replaces_and_sets_the_plain_open_mode(tmp_path):
    path = tmp_path / "sub" / "a.txt"
    fs.atomic_write_text(path, "one")
    fs.atomic_write_text(path, "two ✓")
    assert path.read_text(encoding="utf-8") == "two ✓"
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.txt"]


def test_atomic_write_leaves_the_old_file_and_no_temp_file_on_error(tmp_path):
    path = tmp_path / "a.json"
    fs.atomic_write_json(path, {"x": 1})
    with pytest.raises(TypeError):
        fs.atomic_write_text(path, object())  # f.write fails after the temp file exists
    with pytest.raises(TypeError):  # not serialisable: fails before any file is made
        fs.atomic_write_json(path, {"x": {1, 2}})
    assert json.loads(path.read_text()) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_atomic_write_json_is_strict_json(tmp_path):
    path = tmp_path / "s.json"
    fs.atomic_write_json(path, {"b": float("nan"), "a": [1.5, float("inf")], 3: "k"})
    assert json.loads(path.read_text()) == {"3": "k", "a": [1.5, None], "b": None}
    assert path.read_text().endswith("\n")


def test_file_lock_excludes_a_second_holder_then_times_out_with_one_clear_error(tmp_path):
    lock = tmp_path / "locks" / "x.lock"
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import pathlib, sys
        from viasd.utils.fs import file_lock
        with file_lock({str(lock)!r}):
            pathlib.Path({str(ready)!r}).write_text("held")
            sys.stdin.read()  # hold the lock until the test closes our stdin
    """)], stdin=subprocess.PIPE, cwd=os.getcwd())
    try:
        for _ in range(600):  # wait (up to 60 s) until the child holds the lock
            if ready.exists() or holder.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), "the lock-holding child did not start"
        with pytest.raises(ConfigError, match=r"x\.lock is locked by another process \(waited 0\.2 s\)") as e:
            with fs.file_lock(lock, timeout=0.2):
                pass
        assert "\n" not in str(e.value)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    with fs.file_lock(lock, timeout=5):  # free again once the holder has gone
        with pytest.raises(ConfigError):  # and held by us: a second holder in this process is excluded too
            with fs.file_lock(lock, timeout=0):
                pass
