"""Training and scoring the learned VIA-SD gate (scikit-learn) from a run's labelled trace rows.

:func:`labelled` collects :func:`~viasd.analysis.gates.training_rows` per problem; :func:`fit`
fits a standardized logistic regression (``StandardScaler`` + ``LogisticRegression``) with a
cost-sensitive weight ``λ``: a row whose slim decision is *not* the target's (trusting it would
diverge) weighs ``λ``, a row whose slim decision is the target's (trusting it saves a target
call) weighs ``1 − λ`` — a larger ``λ`` buys quality with speed. :func:`split_problems` splits by
problem (never the same problem on both sides); :func:`scores` are the held-out metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from viasd.analysis.gates import training_rows
from viasd.core.gate import gate_probability
from viasd.errors import ConfigError


@dataclass
class Labelled:
    """Labelled rows of some problems: ``x`` ``[n, F]``, ``y`` ``[n]`` (1: the slim decision is the
    target's), ``problem`` ``[n]`` (the example index of each row)."""

    x: np.ndarray
    y: np.ndarray
    problem: np.ndarray

    def of(self, problems) -> Labelled:
        keep = np.isin(self.problem, list(problems))
        return Labelled(self.x[keep], self.y[keep], self.problem[keep])


def labelled(traces, p_spec: str, q_spec: str, gamma: int, topk: int, temperature: float) -> Labelled:
    """Every labelled row of every example of ``traces``."""
    xs, ys, ps = [], [], []
    for i in range(traces.n_examples):
        x, y = training_rows(traces, i, p_spec, q_spec, gamma, topk, temperature)
        if len(y):
            xs.append(x.numpy())
            ys.append(np.asarray(y, dtype=np.int64))
            ps.append(np.full(len(y), i))
    if not xs:
        return Labelled(np.zeros((0, 0)), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    return Labelled(np.concatenate(xs), np.concatenate(ys), np.concatenate(ps))


def split_problems(n_examples: int, test: float, seed: int, keep_out: list[int] | None = None
                   ) -> tuple[list[int], list[int]]:
    """``(train, test)`` example indices, disjoint (``test``: the held-out share, at least one each).

    ``keep_out``: indices that must be held out (e.g. the problems a live decode will run the gate on);
    the rest of the held-out share is drawn from the others.
    """
    if n_examples < 2:
        raise ConfigError(f"a train/test split by problem needs >= 2 traced problems (got {n_examples}); "
                          "trace a run with more examples")
    must = sorted(set(keep_out or []))
    size = max(1, round(test * n_examples), len(must))
    if size >= n_examples:
        raise ConfigError(f"holding out {size} of {n_examples} problems leaves none to train on; lower test= or live=")
    rest = [i for i in range(n_examples) if i not in set(must)]
    if size == len(must):
        return rest, must
    train, held = train_test_split(rest, test_size=size - len(must), random_state=seed)
    return sorted(train), sorted(held + must)


def fit(data: Labelled, lam: float, min_rows: int) -> dict[str, Any]:
    """A gate's coefficients (``mean``, ``scale``, ``coef``: ``[F]``; ``intercept``) fit on ``data`` with weight λ."""
    if not 0 < lam < 1:
        raise ConfigError(f"lam must be in (0, 1) (got {lam}): the weight of a wrong trust; 0.5 weighs both errors alike")
    if len(data.y) < min_rows or len(set(data.y.tolist())) < 2:
        raise ConfigError(f"too few labelled rounds to train a gate: {len(data.y)} rows "
                          f"({int(data.y.sum()) if len(data.y) else 0} positive; need >= {min_rows} with both labels); "
                          "trace a run with more problems or longer outputs, or lower min_rows")
    weight = np.where(data.y == 1, 1 - lam, lam)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    model.fit(data.x, data.y, logisticregression__sample_weight=weight)
    scaler, lr = model.named_steps["standardscaler"], model.named_steps["logisticregression"]
    return {"mean": scaler.mean_, "scale": scaler.scale_, "coef": lr.coef_[0], "intercept": float(lr.intercept_[0])}


def scores(params: dict[str, Any], data: Labelled, threshold: float = 0.5) -> dict[str, Any]:
    """Held-out metrics of a gate on ``data``: rows, problems, the share the slim verifier is right
    (``base``), ROC AUC, the share trusted at ``threshold`` and the precision of those trusted."""
    prob = gate_probability(torch.from_numpy(data.x), *(torch.as_tensor(params[k]) for k in ("mean", "scale", "coef")),
                            params["intercept"]).numpy()
    trust = prob >= threshold
    both = len(set(data.y.tolist())) == 2
    return {"rows": int(len(data.y)), "problems": int(len(set(data.problem.tolist()))),
            "base": float(data.y.mean()) if len(data.y) else float("nan"),
            "auc": float(roc_auc_score(data.y, prob)) if both else float("nan"),
            "trusted": float(trust.mean()) if len(data.y) else float("nan"),
            "precision": float(data.y[trust].mean()) if trust.any() else float("nan")}
