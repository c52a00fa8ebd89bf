"""The routed verifiers of ``via_sd``: the slim verifier's config (``method.slim``), one entry of a hierarchy
(``method.verifiers``) and the checks of a hierarchy (``docs/method.md §5c``).

The method loop and the rest of its knobs live in :mod:`viasd.methods.via_sd`; the routing over any number
of verifiers in :func:`viasd.core.tiers.route_levels`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

from viasd.dimr.masks import SPACES
from viasd.errors import ConfigError


@dataclass
class SlimConfig:
    """Which slim verifier ``q'`` to use.

    ``mask``: ``auto`` (the searched DIMR mask for this pair, ``keep_ratio`` and ``space``), a
    path to a mask artifact, an explicit list of kept layers or ``{attn: [...], mlp: [...]}``
    (kept sub-layers), or an ablation: ``random`` (seeded, same budget), ``first_k`` (early
    exit), ``every_other``, ``independent`` (the pair's intermediate model), ``full`` (the
    target itself). ``space``: ``layers`` or ``sublayers`` (the search space of ``auto`` and of
    the ablations; budgets count parameters read per token). ``share_prefix``: the slim and the
    full pass share the KV cache and hidden states of every sub-layer before the first one the
    mask skips, and an escalation resumes the full model there (same tokens; off: separate caches).
    """

    mask: Any = "auto"  # auto | path.json | [layers] | random | first_k | every_other | independent | full
    keep_ratio: float = 0.8  # kept share of the target (small models are fragile: docs/results.md, SmolLM2 masks)
    objective: str = "kl"
    seed: int = 0
    space: str = "layers"
    share_prefix: bool = True


@dataclass
class VerifierConfig:
    """One routed verifier of a hierarchy (``method.verifiers``, cheapest first; the target is always last).

    ``mask``: as ``method.slim.mask`` takes it, or ``NAME@KEEP`` (``first_k@0.75``: the mask at that keep
    ratio); ``keep_ratio``/``objective``/``seed``/``space``: as in ``method.slim`` (``keep_ratio`` null: from
    ``NAME@KEEP``, else ``method.slim.keep_ratio``). ``tau_accept``/``tau_slim``/``tau_escalate``: this
    verifier's bands (null: the method's).
    """

    mask: Any = "auto"
    keep_ratio: float | None = None
    objective: str = "kl"
    seed: int = 0
    space: str = "layers"
    tau_accept: float | None = None
    tau_slim: float | None = None
    tau_escalate: float | None = None

    def slim(self, default_keep: float) -> SlimConfig:
        """This verifier as a :class:`SlimConfig` (no shared prefix: a hierarchy's verifiers keep their own caches)."""
        mask, keep = self.mask, self.keep_ratio
        if isinstance(mask, str) and "@" in mask:
            mask, _, at = mask.partition("@")
            try:
                keep = float(at) if keep is None else keep
            except ValueError:
                raise ConfigError(f"method.verifiers mask {self.mask!r}: KEEP in NAME@KEEP must be a number "
                                  "(e.g. first_k@0.75)") from None
        return SlimConfig(mask=mask, keep_ratio=default_keep if keep is None else float(keep), objective=self.objective,
                          seed=self.seed, space=self.space, share_prefix=False)



_WARNED: set[str] = set()  # warnings already printed (a config is validated more than once per command)


def check_hierarchy(cfg) -> None:
    """One ``error:`` line per bad hierarchy of a ``VIASDConfig`` (see :class:`VerifierConfig`); a list not ordered
    by cost warns."""
    if cfg.slim != SlimConfig():
        raise ConfigError("method.verifiers replaces method.slim: give each verifier its mask in the list "
                          "(e.g. method.verifiers=[{mask: every_other}, {mask: first_k@0.75}]) and leave "
                          "method.slim at its default")
    if cfg.gate == "learned" and cfg.depth > 1:
        raise ConfigError(f"method.gate=learned is trained for one verifier; with method.verifiers of "
                          f"{len(cfg.verifiers)} use method.gate=thresholds or oracle (or one verifier)")
    slims = cfg.slims()
    for j, (slim, band) in enumerate(zip(slims, cfg.bands()), 1):
        where = f"method.verifiers[{j - 1}]"
        if slim.mask is None or (isinstance(slim.mask, (str, list, tuple, dict)) and not slim.mask) or \
                (isinstance(slim.mask, dict) and not any(slim.mask.values())):
            raise ConfigError(f"{where}.mask is empty; give it a mask (auto, every_other, first_k@0.75, "
                              "a layer list, ...) or drop the verifier")
        if not 0 < slim.keep_ratio <= 1:
            raise ConfigError(f"{where} keep ratio must be in (0, 1] (got {slim.keep_ratio}); "
                              f"set {where}.keep_ratio or NAME@KEEP")
        if slim.space not in SPACES:
            raise ConfigError(f"{where}.space must be one of {SPACES} (got {slim.space!r})")
        for k in ("tau_accept", "tau_slim", "tau_escalate"):
            x = getattr(band, k)
            if math.isnan(x) or x < 0:
                raise ConfigError(f"{where}.{k} must be a number >= 0 (got {x}); a value > 1 switches it off")
        if band.tau_escalate > band.tau_accept:
            raise ConfigError(f"{where}: the band tau_escalate <= s < tau_accept cannot be reached "
                              f"(tau_escalate={band.tau_escalate} > tau_accept={band.tau_accept}); "
                              f"lower {where}.tau_escalate")
        if j < len(slims) and (band.tau_accept == 0 or (band.tau_escalate == 0 and band.tau_slim == 0)):
            raise ConfigError(f"{where} decides every token (tau_accept=0, or tau_slim=0 with no low band), so "
                              f"method.verifiers[{j}:] cannot be reached; raise its thresholds or drop the "
                              "later verifiers")
    costs = [s.keep_ratio if isinstance(s.mask, str) and s.mask not in ("independent", "full") else None
             for s in slims]
    known = [c for c in costs if c is not None]
    if known != sorted(known):
        warn(f"method.verifiers is not ordered by cost (keep ratios {known}); list the cheapest verifier first")


def warn(message: str) -> None:
    """One ``warning:`` line on stderr, once per message and process."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr)
