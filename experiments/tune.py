"""``python -m experiments.tune [--trials 20] [--study NAME] [overrides …]`` — server-free threshold tuning.

The local counterpart of ``conf/sweep/thresholds_bayes.yaml`` for users without a W&B server:
an optuna study (TPE sampler, seeded) over ``method.tau_accept``, ``method.tau_slim`` and
``method.gamma`` that maximises the same objective the sweeps use, ``speedup_at_quality``
(speedup over the ``ar`` run of the identical workload when quality stays within
``tracking.quality_delta`` of it, else 0). Every trial is an ordinary run in the run store (so
repeated trials are free), the matched ``ar`` run is made first, and the study persists in
``<runs>/tune-<study>.db`` (sqlite) so an interrupted tuning resumes. Extra arguments are Hydra
overrides, e.g. ``pair=tiny-llama task=prompts task.n_examples=2``.
"""

from __future__ import annotations

import argparse
import math
import sys

import optuna
from hydra import compose, initialize_config_dir

from viasd.errors import ConfigError
from viasd.harness.grid import CONF_DIR
from viasd.harness.runner import run
from viasd.paths import runs_dir

#: The search space (same ranges as conf/sweep/thresholds_bayes.yaml).
SPACE = {"method.tau_accept": (0.2, 1.1), "method.tau_slim": (0.2, 1.1), "method.gamma": [2, 4, 6, 8]}


def objective_for(base: list[str]):
    """An optuna objective running ``method=viasd`` with the trial's thresholds on top of ``base``."""
    def objective(trial: optuna.Trial) -> float:
        over = [f"method.tau_accept={trial.suggest_float('method.tau_accept', *SPACE['method.tau_accept'], step=0.05):g}",
                f"method.tau_slim={trial.suggest_float('method.tau_slim', *SPACE['method.tau_slim'], step=0.05):g}",
                f"method.gamma={trial.suggest_categorical('method.gamma', SPACE['method.gamma'])}"]
        summary = run(compose(config_name="config", overrides=["method=viasd", *base, *over]))
        for k in ("speedup_vs_ar", "tokens_per_s", "rejection_rate", "run_id"):
            trial.set_user_attr(k, summary.get(k))
        value = summary.get("speedup_at_quality")
        return 0.0 if value is None or math.isnan(value) else float(value)

    return objective


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--study", default="viasd-thresholds")
    ap.add_argument("--seed", type=int, default=0, help="sampler seed")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (pair=…, task=…)")
    args = ap.parse_args(argv)
    base = [o for o in args.overrides if not o.startswith("method=")]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            run(compose(config_name="config", overrides=["method=ar", *base]))  # the matched baseline
            root = runs_dir()
            root.mkdir(parents=True, exist_ok=True)
            study = optuna.create_study(study_name=args.study, direction="maximize", load_if_exists=True,
                                        storage=f"sqlite:///{root / f'tune-{args.study}.db'}",
                                        sampler=optuna.samplers.TPESampler(seed=args.seed))
            study.optimize(objective_for(base), n_trials=args.trials)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    best = study.best_trial
    print(f"[viasd] best speedup_at_quality {best.value:.3f} at "
          + " ".join(f"{k}={v}" for k, v in best.params.items()) + f" (run {best.user_attrs.get('run_id')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
