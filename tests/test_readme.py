"""Every command in the ```bash blocks of README.md and docs/*.md runs, so the docs cannot drift.

The blocks run in file order (README.md, then docs/*.md by name), each distinct command once (a command a
page repeats after an earlier one, as this test runs it, is not run again). How a command maps to what this
test runs:

* ``make run`` / ``make test`` → ``make -n <target>`` (a dry run: the set-up steps and the
  command the target would run, checked to be ``experiments.run`` / ``pytest``). Running them
  for real installs a virtual environment / runs this whole suite; ``.ci/run`` does that. What
  ``make run`` leaves behind is made first, as a user meets the blocks after it: the main job
  (``+exp=main``, on the tiny pair) runs in the commands' folder before the first docs command, so a
  later command that names a run by a prefix (``run=smollm2__ar__prompts``) must name one run
  among everything the main job and the earlier commands made.
* ``python -m experiments.<entry> …`` → the same entry with the same overrides, except that
  ``pair=smollm2`` (or no pair) becomes ``pair=tiny-llama`` (a tiny random pair with its own
  draft, no download) and ``pair.options.*`` is dropped, and small limits are appended per
  entry (:data:`LIMITS`). It runs in a temporary folder (``PYTHONPATH`` = this checkout) with
  ``VIASD_RUNS_DIR`` / ``VIASD_CACHE_DIR`` there and ``VIASD_DATA_DIR`` on the synthetic data.
  Commands that cannot run here as written run in the form :data:`MAPPED` lists, each with its reason:
  GPU / hub / paper-scale / cpu-large runs as their dry run, ``+exp=`` grids at the smoke scale, reports on
  the smoke runs, the GPU smoke script on the CPU.
* ``python -m experiments.trace|replay run=smollm2__…`` → the same command on the tiny pair's runs
  (``run=tiny-llama__ar__prompts``: the prefix must be unique among the runs made so far); a trace of a
  SmolLM2 run traces no draft model (``draft=false``), as SmolLM2 loads none unless
  ``pair.options.draft=trained`` (the tiny pair always has one). The docs' ``run=<run id>`` placeholder →
  the main job's ``ar`` run by its full id.
* any other line (``printf … > file``) runs as written, with bash, in the same folder.

A command that fits none of these fails :func:`test_every_docs_command_is_mapped`, and a code block that holds
commands but is not tagged ``bash`` fails :func:`test_command_blocks_are_tagged_bash`. The README's sample of
what the main job prints is checked against what it prints (on the tiny pair) by
:func:`test_readme_sample_of_the_main_job_matches_what_it_prints`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from viasd.models.tiny import build_tiny_pair
from viasd.paths import PROJECT_ROOT

# The commands build on each other (a line reads what an earlier one wrote): they run in file order on one
# xdist worker (`make test` distributes whole files: --dist loadfile).

README = PROJECT_ROOT / "README.md"
DOC_FILES = [README, *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
LIMITS = {
    "run": ["task.n_examples=1", "generation.max_new_tokens=4"],
    "search": ["search.n_trials=3", "search.n_random=2", "search.n_baseline_random=1", "search.n_calibration=2",
               "search.seq_len=12", "search.batch_size=2", "search.time_budget_s=60"],
    "kl": ["search.n_calibration=2", "search.seq_len=12", "search.batch_size=2"],
    "bench": ["n_prompts=1", "max_new_tokens=4", "warmup=0"],
}  # fmt: skip
MAKE_EXPECTS = {"run": "-m experiments.run", "test": "-m pytest", "test-quick": "-m pytest", "report": "-m experiments.report",
                "notebook": "-m experiments.notebook"}
RUN_READERS = ("trace", "replay")  # entries that read a finished run (run=<id or unique prefix>), no pair
TINY_AR_RUN = "tiny-llama__ar__prompts"  # the prefix of the tiny ar runs (the main job makes one)
MAIN_AR = "MAIN-AR-RUN-ID"  # what run=<run id> becomes: replaced by the id once the main job has run
#: What a command that cannot run here as written runs instead, and why.
MAPPED = {
    "scale=paper / exp.scale=paper": "dry_run=true: the paper's pairs need the hub and GPUs",
    "scale=cpu-large": "dry_run=true: the Qwen2.5-Coder pair is a 1.6 GB download and hours of CPU per grid",
    "pair.device=cuda": "dry_run=true: no CUDA device here",
    "pair.*.id=<hub id>": "dry_run=true: nothing downloads from the hub in tests",
    "+exp=NAME without scale=": "scale=smoke: the local scale loads SmolLM2 and builds its distilled draft (~21 min "
                                "once); smoke runs the same grid on tiny random pairs, 2 examples x 8 tokens",
    "experiments.report --scale S": "--scale smoke --results none: the report over the smoke runs made here, not "
                                    "the committed results store",
    "experiments.gpu_smoke [--paper-shapes]": "--device cpu --prompts 1 --max-new-tokens 4: no GPU here",
    "run=smollm2__…": f"run={TINY_AR_RUN}…: the tiny pair's runs made so far (a prefix must stay unique); a trace "
                      "of it with draft=false (SmolLM2 loads no draft model by default, the tiny pair does)",
    "run=<run id>": "the main job's ar run (make run made it), by its full id",
    "KEY=conf/…": "KEY=<checkout>/conf/…: the commands run in a temporary folder, the docs' in the checkout",
    "experiments.replay grid=conf/replay/X.yaml": "a copy of that grid with every list cut to its first value (one "
                                                  "policy per entry, not 226): every policy of the shipped grids "
                                                  "composes in tests/test_replay.py",
}  # fmt: skip
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
COMMAND_LINE = re.compile(r"^\s*(\$ |python -m |make )")


def code_blocks(path: Path) -> list[tuple[str, str, int]]:
    """(language tag, body, line number of the body's first line) of each fenced block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1) for m in FENCE.finditer(text)]


def doc_commands() -> list[tuple[str, str]]:
    """(``file:line``, command line) of each ```bash block line of README.md and docs/*.md, in file order
    (comments and blank lines dropped, backslash continuations joined)."""
    out = []
    for path in DOC_FILES:
        for lang, body, first in code_blocks(path):
            if lang != "bash":
                continue
            lines = body.split("\n")
            i = 0
            while i < len(lines):
                start, line = i, lines[i]
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + " " + lines[i].strip()
                i += 1
                if shlex.split(line, comments=True):
                    out.append((f"{path.relative_to(PROJECT_ROOT)}:{first + start}", line))
    return out


def _kind(line: str) -> str:
    words = shlex.split(line, comments=True)
    if words[0] == "make":
        return "make"
    if words[:2] == ["python", "-m"] and words[2].startswith("experiments."):
        return "python"
    if words[0] in ("printf", "echo"):
        return "shell"
    return "unknown"


def needs_dry_run(args: list[str]) -> bool:
    """A command meant for a GPU machine with the hub, or for hours of CPU: a CUDA device, the paper or
    cpu-large scale, or a hub model id (:data:`MAPPED`)."""
    hub_id = re.compile(r"pair\.\w+\.id=[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    return any(a == "pair.device=cuda" or a in ("scale=paper", "exp.scale=paper", "scale=cpu-large")
               or (hub_id.match(a) and not a.split("=", 1)[1].startswith("/")) for a in args)


def _without_option(args: list[str], name: str) -> list[str]:
    """``args`` without ``name VALUE`` / ``name=VALUE``."""
    out, skip = [], False
    for a in args:
        if not skip and a != name and not a.startswith(name + "="):
            out.append(a)
        skip = a == name
    return out


def write_small_grids(argv: list[str]) -> None:
    """Write each ``grid=<workdir>/grids/NAME`` of ``argv`` (:func:`tiny_form`) from ``conf/replay/NAME``,
    every list of its policies cut to its first value."""
    for a in argv:
        if a.startswith("grid=") and Path(a[5:]).parent.name == "grids":
            grid = yaml.safe_load((PROJECT_ROOT / "conf" / "replay" / Path(a[5:]).name).read_text(encoding="utf-8"))
            small = [{k: v[0] if isinstance(v, list) else v for k, v in entry.items()} for entry in grid["policies"]]
            Path(a[5:]).parent.mkdir(exist_ok=True)
            Path(a[5:]).write_text(yaml.safe_dump({"policies": small}), encoding="utf-8")


def tiny_form(line: str, hf_folder: Path) -> list[str]:
    """The argv this test runs for a ``python -m experiments.<entry> …`` line (:data:`MAPPED`): GPU/hub/
    cpu-large commands as their dry run (nothing downloaded), ``/path/to/folder`` as a saved tiny model, exp
    grids at the smoke scale, reports over the smoke runs, the GPU smoke script on the CPU, everything else
    on a tiny pair with small limits."""
    words = shlex.split(line.replace("run=<run id>", f"run={MAIN_AR}"), comments=True)
    entry, module = words[2].split(".", 1)[1], words[2]
    if entry == "gpu_smoke":
        return [sys.executable, "-m", module, "--device", "cpu", "--prompts", "1", "--max-new-tokens", "4"]
    if entry == "report":
        return [sys.executable, "-m", module, *_without_option(words[3:], "--scale"), "--scale", "smoke", "--results", "none"]
    if entry == "run" and needs_dry_run(words[3:]):
        return [sys.executable, "-m", module, *[a for a in words[3:] if a != "dry_run=true"], "dry_run=true"]
    args = [re.sub(r"^([\w.@/]+)=conf/", rf"\1={PROJECT_ROOT}/conf/", a.replace("/path/to/folder", str(hf_folder)))
            for a in words[3:] if not a.startswith("pair.options.")]
    if entry == "replay":
        args = [re.sub(rf"^grid={PROJECT_ROOT}/conf/replay/", f"grid={hf_folder.parent}/grids/", a) for a in args]
    if entry in RUN_READERS:  # commands on a finished run: the docs' SmolLM2 run is the tiny pair's here
        smollm2 = any(a.startswith("run=smollm2__") for a in args)
        no_draft = ["draft=false"] if entry == "trace" and smollm2 and not any(a.startswith("draft=") for a in args) \
            and not any(a.startswith("pair.options.draft=") for a in words[3:]) else []
        return [sys.executable, "-m", module, *[a.replace("run=smollm2__", "run=tiny-llama__") for a in args], *no_draft]
    if entry == "run" and any(a.startswith("+exp=") for a in args) and not any(a.startswith("scale=") for a in args):
        return [sys.executable, "-m", module, *args, "scale=smoke"]
    pair = next((a for a in args if a.startswith("pair=")), None)
    if pair is None or pair == "pair=smollm2":
        args = [a for a in args if a != pair] + ["pair=tiny-llama"]
    return [sys.executable, "-m", module, *args, *LIMITS.get(entry, [])]


COMMANDS = doc_commands()


def _distinct(kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    """The commands of these kinds, each distinct one (as this test runs it) once, at its first place."""
    seen, out = set(), []
    for where, line in COMMANDS:
        if _kind(line) not in kinds:
            continue
        key = tuple(tiny_form(line, Path("HF"))) if _kind(line) == "python" else line
        if key not in seen:
            seen.add(key)
            out.append((where, line))
    return out


def test_every_docs_command_is_mapped():
    assert COMMANDS, "README.md has no ```bash blocks"
    assert {"make run", "make test"} <= {" ".join(shlex.split(c, comments=True)) for w, c in COMMANDS if w.startswith("README")}
    unknown = [f"{w}: {c}" for w, c in COMMANDS if _kind(c) == "unknown"]
    assert not unknown, f"docs commands with no test mapping (extend tests/test_readme.py): {unknown}"


def test_command_blocks_are_tagged_bash():
    """A code block holding commands is a ```bash block, so this test runs it."""
    untagged = [f"{path.relative_to(PROJECT_ROOT)}:{first}" for path in DOC_FILES for lang, body, first in code_blocks(path)
                if lang != "bash" and any(COMMAND_LINE.match(line) for line in body.split("\n"))]
    assert not untagged, f"code blocks with commands not tagged ```bash (tests/test_readme.py runs only those): {untagged}"


@pytest.mark.parametrize("line", [c for _, c in _distinct(("make",))])
def test_readme_make_targets_dry_run(line):
    target = shlex.split(line, comments=True)[1]
    r = subprocess.run(["make", "-n", target], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert MAKE_EXPECTS[target] in r.stdout


def _env(d: Path, data_dir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "VIASD_RUNS_DIR": str(d / "runs"),
            "VIASD_CACHE_DIR": str(d / "cache"), "VIASD_DATA_DIR": str(data_dir),
            "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, synthetic_data_dir):
    """One folder for all docs commands (a printf line writes the file a later line reads), with a tiny Llama
    saved as a Hugging Face folder for the ``pair=hf`` examples, and what ``make run`` leaves there: the main
    job's runs (on the tiny pair: ``scale=smoke``). Returns ``(folder, env, hf folder, the main job's stdout,
    its ar run id)``."""
    d = tmp_path_factory.mktemp("readme")
    _, target, tokenizer = build_tiny_pair("llama")
    target.save_pretrained(d / "hf-folder")
    tokenizer.save_pretrained(d / "hf-folder")
    env = _env(d, synthetic_data_dir)
    r = subprocess.run([sys.executable, "-m", "experiments.run", "+exp=main", "scale=smoke"], cwd=d, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"the main job (make run) failed:\n{r.stderr[-3000:]}"
    main_ar = [p.name for p in (d / "runs").glob(f"{TINY_AR_RUN}__*")]
    assert len(main_ar) == 1, main_ar
    return d, env, d / "hf-folder", r.stdout, main_ar[0]


@pytest.mark.parametrize("line", [pytest.param(c, id=w) for w, c in _distinct(("python", "shell"))])
def test_docs_command_runs(line, workdir):
    cwd, env, hf_folder, _, main_ar = workdir
    if _kind(line) == "shell":
        r = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    else:
        write_small_grids(argv := [a.replace(MAIN_AR, main_ar) for a in tiny_form(line, hf_folder)])
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{line}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert not (cwd / "outputs").exists(), "Hydra wrote outside the run store"


def skeleton(line: str) -> str:
    """A printed line without what varies between pairs and machines: quoted text, paths, run ids, numbers."""
    line = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "Q", line)
    line = re.sub(r"\S*runs/<run id>", "P", line)
    line = re.sub(r"[\w.-]+__[\w.-]+__[\w.-]+__[0-9a-f]{10}", "R", line)
    return " ".join(re.sub(r"\d+(\.\d+)?", "N", line).split())


def test_readme_sample_of_the_main_job_matches_what_it_prints(workdir):
    """The README's ```text sample of the main job's printout has the lines the main job prints, in order
    (run here at the smoke scale: the same job on the tiny pair, in a fresh store: :func:`workdir`)."""
    sample = next(body for lang, body, _ in code_blocks(README) if lang == "text")
    expected = [skeleton(s) for s in sample.split("\n") if s.strip()]
    stdout = workdir[3]
    printed = iter(skeleton(s) for s in stdout.split("\n"))
    missing = [e for e in expected if not any(p == e for p in printed)]  # a subsequence, in order
    assert not missing, f"README's sample of the main job's output has lines it does not print: {missing}\n{stdout}"
