"""Calibration text for DIMR and the KL geometry, and its teacher-forced statistics, streamed.

**Text.** In-domain (``search.calibration_runs``): the target's own outputs — each example of a
stored run (its prompt as the run rendered it, in the task's chat format, followed by the
generated token ids from ``examples.jsonl``), cut into ``seq_len`` windows from the end of each
example (so the generated text comes first), interleaved across examples. A run is named by
its id, its folder, or ``method:task`` (the finished run of this pair with that method and
task and the most examples in the run store; use a lossless method such as ``ar``). When none
is found the built-in prompts are used, with a warning. Otherwise the texts of
``search.calibration`` (built-in prompts and offline tasks) are tokenized and cut into chunks.
``held_out`` of the chunks (whole examples for in-domain text) are kept apart for the numbers
a table reports.

**Statistics, streamed.** :class:`Calibration` runs the target (and the draft) once per batch
and keeps only their final hidden states ``[B, L, H]``; full-vocabulary log-probs are rebuilt
from them per chunk of ``chunk_positions(V, stat_mib)`` positions while a mask is evaluated, and
reduced to sums at once — no batch's ``[B, L, V]`` log-probs stay allocated, and the peak is
what :func:`viasd.dimr.memory.calibration_peak_bytes` computes. Hidden states after layer
prefixes are memoized (LRU, at most ``memo_mib``), so candidates sharing a prefix of kept
sub-layers skip that compute. ``cache_mib > 0`` keeps the target's log-probs of as many chunks as
fit (a CPU speed-up: the head is ~15% of a forward; the memory formula counts them).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from viasd.dimr.margin import margin_rows
from viasd.engine.paths import embed, head, make_path, run_units
from viasd.engine.routing import RoutingPlan, num_layers
from viasd.errors import ConfigError
from viasd.tasks import build_task
from viasd.tracking.store import RunStores, file_sha256

log = logging.getLogger(__name__)

# Calibration sources by default: the built-in prompts and the offline tasks (those present).
CALIBRATION_SOURCES = ("builtin", "xsum", "cnndm", "wmt14_deen", "gsm8k", "squad", "nq_open", "humaneval", "mbpp")
MIB = 2**20
_MISSING: set[str] = set()


def kl_rows(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Per-position ``KL(a ‖ b)`` for log-probs ``[..., V]`` → ``[...]``; ``0 · log 0 = 0`` (rows of a
    widened head, ``−∞`` in ``a``, add nothing; ``a > 0`` where ``b = −∞`` gives ``+∞``)."""
    pa = logp_a.exp()
    terms = logp_a - logp_b
    terms.mul_(pa)
    terms.masked_fill_(pa == 0, 0.0)
    return terms.sum(-1)


def kl_sum(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """``Σ_positions KL(a ‖ b)`` for log-probs ``[..., V]`` → scalar (:func:`kl_rows` summed)."""
    return kl_rows(logp_a, logp_b).sum()


def kl(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Mean ``KL(a ‖ b)`` over all positions; inputs ``[..., V]`` log-probs → scalar (never NaN)."""
    return kl_sum(logp_a, logp_b) / max(1, logp_a[..., 0].numel())


def tv_sum(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """``Σ_positions TV(a, b)`` → scalar (``exp(−∞) = 0``: widened heads are fine)."""
    diff = logp_a.exp()
    diff.sub_(logp_b.exp())
    return 0.5 * diff.abs_().sum()


def tv(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Mean total-variation distance over positions → scalar."""
    return tv_sum(logp_a, logp_b) / max(1, logp_a[..., 0].numel())


def calibration_texts(sources: list[str], n: int, seed: int) -> list[str]:
    """About ``n`` calibration texts spread evenly over ``sources`` (interleaved).

    ``builtin`` is the built-in prompt set; other names are offline tasks, skipped with a
    warning when their data is missing (the built-in prompts are then used alone).
    """
    per = max(1, math.ceil(n / max(1, len(sources))))
    groups: list[list[str]] = []
    for src in sources:
        try:
            if src == "builtin":
                task = build_task({"name": "prompts", "path": None})
            else:
                task = build_task({"name": src, "n_examples": per, "seed": seed})
            groups.append([e.prompt for e in task.examples()][:per])
        except ConfigError as e:
            if src == "builtin" or len(sources) == 1:
                raise
            log.warning("DIMR calibration: skipping %s (%s)", src, e)
    texts = [t for row in itertools.zip_longest(*groups) for t in row if t is not None]
    return texts[:n]


def _started(run: dict[str, Any]) -> str:
    try:
        return str(json.loads((run["path"] / "meta.json").read_text()).get("started") or "")
    except (OSError, ValueError):
        return ""


def resolve_runs(selectors: list[str], pair_name: str, store_dir: str | Path) -> list[Path]:
    """Run folders for ``selectors`` (run ids, folders, or ``method:task``); unresolved ones are
    skipped with a warning.

    Run ids and ``method:task`` are looked up in the store ``store_dir`` and in the results store
    committed in the repository (:meth:`~viasd.tracking.store.RunStores.default`), so a fresh clone
    resolves them as the machine that made the committed searches did. ``method:task`` picks the
    finished run with the most examples, ties to the one started first: a later run of the same
    length does not change which text (and so which run id) a search has.
    """
    store, out = RunStores.default(store_dir), []
    finished = None
    where = " or ".join(str(s.root) for s in store.stores)

    def missing(message: str) -> None:
        if message not in _MISSING:  # once per process (identity, dry run and search all resolve)
            _MISSING.add(message)
            log.warning(message)

    for sel in selectors:
        sel = str(sel)
        path = Path(sel).expanduser()
        if (path / "examples.jsonl").is_file():
            out.append(path)
        elif (store.path(sel) / "examples.jsonl").is_file():
            out.append(store.path(sel))
        elif ":" in sel:
            method, task = sel.split(":", 1)
            finished = list(store.finished_runs()) if finished is None else finished
            hits = [r for r in finished if r["summary"].get("pair") == pair_name and r["summary"].get("method") == method
                    and r["summary"].get("task") == task and (r["path"] / "examples.jsonl").is_file()]
            if hits:
                most = max(r["summary"].get("n_examples", 0) for r in hits)
                out.append(min((r for r in hits if r["summary"].get("n_examples", 0) == most),
                               key=lambda r: (_started(r), r["run_id"]))["path"])
            else:
                missing(f"DIMR calibration: no finished {method} run of {pair_name} on {task} in {where}")
        else:
            missing(f"DIMR calibration: run {sel} not found (not a run folder nor a run id in {where})")
    return out


def calibration_inputs(cfg) -> dict[str, Any]:
    """``{"inputs": {"search.calibration_runs": {run: sha256 of its examples.jsonl}}}`` for a composed
    config whose search calibrates on stored runs, so its run id follows the runs it reads (``{}``
    otherwise: the ids of other searches stay)."""
    selectors = list(OmegaConf.select(cfg, "search.calibration_runs", default=None) or [])
    if not selectors:
        return {}
    dirs = resolve_runs(selectors, str(cfg.pair.name), str(cfg.tracking.store_dir))
    return {"inputs": {"search.calibration_runs": {d.name: file_sha256(d / "examples.jsonl") for d in dirs}}}


def run_rows(pair, run_dirs: list[Path]) -> list[list[int]]:
    """Token rows ``encode(prompt) + generated ids``, one per example of each run, interleaved by run."""
    per_run = []
    for d in run_dirs:
        rows = []
        for line in (d / "examples.jsonl").read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("prompt") and rec.get("token_ids") is not None:
                rows.append(pair.encode(rec["prompt"])[0].tolist() + [int(t) for t in rec["token_ids"]])
        per_run.append(rows)
    return [r for group in itertools.zip_longest(*per_run) for r in group if r is not None]


def text_chunks(tokenizer, texts: list[str], seq_len: int) -> list[list[int]]:
    """Texts of ``seq_len`` tokens or more give one chunk each; shorter ones are joined and cut."""
    ids, pool = [], []
    for t in texts:
        x = tokenizer(t, add_special_tokens=True).input_ids
        if len(x) >= seq_len:
            ids.append(x[:seq_len])
        else:
            pool += x
    ids += [pool[i:i + seq_len] for i in range(0, len(pool) - seq_len + 1, seq_len)]
    return [x for x in ids if len(x) >= 8]


def row_windows(row: list[int], seq_len: int) -> list[list[int]]:
    """Non-overlapping ``seq_len`` windows of one token row, from its end backwards."""
    return [row[end - seq_len:end] for end in range(len(row), seq_len - 1, -seq_len)]


def calibration_split(pair, cfg, store_dir: str | Path | None = None) -> tuple[list[list[int]], list[list[int]],
                                                                            dict[str, Any]]:
    """``(search chunks, held-out chunks, description)`` for a :class:`~viasd.dimr.search.SearchConfig`."""
    n, seq_len, frac = int(cfg.n_calibration), int(cfg.seq_len), float(cfg.held_out)
    rng = random.Random(cfg.seed)
    runs = resolve_runs(list(cfg.calibration_runs), pair.name, store_dir or "runs") if cfg.calibration_runs else []
    rows = run_rows(pair, runs) if runs else []
    if cfg.calibration_runs and not rows:
        warnings.warn(f"DIMR calibration: none of search.calibration_runs={list(cfg.calibration_runs)} has stored "
                      f"examples of pair {pair.name!r}; calibrating on the built-in prompts instead", stacklevel=2)
    if rows:
        rng.shuffle(rows)
        n_held = round(len(rows) * frac) if frac > 0 else 0
        if frac > 0:
            n_held = min(max(1, n_held), len(rows) - 1)
        groups = (rows[n_held:], rows[:n_held])
        want = (n - round(n * frac), round(n * frac))
        split = [[w for ws in itertools.zip_longest(*[row_windows(r, seq_len) for r in g]) for w in ws if w][:k]
                 for g, k in zip(groups, want)]
        info = {"kind": "runs", "runs": [str(d) for d in runs], "examples": len(rows), "held_out_examples": n_held}
    else:
        sources = list(cfg.calibration) if not cfg.calibration_runs else ["builtin"]
        chunks = text_chunks(pair.tokenizer, calibration_texts(sources, n, cfg.seed), seq_len)
        n_held = round(len(chunks) * frac)
        if frac > 0:
            rng.shuffle(chunks)
            n_held = min(max(1, n_held), len(chunks) - 1)
        split = [chunks[n_held:], chunks[:n_held]]
        info = {"kind": "texts", "sources": sources}
    if not split[0]:
        raise ConfigError("no calibration text of at least 8 tokens; set search.calibration or search.calibration_runs")
    return split[0], split[1], info


def chunk_positions(vocab: int, stat_mib: float) -> int:
    """Positions per statistics chunk: one ``[C, V]`` float32 tensor is at most ``stat_mib`` MiB."""
    return max(1, int(stat_mib * MIB) // (4 * vocab))


class Calibration:
    """Calibration batches with the target's (and draft's) final hidden states computed once.

    Args:
        pair: the model pair (its target is routed; its draft is read when ``need_draft``).
        chunks: token rows (cut to their common length, at most the longest).
        batch_size: rows per batch.
        need_draft: also keep the draft's hidden states (Pythagorean terms, KL geometry).
        memo_mib: bound of the memo of hidden states after layer prefixes.
        stat_mib: size of one ``[C, V]`` float32 statistics tensor (:func:`chunk_positions`).
        cache_mib: keep the target's log-probs of the first chunks while they fit in this many MiB
            (0: rebuild them from the hidden states for every mask — the streamed default).
    """

    def __init__(self, pair, chunks: list[list[int]], batch_size: int, need_draft: bool, memo_mib: float = 1024,
                 stat_mib: float = 64, cache_mib: float = 0):
        L = min(len(x) for x in chunks)
        self.pair, self.target = pair, pair.target
        self.batches = [torch.tensor([x[:L] for x in chunks[i:i + batch_size]], device=pair.device)
                        for i in range(0, len(chunks), batch_size)]
        self.n_tokens = sum(b.numel() for b in self.batches)
        self.enc_dec = bool(getattr(self.target.config, "is_encoder_decoder", False))
        self.draft = pair.draft if need_draft and pair.draft is not None else None
        self.memo: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self.memo_bytes, self.memo_limit = 0, memo_mib * MIB
        self.chunk = chunk_positions(self.target.get_output_embeddings().weight.shape[0], stat_mib)
        with torch.inference_mode():
            self.inputs = [self._inputs(self.target, b) for b in self.batches]
            self.target_hidden = [self._hidden(self.target, i, None) for i in range(len(self.batches))]
            self.draft_hidden = None if self.draft is None else [
                self._hidden(self.draft, i, None) for i in range(len(self.batches))]
            self.cached: dict[tuple[int, int], torch.Tensor] = {}
            room = cache_mib * MIB
            for i, h in enumerate(self.target_hidden):
                for start in range(0, h.shape[0] * h.shape[1], self.chunk):
                    q = self._logprobs(self.target, h.flatten(0, 1)[start:start + self.chunk])
                    room -= q.numel() * q.element_size()
                    if room < 0:
                        break
                    self.cached[(i, start)] = q

    def _inputs(self, model, batch: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(decoder input ids, encoder output)``: T5 encodes the batch and teacher-forces
        ``[start] + batch[:, :-1]``; decoder-only models read the batch itself."""
        if not getattr(model.config, "is_encoder_decoder", False):
            return batch, None
        enc = model.get_encoder()(input_ids=batch)
        start = torch.full_like(batch[:, :1], model.config.decoder_start_token_id)
        return torch.cat([start, batch[:, :-1]], 1), enc

    def _hidden(self, model, i: int, plan: RoutingPlan | None) -> torch.Tensor:
        """Final hidden states ``[B, L, H]`` (before the norm) of ``model`` routed by ``plan`` on batch
        ``i``; the target's hidden states after each prefix of units are memoized."""
        ids, enc = self.inputs[i] if model is self.target else self._inputs(model, self.batches[i])
        units = (plan or RoutingPlan.full(num_layers(model))).units()
        x = embed(model, ids)
        path = make_path(model, x, None, 0, units, enc)
        if model is not self.target:
            return run_units(path, units, x)
        hidden, start = x, 0
        for j in range(len(units), 0, -1):  # the longest memoized prefix of this plan's units
            key = (i, tuple(units[:j]))
            if key in self.memo:
                hidden, start = self.memo[key], j
                self.memo.move_to_end(key)
                break
        for j in range(start, len(units)):
            hidden = run_units(path, units[j:j + 1], hidden)
            self._remember((i, tuple(units[: j + 1])), hidden)
        return hidden

    def _remember(self, key: tuple, hidden: torch.Tensor) -> None:
        size = hidden.numel() * hidden.element_size()
        if size > self.memo_limit:
            return
        self.memo[key] = hidden
        self.memo_bytes += size
        while self.memo_bytes > self.memo_limit:
            _, old = self.memo.popitem(last=False)
            self.memo_bytes -= old.numel() * old.element_size()

    def _logprobs(self, model, hidden: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[C, V]`` float32 of ``hidden`` ``[C, H]`` through ``model``'s head."""
        logits = head(model, hidden.unsqueeze(0), hidden.shape[0])[0]
        return torch.log_softmax(logits.float(), -1)

    def hidden_rows(self, i: int, plan: RoutingPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Final hidden states ``[B·L, H]`` of the slim verifier ``plan``, the target and the draft
        (None without it) on batch ``i``."""
        draft = self.draft_hidden[i].flatten(0, 1) if self.draft_hidden is not None else None
        return self._hidden(self.target, i, plan).flatten(0, 1), self.target_hidden[i].flatten(0, 1), draft

    def logprobs(self, i: int, start: int, slim: torch.Tensor, target: torch.Tensor, draft: torch.Tensor | None):
        """``(q, q', p)`` log-probs ``[C, V]`` of batch ``i``'s chunk at ``start`` (``p`` None without the draft)."""
        rows = slice(start, start + self.chunk)
        q = self.cached.get((i, start))
        if q is None:
            q = self._logprobs(self.target, target[rows])
        qs = self._logprobs(self.target, slim[rows])
        return q, qs, (self._logprobs(self.draft, draft[rows]) if draft is not None else None)

    @torch.inference_mode()
    def statistics(self, plan: RoutingPlan, tau_slim: float = 0.6, tv_terms: bool = False,
                   per_text: bool = False, margin: tuple[float, float] | None = None) -> dict[str, Any]:
        """Means over calibration tokens for the slim verifier ``plan``: ``kl_q_slim`` = KL(q‖q'),
        ``top1_agreement``, ``confident_top1`` (agreement where max q' ≥ ``tau_slim``; 0 when it is
        never confident) and ``confident_share``; with the draft also ``kl_p_slim``, ``kl_slim_q``,
        ``kl_p_q`` (and the TV distances with ``tv_terms``). ``per_text`` (with the draft): also
        ``per_text = {kl_p_slim|kl_slim_q|kl_p_q: [mean over each calibration row's positions]}``,
        the sample an interval over texts resamples (rows have equal length, so their mean is the
        token mean). ``margin = (α, β)``: also ``margin``, the mean :func:`margin_rows`."""
        sums: dict[str, float] = {}
        n_rows = sum(int(b.shape[0]) for b in self.batches)
        text_sums: dict[str, torch.Tensor] = {}  # per_text: Σ over each calibration row's positions
        first_row = 0

        def add(key: str, value) -> None:
            sums[key] = sums.get(key, 0.0) + float(value)

        for i in range(len(self.batches)):
            slim, target, draft = self.hidden_rows(i, plan)
            per_row = slim.shape[0] // int(self.batches[i].shape[0])  # positions of one calibration row
            for start in range(0, slim.shape[0], self.chunk):
                q, qs, p = self.logprobs(i, start, slim, target, draft)
                add("kl_q_slim", kl_sum(q, qs))
                if margin is not None:
                    add("margin", margin_rows(q, qs, *margin).sum())
                agree = qs.argmax(-1) == q.argmax(-1)
                confident = qs.max(-1).values.exp() >= tau_slim
                add("top1_agreement", agree.sum())
                add("confident", confident.sum())
                add("confident_agree", (agree & confident).sum())
                if p is not None:
                    row = first_row + torch.arange(start, start + q.shape[0]) // per_row if per_text else None
                    # [C]-sized terms only: a loop variable bound to p or q would keep a [C, V] chunk alive
                    # past the `del` below (into the next chunk's peak)
                    for key, terms in (("kl_p_slim", kl_rows(p, qs)), ("kl_slim_q", kl_rows(qs, q)),
                                       ("kl_p_q", kl_rows(p, q))):
                        add(key, terms.sum())
                        if row is not None:
                            text_sums.setdefault(key, torch.zeros(n_rows, dtype=torch.float64)).index_add_(
                                0, row, terms.to("cpu", torch.float64))
                    if tv_terms:
                        add("tv_p_q", tv_sum(p, q))
                        add("tv_p_slim", tv_sum(p, qs))
                        add("tv_slim_q", tv_sum(qs, q))
                del q, qs, p, agree, confident  # before the next chunk is built: one chunk alive at a time
            first_row += int(self.batches[i].shape[0])
        out: dict[str, Any] = {k: v / self.n_tokens for k, v in sums.items() if k not in ("confident", "confident_agree")}
        if text_sums:  # every row has per_row positions (rows are cut to one length)
            out["per_text"] = {k: (v / per_row).tolist() for k, v in text_sums.items()}
        out["confident_share"] = sums["confident"] / self.n_tokens
        out["confident_top1"] = sums["confident_agree"] / sums["confident"] if sums["confident"] else 0.0
        return out

