"""Two processes racing on the same runs (``tests/test_concurrency.py``).

``python -m tests.helpers.race first|second STORE PROMPTS_DIR N_TRIES``: each try ``k`` is the
run ``pair=tiny-llama method=sd task=prompts task.path=PROMPTS_DIR/k.txt`` (as
``python -m experiments.run`` composes it) in the store ``STORE``. ``first`` runs the tries one
after the other; ``second`` starts try ``k`` once the first has written at least 3 examples of it
(or finished it), so each try is the issue's case: the identical command started a few examples
after the first. Prints one line per try naming the run id.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from viasd.harness.runner import Cell, run
from viasd.paths import PROJECT_ROOT

TOKENS = 12


def overrides(prompts: Path, store: Path) -> list[str]:
    return ["pair=tiny-llama", "method=sd", "task=prompts", f"task.path={prompts}",
            f"generation.max_new_tokens={TOKENS}", f"tracking.store_dir={store}"]


def main(role: str, store: Path, prompts_dir: Path, tries: int) -> None:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        for k in range(tries):
            cfg = compose(config_name="config", overrides=overrides(prompts_dir / f"{k}.txt", store))
            if role == "second":
                folder = store / Cell(cfg).run_id
                deadline = time.time() + 120
                while time.time() < deadline and not (folder / "summary.json").exists():
                    ex = folder / "examples.jsonl"
                    if ex.is_file() and ex.read_bytes().count(b"\n") >= 3:
                        break
                    time.sleep(0.02)
            summary = run(cfg)
            print(f"[race] {role} try {k}: {summary['run_id']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
