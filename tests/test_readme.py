"""Every command in README.md's ```bash blocks runs, so the README cannot drift.

How a README command maps to what this test runs:

* ``make run`` / ``make test`` → ``make -n <target>`` (a dry run: the set-up steps and the
  command the target would run, checked to be ``experiments.run`` / ``pytest``). Running them
  for real installs a virtual environment / runs this whole suite; ``.ci/run`` does that.
* ``python -m experiments.<entry> …`` → the same entry with the same overrides, except that
  ``pair=smollm2`` (or no pair) becomes ``pair=tiny-llama`` (a tiny random pair with its own
  draft, no download) and ``pair.options.*`` is dropped, and small limits are appended per
  entry (:data:`LIMITS`). It runs in a temporary folder (``PYTHONPATH`` = this checkout) with
  ``VIASD_RUNS_DIR`` / ``VIASD_CACHE_DIR`` there and ``VIASD_DATA_DIR`` on the synthetic data.
* ``python -m experiments.trace|replay run=smollm2__…`` → the same command on the tiny pair's run
  (``run=tiny-llama__…``: a unique id prefix), made by an earlier README command.
* any other line (``printf … > file``) runs as written, with bash, in the same folder.

A README command that fits none of these fails :func:`test_every_readme_command_is_mapped`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from viasd.models.tiny import build_tiny_pair
from viasd.paths import PROJECT_ROOT

# The commands build on each other (a line reads what an earlier one wrote): they run in file order on one
# xdist worker (`make test` distributes whole files: --dist loadfile).

README = PROJECT_ROOT / "README.md"
LIMITS = {
    "run": ["task.n_examples=1", "generation.max_new_tokens=4"],
    "search": ["search.n_trials=3", "search.n_random=2", "search.n_baseline_random=1", "search.n_calibration=2",
               "search.seq_len=12", "search.batch_size=2", "search.time_budget_s=60"],
    "kl": ["search.n_calibration=2", "search.seq_len=12", "search.batch_size=2"],
    "bench": ["n_prompts=1", "max_new_tokens=4", "warmup=0"],
}  # fmt: skip
MAKE_EXPECTS = {"run": "-m experiments.run", "test": "-m pytest"}
RUN_READERS = ("trace", "replay")  # entries that read a finished run (run=<id or unique prefix>), no pair


def readme_commands() -> list[str]:
    """The command lines of README.md's ```bash blocks (comments and blank lines dropped,
    backslash continuations joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    lines = []
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(line)
    return lines


def _kind(line: str) -> str:
    words = shlex.split(line, comments=True)
    if words[0] == "make":
        return "make"
    if words[:2] == ["python", "-m"] and words[2].startswith("experiments."):
        return "python"
    if words[0] in ("printf", "echo"):
        return "shell"
    return "unknown"


def needs_gpu_or_hub(args: list[str]) -> bool:
    """A command meant for a GPU machine with the hub: a CUDA device, the paper scale or a hub model id."""
    hub_id = re.compile(r"pair\.\w+\.id=[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    return any(a == "pair.device=cuda" or a in ("scale=paper", "exp.scale=paper") or (hub_id.match(a) and not a.split("=", 1)[1]
               .startswith("/")) for a in args)


def tiny_form(line: str, hf_folder: Path) -> list[str]:
    """The argv this test runs for a README ``python -m experiments.<entry> …`` line: GPU/hub
    commands as their dry run (nothing downloaded), ``/path/to/folder`` as a saved tiny model, the
    GPU smoke script on the CPU, everything else on a tiny pair with small limits."""
    words = shlex.split(line, comments=True)
    entry = words[2].split(".", 1)[1]
    if entry == "gpu_smoke":
        return [sys.executable, "-m", words[2], "--device", "cpu", "--prompts", "1", "--max-new-tokens", "4"]
    if entry == "run" and needs_gpu_or_hub(words[3:]):
        return [sys.executable, "-m", words[2], *[a for a in words[3:] if a != "dry_run=true"], "dry_run=true"]
    args = [a.replace("/path/to/folder", str(hf_folder)) for a in words[3:] if not a.startswith("pair.options.")]
    if entry in RUN_READERS:  # commands on a finished run: the README's SmolLM2 run is the tiny pair's here
        return [sys.executable, "-m", words[2], *[a.replace("run=smollm2__", "run=tiny-llama__") for a in args]]
    pair = next((a for a in args if a.startswith("pair=")), None)
    if pair is None or pair == "pair=smollm2":
        args = [a for a in args if a != pair] + ["pair=tiny-llama"]
    return [sys.executable, "-m", words[2], *args, *LIMITS.get(entry, [])]


COMMANDS = readme_commands()


def test_every_readme_command_is_mapped():
    assert COMMANDS, "README.md has no ```bash blocks"
    assert {"make run", "make test"} <= {" ".join(shlex.split(c, comments=True)) for c in COMMANDS}
    unknown = [c for c in COMMANDS if _kind(c) == "unknown"]
    assert not unknown, f"README commands with no test mapping (extend tests/test_readme.py): {unknown}"


@pytest.mark.parametrize("line", [c for c in COMMANDS if _kind(c) == "make"])
def test_readme_make_targets_dry_run(line):
    target = shlex.split(line, comments=True)[1]
    r = subprocess.run(["make", "-n", target], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert MAKE_EXPECTS[target] in r.stdout


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, synthetic_data_dir):
    """One folder for all README commands (a printf line writes the file a later line reads),
    with a tiny Llama saved as a Hugging Face folder for the ``pair=hf`` examples."""
    d = tmp_path_factory.mktemp("readme")
    _, target, tokenizer = build_tiny_pair("llama")
    target.save_pretrained(d / "hf-folder")
    tokenizer.save_pretrained(d / "hf-folder")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "VIASD_RUNS_DIR": str(d / "runs"),
           "VIASD_CACHE_DIR": str(d / "cache"), "VIASD_DATA_DIR": str(synthetic_data_dir),
           "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}  # fmt: skip
    return d, env, d / "hf-folder"


@pytest.mark.parametrize("line", [c for c in COMMANDS if _kind(c) in ("python", "shell")])
def test_readme_command_runs(line, workdir):
    cwd, env, hf_folder = workdir
    if _kind(line) == "shell":
        r = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    else:
        r = subprocess.run(tiny_form(line, hf_folder), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{line}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert not (cwd / "outputs").exists(), "Hydra wrote outside the run store"
