"""Traces: a pair's models teacher-forced along a finished run's outputs.

For every example of a run, the sequence the run decoded — its prompt exactly as the runner
encoded it (``pair.encode`` of the rendered ``prompt`` in ``examples.jsonl``), then its
``token_ids`` — is fed to one model (the target, the draft, an independent intermediate, or the
target routed through a layer mask) in chunks of ``chunk`` positions through the project's
:class:`~viasd.engine.stream.Stream` (one forward per chunk; the KV cache carries the context,
so memory stays at one chunk of full-vocabulary rows); the longest token prefix every prompt shares
(few-shot exemplars, a chat template's system turn) is fed once per model and each example starts
from its KV (:class:`~viasd.engine.stream.PrefixKV`; ``share_prefix``). Row ``r`` of an example is the model's
next-token distribution after the prompt and the first ``r`` generated tokens (``r < N``). Per
row only what a gate needs is kept, never the full row:

* ``argmax``; ``lse``: ``log Σ_v exp(logit_v / T)`` at each trace temperature ``T``;
* ``topk_ids`` / ``topk_logits``: the ``topk`` largest raw logits, sorted (all of them when
  ``topk ≥ V``: the trace is then exact for every gate, ``tv`` included);
* ``cand_ids`` / ``cand_logits``: raw logits at candidate tokens — the trajectory token and the
  argmax of every model traced for the run before this one (so the slim verifier's probability of
  the draft's greedy token is exact even outside its top-k).

Files: ``<store>/_traces/<run_id>/<role>-<key>.npz`` (``key`` hashes the model, its layer mask
and the settings), written atomically and reused when present; an interrupted trace resumes
from its finished examples (``<file>.parts/``). ``index.json`` maps the specs a policy names
(``target``, ``draft``, ``auto@0.80/kl``, ``layers:0,1,…``) to files. ``docs/replay.md``.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from viasd.dimr.masks import resolve_plan
from viasd.engine.drafters import DrafterConfig, self_drafter
from viasd.engine.routing import RoutingPlan, num_layers, vocab_size_of
from viasd.engine.stream import PrefixKV, Stream, common_prefix, prefix_kv, start_sequence
from viasd.errors import ConfigError
from viasd.utils.fs import atomic_write_bytes, atomic_write_json, file_lock

TRACE_VERSION = 1
TRACES = "_traces"  # reserved folder of the run store
ROW_KEYS = ("argmax", "lse", "topk_ids", "topk_logits", "cand_ids", "cand_logits")


@dataclass
class TraceSettings:
    """What a trace keeps per row (``topk``, ``temperatures``) and how it runs (``chunk`` positions per
    forward; ``share_prefix``: the prompts' common token prefix fed once per model)."""

    topk: int = 32
    temperatures: list[float] = field(default_factory=lambda: [1.0])
    chunk: int = 128
    share_prefix: bool = True

    def validate(self) -> None:
        if self.topk < 1 or self.chunk < 1:
            raise ConfigError(f"topk and chunk must be >= 1 (got topk={self.topk}, chunk={self.chunk})")
        if not self.temperatures or any(not t > 0 for t in self.temperatures):
            raise ConfigError(f"temperatures must be a non-empty list of numbers > 0 (got {self.temperatures})")


def layers_key(layers) -> str:
    """The spec of an explicit layer list (slim mask or self-drafter plan)."""
    return "layers:" + ",".join(str(int(i)) for i in layers)


def slim_key(slim) -> str:
    """The trace spec a ``method.slim`` config (``SlimConfig``) reads its rows from."""
    mask = slim.mask
    if isinstance(mask, (list, tuple)):
        return layers_key(mask)
    mask, keep = str(mask), float(slim.keep_ratio)
    if mask in ("independent", "full"):
        return {"independent": "intermediate", "full": "target"}[mask]
    if mask == "auto":
        return f"auto@{keep:.2f}/{slim.objective}"
    if mask == "random":
        return f"random@{keep:.2f}/seed{slim.seed}"
    if mask in ("first_k", "every_other"):
        return f"{mask}@{keep:.2f}"
    return f"file:{mask}"


@dataclass
class Subject:
    """One model to trace: its ``role`` (target | draft | intermediate | mask), module, routing
    plan (masks) and the specs it serves."""

    role: str
    model: Any
    plan: RoutingPlan | None = None
    specs: list[str] = field(default_factory=list)

    @property
    def layers(self) -> list[int] | None:
        return list(self.plan.layers) if self.plan is not None else None

    def name(self, pair_name: str, settings: TraceSettings) -> str:
        ident = {"v": TRACE_VERSION, "pair": pair_name, "role": self.role, "layers": self.layers,
                 "topk": settings.topk, "temperatures": [float(t) for t in settings.temperatures]}
        return f"{self.role}-{hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:10]}"


class Rows:
    """One model's rows of one example (row ``r``: after the prompt and ``r`` generated tokens).

    ``arrays``: the :data:`ROW_KEYS` arrays of the example, each ``[N, …]``; ``temperatures``:
    the columns of ``lse``.
    """

    def __init__(self, arrays: dict[str, np.ndarray], temperatures: list[float]):
        self.a, self.temperatures = arrays, [float(t) for t in temperatures]
        self.argmax = arrays["argmax"]
        self.n = len(self.argmax)
        self._memo: dict[tuple[str, float], np.ndarray] = {}

    def lse(self, temperature: float) -> np.ndarray:
        """``[N]`` log-normalizers of ``softmax(logits / T)`` (a ConfigError names the fix for an untraced T)."""
        for j, t in enumerate(self.temperatures):
            if abs(t - float(temperature)) < 1e-9:
                return self.a["lse"][:, j].astype(np.float64)
        raise ConfigError(f"the trace has no rows at temperature {temperature} (it has {self.temperatures}); "
                          f"re-trace with temperatures=[{', '.join(map(str, self.temperatures + [temperature]))}]")

    def max_prob(self, temperature: float) -> np.ndarray:
        """``[N]`` ``max_v softmax(logits / T)_v`` (computed once per temperature)."""
        key = ("max", float(temperature))
        if key not in self._memo:
            self._memo[key] = np.exp(self.a["topk_logits"][:, 0].astype(np.float64) / temperature
                                     - self.lse(temperature))
        return self._memo[key]

    def logit(self, r: int, token: int) -> float | None:
        """The raw logit of ``token`` at row ``r`` when the trace kept it, else None."""
        for ids, vals in (("cand_ids", "cand_logits"), ("topk_ids", "topk_logits")):
            hit = np.nonzero(self.a[ids][r] == token)[0]
            if hit.size:
                return float(self.a[vals][r, hit[0]])
        return None

    def prob(self, r: int, token: int, temperature: float) -> tuple[float, bool]:
        """``(probability of token at row r, exact)``; a token the trace did not keep gets the
        k-th largest probability, an upper bound (``exact`` False)."""
        key = ("lse", float(temperature))
        if key not in self._memo:
            self._memo[key] = self.lse(temperature)
        lse = float(self._memo[key][r])
        logit = self.logit(r, token)
        if logit is None:
            return float(np.exp(self.a["topk_logits"][r, -1] / temperature - lse)), False
        return float(np.exp(logit / temperature - lse)), True

    def probs_of(self, tokens: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
        """``([N] probabilities, [N] exact)`` of one token per row (vectorized :meth:`prob`)."""
        lse, idx = self.lse(temperature), np.arange(self.n)
        logit = np.full(self.n, np.nan)
        for ids, vals in (("topk_ids", "topk_logits"), ("cand_ids", "cand_logits")):  # candidates win
            hit = self.a[ids] == np.asarray(tokens)[:, None]
            found = hit.any(1)
            logit = np.where(found, self.a[vals][idx, hit.argmax(1)].astype(np.float64), logit)
        exact = ~np.isnan(logit)
        bound = self.a["topk_logits"][:, -1].astype(np.float64)
        return np.exp(np.where(exact, logit, bound) / temperature - lse), exact

    def topk_probs(self, temperature: float) -> tuple[np.ndarray, np.ndarray]:
        """``([N, K] ids, [N, K] probabilities)`` of the top-k at temperature ``T``."""
        return self.a["topk_ids"], np.exp(self.a["topk_logits"].astype(np.float64) / temperature
                                          - self.lse(temperature)[:, None])

    @property
    def full(self) -> bool:
        """Whether the top-k holds every token (the rows are then exact for any gate)."""
        return bool(self.a.get("full", np.array(False)))


class TraceFile:
    """A loaded trace file: ``meta``, the per-example :class:`Rows` and (target files) the trajectory."""

    def __init__(self, path: Path):
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
        self.path, self.meta = path, json.loads(str(data.pop("meta")))
        self.data = data
        self.offsets = data["offsets"]

    @property
    def n_examples(self) -> int:
        return len(self.offsets) - 1

    def rows(self, i: int) -> Rows:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        arrays = {k: self.data[k][a:b] for k in ROW_KEYS}
        arrays["full"] = np.array(self.meta["topk"] >= self.meta["vocab"])
        return Rows(arrays, self.meta["temperatures"])

    def sequence(self, key: str, i: int) -> list[int]:
        """``prompt`` / ``start`` token ids of example ``i`` (target files), or its generated ``tokens``."""
        off = self.data[f"{key}_offsets"] if key != "tokens" else self.offsets
        return self.data[key][int(off[i]):int(off[i + 1])].tolist()


def _ragged(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), offsets


def _save(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(json.dumps(meta)), **arrays)
    atomic_write_bytes(path, buf.getvalue())


@torch.inference_mode()
def teacher_force(model, plan: RoutingPlan | None, prompt_ids: torch.Tensor, tokens: list[int], cand: np.ndarray,
                  settings: TraceSettings, shared: PrefixKV | None = None) -> dict[str, np.ndarray]:
    """Trace rows of one example: ``model`` (routed through ``plan``) along ``prompt_ids`` ``[1, P]``
    then ``tokens`` (``N``), in forwards of ``settings.chunk`` positions (``shared``: the KV of a
    prefix of ``prompt_ids``, which is then not fed again).

    ``cand``: ``[N, C]`` candidate token ids per row (``-1``: none). Returns the :data:`ROW_KEYS`
    arrays, each ``[N, …]``: row ``r`` is the model's distribution before ``tokens[r]``.
    """
    start = start_sequence(model, prompt_ids)
    l0, n = start.shape[1], len(tokens)
    seq = torch.cat([start, torch.tensor([tokens[:-1]], dtype=torch.long, device=start.device)], 1)
    stream = Stream(model, prompt_ids, "trace", plan, start=shared)
    out: dict[str, list[np.ndarray]] = {k: [] for k in ROW_KEYS}
    prev = l0 - 1
    for end in [*range(l0 - 1 + settings.chunk, l0 + n - 1, settings.chunk), l0 + n - 1]:
        logits = stream.logits(seq[:, :end], last=end - prev)[0].float()  # [c, V]: rows prev - l0 + 1 ..
        c = torch.from_numpy(cand[prev - l0 + 1:end - l0 + 1]).to(logits.device)
        vals, ids = logits.topk(min(settings.topk, logits.shape[-1]), -1)
        cl = logits.gather(-1, c.clamp_min(0)).masked_fill(c < 0, float("nan"))
        lse = torch.stack([torch.logsumexp(logits / t, -1) for t in settings.temperatures], -1)
        for key, v in zip(ROW_KEYS, (logits.argmax(-1), lse, ids.int(), vals, c.int(), cl)):
            out[key].append(v.cpu().numpy())
        prev = end
    return {k: np.concatenate(v) for k, v in out.items()}


def prompt_prefix_kv(model, plan: RoutingPlan | None, prompts: list[torch.Tensor]) -> PrefixKV | None:
    """The KV of the longest token prefix every prompt ``[1, P_i]`` starts with (one forward), or None:
    fewer than two prompts, none shared, or an encoder-decoder (its decoder sequences share no prompt)."""
    if len(prompts) < 2 or getattr(model.config, "is_encoder_decoder", False):
        return None
    n = min(common_prefix(prompts[0], p) for p in prompts[1:])
    return prefix_kv(model, prompts[0][:, :n], plan) if n else None


def trace_dir(store_root: Path, run_id: str) -> Path:
    return Path(store_root) / TRACES / run_id


def read_index(folder: Path) -> dict[str, Any]:
    p = folder / "index.json"
    return json.loads(p.read_text()) if p.is_file() else {"specs": {}, "files": {}}


@dataclass
class Example:
    """What a trace needs of one finished example: prompt ids ``[1, P]`` and the generated tokens."""

    prompt_ids: torch.Tensor
    tokens: list[int]


def trace_run(folder: Path, pair, examples: list[Example], subjects: list[Subject], settings: TraceSettings,
              meta: dict[str, Any], log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Trace every subject (in order: earlier subjects' argmax become later ones' candidates) over
    ``examples`` into ``folder``; returns one record per subject (``name``, ``seconds``, ``reused``).

    ``meta``: run facts stored in every file (``run_id``, ``max_new_tokens``, …). Files present
    are reused; examples traced by an interrupted attempt (``<name>.parts/``) are kept.
    """
    settings.validate()
    done: list[TraceFile] = []
    report = []
    with file_lock(folder / ".lock"):
        index = read_index(folder)
        for sub in subjects:
            name = sub.name(pair.name, settings)
            path = folder / f"{name}.npz"
            reused = path.is_file()
            t0 = time.perf_counter()
            if not reused:
                _trace_subject(path, pair, sub, examples, settings, done, meta, log)
            tf = TraceFile(path)
            done.append(tf)
            index["files"][path.name] = {k: tf.meta[k] for k in ("role", "layers", "seconds", "rows", "topk")}
            index["specs"].update({spec: path.name for spec in sub.specs})
            atomic_write_json(folder / "index.json", index)
            report.append({"name": name, "specs": sub.specs, "reused": reused, "rows": tf.meta["rows"],
                           "seconds": tf.meta["seconds"], "this_call_s": time.perf_counter() - t0})
    return report


def subjects_for(pair, slims: list = (), draft: bool = True, intermediate: bool = False,
                 selves: list = ()) -> list[Subject]:
    """What to trace for a pair, in order: the target, the draft (when asked and the pair has one),
    the intermediate model, one routed mask per distinct layer list among ``selves`` (``self``
    drafter layer lists, ``None`` = the pair's default plan) and ``slims`` (``SlimConfig``s);
    masks that resolve to the same layers share one subject (all their specs)."""
    subjects = [Subject("target", pair.target, None, ["target"])]
    if draft and pair.draft is not None:
        subjects.append(Subject("draft", pair.draft, None, ["draft"]))
    if intermediate or any(str(getattr(s, "mask", "")) == "independent" for s in slims):
        if pair.intermediate is None:
            raise ConfigError(f"pair {pair.name!r} has no intermediate model to trace (set pair.intermediate.id)")
        if pair.intermediate is pair.draft and len(subjects) == 2:  # one model in memory: one trace serves both
            subjects[1].specs.append("intermediate")
        else:
            subjects.append(Subject("intermediate", pair.intermediate, None, ["intermediate"]))
    masks: dict[tuple[int, ...], Subject] = {}
    for layers, spec in [*((lay, "self:default" if lay is None else None) for lay in selves),
                         *((None, s) for s in slims)]:
        if isinstance(spec, str) or spec is None:  # a self-drafter plan
            plan = self_drafter(pair, torch.zeros(1, 1, dtype=torch.long), DrafterConfig(name="self", layers=layers)
                                ).stream.plan
            specs = [spec] if spec else []
        else:
            key = slim_key(spec)
            if key in ("target", "intermediate"):
                continue
            _, plan, _ = resolve_plan(pair, spec)
            specs = [key]
        sub = masks.setdefault(plan.layers, Subject("mask", pair.target, plan, [layers_key(plan.layers)]))
        sub.specs += [x for x in specs if x not in sub.specs]
    return subjects + list(masks.values())


def _candidates(tokens: list[int], earlier: list[np.ndarray]) -> np.ndarray:
    """``[N, 1 + len(earlier)]``: the trajectory token and each earlier model's argmax per row."""
    return np.stack([np.asarray(tokens, dtype=np.int64), *[e.astype(np.int64) for e in earlier]], 1)


def _trace_subject(path: Path, pair, sub: Subject, examples: list[Example], settings: TraceSettings,
                   earlier: list[TraceFile], meta: dict[str, Any], log: Callable[[str], None]) -> None:
    parts = path.with_suffix(".parts")
    parts.mkdir(parents=True, exist_ok=True)
    seconds, shared, todo = 0.0, None, [ex.prompt_ids for i, ex in enumerate(examples)
                                         if not (parts / f"{i:05d}.npz").is_file()]
    if settings.share_prefix and (shared := prompt_prefix_kv(sub.model, sub.plan, todo)) is not None:
        seconds += shared.seconds  # fed once for the examples left to trace
        log(f"  {path.stem}: {shared.tokens.shape[1]} prompt tokens every example shares fed once "
            f"({shared.seconds:.1f} s)")
    rows: list[dict[str, np.ndarray]] = []
    for i, ex in enumerate(examples):
        shard = parts / f"{i:05d}.npz"
        if shard.is_file():
            with np.load(shard) as z:
                rows.append({k: z[k] for k in z.files if k != "meta"})
                seconds += float(json.loads(str(z["meta"]))["seconds"])
            continue
        cand = _candidates(ex.tokens, [tf.rows(i).argmax for tf in earlier])
        t0 = time.perf_counter()
        arrays = teacher_force(sub.model, sub.plan, ex.prompt_ids, ex.tokens, cand, settings, shared)
        dt = time.perf_counter() - t0
        _save(shard, arrays, {"seconds": dt})
        rows.append(arrays)
        seconds += dt
        log(f"  {path.stem}: example {i + 1}/{len(examples)} ({len(ex.tokens)} rows, {dt:.1f} s)")
    arrays = {k: np.concatenate([r[k] for r in rows]) for k in ROW_KEYS}
    arrays["offsets"] = _ragged([r["argmax"] for r in rows])[1]
    if sub.role == "target":  # the trajectory itself travels with the target's rows
        starts = [start_sequence(sub.model, ex.prompt_ids)[0].cpu().numpy() for ex in examples]
        arrays["tokens"] = np.concatenate([np.asarray(ex.tokens, dtype=np.int64) for ex in examples])
        arrays["prompt"], arrays["prompt_offsets"] = _ragged([ex.prompt_ids[0].cpu().numpy() for ex in examples])
        arrays["start"], arrays["start_offsets"] = _ragged(starts)
    try:
        layers = num_layers(sub.model)
    except ConfigError:  # an unroutable draft still traces; its forward is priced whole
        layers = None
    _save(path, arrays, {**meta, "version": TRACE_VERSION, "role": sub.role, "specs": sub.specs,
                         "layers": sub.layers, "n_layers": len(sub.plan.layers) if sub.plan else layers,
                         "settings": asdict(settings), "topk": settings.topk,
                         "temperatures": [float(t) for t in settings.temperatures],
                         "vocab": vocab_size_of(sub.model),
                         "cand_sources": [tf.path.name for tf in earlier], "rows": int(len(arrays["argmax"])),
                         "seconds": seconds, "examples": len(examples), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                         "prefix_tokens": int(shared.tokens.shape[1]) if shared is not None else 0,
                         "threads": torch.get_num_threads(), "pair": pair.name,
                         "runtime": {k: v for k, v in pair.extras.get("runtime", {}).items() if k != "dtype_probe"}})
    shutil.rmtree(parts, ignore_errors=True)
