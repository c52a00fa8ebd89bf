"""Run one configured experiment: load the pair and task, decode every example, log, summarize.

:func:`run` is what ``python -m experiments.run`` calls after Hydra composes the config; it is
also what experiment grids call per cell. It writes a run folder to the local run store (and
W&B when enabled), skips a run whose identical config *and input files* already finished, and
returns the summary dict. A run's identity (:func:`identity`) is the resolved config plus the
SHA-256 of every input file it reads (prompt/data file, DIMR mask artifact); its summary
records the slim mask actually used, the speedup over the ``ar`` run of the identical workload
(when that run is in the store) and the sweep objective ``speedup_at_quality``.

A run's lifecycle in the store is :class:`Cell` (also what :mod:`viasd.harness.interleave`
drives for several runs at once):

1. a finished run that proves itself (:mod:`viasd.tracking.proof`) is returned as it is;
2. the run's lock is taken (:mod:`viasd.tracking.lock`). When another process holds it, a single
   run waits for it, saying in one line who holds it; a cell of a grid (after
   :func:`defer_locked_runs`) is skipped with that line and done at the grid's end
   (:func:`run_deferred`), by which time the other process has usually finished it — so two
   identical grids on one store share their cells instead of decoding each twice;
3. under the lock the finished check is repeated, an invalid folder at the run's id is set aside
   (its files moved to ``<store>/_invalid/``), and the complete records of an interrupted attempt
   are kept as the first examples;
4. examples are decoded and appended one by one; the summary is written last.

A full disk is one :class:`~viasd.tracking.store.StoreFull` line; the later cells of a grid on
the same store then fail at once without a line of their own (the grid lists them).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from viasd.config import GenerationConfig, to_dataclass
from viasd.errors import RunInterrupted
from viasd.harness.identity import (  # noqa: F401  (re-exported: what names a run)
    _prepare,
    cached_pair,
    identity,
    input_files,
    slim_mask_used,
)
from viasd.harness.prereq import require_decodable, require_mask
from viasd.harness.summary import (  # noqa: F401  (aggregate, EXAMPLE_ONLY, SUMMARY_KEYS: re-exported)
    EXAMPLE_ONLY,
    SUMMARY_KEYS,
    aggregate,
    ar_command,
    cut_off_warning,
    matched_speedups,
    print_summary,
)
from viasd.methods.api import METHODS, decode, method_config, warm_up
from viasd.paths import data_dir
from viasd.tasks import build_task
from viasd.tasks.length import fit_examples
from viasd.tracking.baseline import tier_shares
from viasd.tracking.proof import INVALID
from viasd.tracking.store import RunStore, StoreFull, run_id_for
from viasd.tracking.wandb_logger import WandbLogger, labels_for, upload_finished
from viasd.utils.fs import jsonable

log = logging.getLogger(__name__)

def claim(store: RunStore, lock, run_id: str, wait: bool) -> bool:
    """Take a run's lock; when another process holds it, say who in one line and wait (``wait``) or
    return False (a grid comes back to the run at its end)."""
    if store.claim(lock, wait=False):
        return True
    who = lock.describe()
    if not wait:
        print(f"[viasd] {run_id}: being written by {who}; coming back to it at the end of the grid")
        return False
    print(f"[viasd] {run_id}: being written by {who}; waiting for it to finish (Ctrl-C stops waiting)")
    return store.claim(lock, wait=True)


def set_aside_invalid(store: RunStore, run_id: str) -> None:
    """Under the run's lock: move the files of an invalid folder at ``run_id`` to ``<store>/_invalid/``."""
    v = store.verdict(run_id)
    if v is not None and v.state == INVALID:
        where = store.set_aside(run_id, v.reason)
        print(f"[viasd] {run_id}: the folder there was no valid run ({v.reason}); moved to {where}")


def command_line() -> list[str] | None:
    """The Hydra overrides of the running job (None outside a Hydra app)."""
    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def identity_of(overrides: list[str]) -> dict[str, Any]:
    """The identity config ``overrides`` compose to (inside or outside a Hydra app)."""
    if not GlobalHydra.instance().is_initialized():
        raise RuntimeError("no Hydra config search path")
    return identity(compose(config_name="config", overrides=overrides))


class Cell:
    """One run of a composed config through its lifecycle in the store (see the module doc)."""

    def __init__(self, cfg: DictConfig):
        """Validate ``cfg`` (method, task, generation) and name its run; nothing is loaded or written."""
        self.cfg = cfg
        self.method = str(cfg.method.name)
        self.mcfg = method_config(self.method, cfg.method)  # validates before anything expensive
        self.task = build_task(cfg.task)
        self.task.preflight()  # e.g. code tasks refuse now, not after generation, when no sandbox is available
        require_mask(cfg)  # mask: auto with no searched mask refuses now, before any model is loaded
        require_decodable(cfg)  # gate=oracle, a gate of another pair, compile with a routed stream: no folder made
        gen_cfg = OmegaConf.to_container(cfg.generation, resolve=True)
        if gen_cfg.get("max_new_tokens") is None:
            gen_cfg["max_new_tokens"] = int(self.task.max_new_tokens)
        self.gen = to_dataclass(GenerationConfig, gen_cfg)
        self.gen.validate()
        self.resolved = identity(cfg)
        self.run_id = run_id_for(self.resolved)
        self.store = RunStore(cfg.tracking.store_dir)
        self.path = self.store.path(self.run_id)
        self.lock = self.store.lock(self.run_id)
        self.labels = labels_for(self.resolved)
        self.run_dir, self.wb, self.mask = None, None, None
        self.results: list[dict[str, Any]] = []
        self.predictions: list[str] = []
        self.reused, self.elapsed = 0, 0.0

    def done(self) -> dict[str, Any] | None:
        """The summary of this run when it is finished and proves itself (and ``skip_finished``)."""
        if not self.cfg.tracking.get("skip_finished", True):
            return None
        found = self.store.find(self.run_id)
        if found is None:
            return None
        print(f"[viasd] {self.run_id}: already finished in {found['path']}, skipping")
        upload_finished(self.cfg.tracking, found["path"])
        return found["summary"]

    def claim(self, wait: bool) -> bool:
        """Take the run's lock (see :func:`claim`)."""
        return claim(self.store, self.lock, self.run_id, wait)

    def release(self) -> None:
        """Give up the lock (a folder left with nothing but its lock is removed)."""
        self.lock.release()
        self.store.drop_if_empty(self.run_id)

    def open(self, examples: list, live_wandb: bool = True, pair=None) -> None:
        """Under the lock, once the pair is loaded (``pair``; default: this cell's cached pair): set
        an invalid folder aside, keep an interrupted attempt's complete records that prove
        themselves (:meth:`proven_records`), write the folder's first files (a full disk fails
        here) and start W&B (``live_wandb``; else the run is logged to W&B from its folder when it
        finishes)."""
        set_aside_invalid(self.store, self.run_id)
        reuse = self.proven_records(examples, pair)
        files, data = input_files(self.cfg), data_dir(required=False)
        meta = {"inputs": {k: {"path": str(p), "sha256": self.resolved["inputs"][k]} for k, p in files.items()},
                "data_dir": str(data) if data else None, "threads": torch.get_num_threads()}
        hub = self.task.hub_record()  # the commit and file hashes the hub path read (a branch may move)
        if hub is not None:
            meta["task_hub"] = hub
        self.run_dir = self.store.open(self.run_id, self.resolved, meta, resume=reuse)
        if reuse:
            print(f"[viasd] {self.run_id}: resuming after {len(reuse)} examples an interrupted attempt finished")
        if live_wandb:
            self.wb = WandbLogger(self.cfg.tracking, self.resolved, self.run_id, **self.labels)
        self.results = [{k: r[k] for k in r if k not in EXAMPLE_ONLY} for r in reuse]
        self.predictions = [r["prediction"] for r in reuse]
        self.reused = len(reuse)

    def proven_records(self, examples: list, pair=None) -> list[dict[str, Any]]:
        """The records an interrupted attempt at this run finished that a resume keeps (same run id
        = same config and inputs): the prefix in task order whose checksum chain holds
        (:meth:`RunStore.resumable <viasd.tracking.store.RunStore.resumable>`) and whose every record
        is its example's (id, prompt, reference) and its own tokens' (``raw_output`` decodes from
        ``token_ids``, ``prediction`` is the task's reading of it, ``new_tokens`` counts them). The
        first record that does not prove itself, and every one after it, is decoded again (one line)."""
        records, why = self.store.resumable(self.run_id)
        if not records and not why:
            return []
        tokenizer = (pair if pair is not None else cached_pair(self.cfg.pair)).tokenizer
        reuse: list[dict[str, Any]] = []
        for ex, rec in zip(examples, records):
            problem = record_problem(rec, ex, self.task, tokenizer)
            if problem:
                why = f"record {len(reuse) + 1} ({problem})"
                break
            reuse.append(rec)
        if why:
            print(f"[viasd] {self.run_id}: the interrupted attempt's {why}: kept {len(reuse)} records, "
                  "decoding the rest again")
        return reuse

    def attach(self, pair) -> None:
        """Once the pair is loaded: the task's stop strings, the pair's runtime and the slim mask used."""
        if not self.gen.stop_strings:
            self.gen.stop_strings = list(self.task.stop_strings_for(pair.tokenizer))
        self.mask = slim_mask_used(pair, self.mcfg, self.resolved["inputs"])
        self.run_dir.update_meta(runtime=pair.extras.get("runtime", {}),
                                 **({"slim_mask": self.mask} if self.mask is not None else {}))

    def warm_up(self, pair, examples: list) -> None:
        """One untimed short decode: one-time costs stay out of the timed examples."""
        if examples:
            warm_up(pair, pair.encode(self.task.render(examples[0], pair.tokenizer)), self.method, self.mcfg, self.gen)

    def decode(self, pair, i: int, ex, **extra: Any):
        """Decode example ``i`` and append its record (``extra`` fields added); returns the result."""
        t0 = time.perf_counter()
        text = self.task.render(ex, pair.tokenizer)
        c0 = time.process_time()
        res = decode(pair, pair.encode(text), self.method, self.mcfg, self.gen, seed=int(self.cfg.seed) + i)
        cpu_s = time.process_time() - c0  # CPU seconds of this process: descheduling and VM pauses do not count
        pred = self.task.postprocess(res.text)
        self.results.append(res.summary())
        self.predictions.append(pred)
        record = {"id": ex.id, "prompt": text, "prediction": pred, "raw_output": res.text,
                  "reference": ex.reference, "token_ids": res.tokens, **extra, **res.summary(), "cpu_s": cpu_s}
        if res.rounds and len(res.rounds) == res.counters.rounds:  # tokens per round: Spec-Bench's accept lengths
            record["accept_lengths"] = [int(r.emitted) for r in res.rounds]
        self.run_dir.log_example(record)
        if self.wb is not None:
            self.wb.log_example(i, record)
        self.elapsed += time.perf_counter() - t0
        return res

    def finish(self, pair, examples: list) -> dict[str, Any]:
        """Score the predictions, write the summary (with the speedup over the matched ``ar`` run), log W&B."""
        corpus, per_example = self.task.score(self.predictions, examples)
        scoring = self.task.scoring_meta()  # e.g. the sandbox's isolation level: meta.json, sealed below
        if scoring:
            self.run_dir.update_meta(**scoring)
        summary = {"method": self.labels["job_type"], "method_impl": self.method, "pair": pair.name,
                   "task": self.task.name, "n_examples": len(examples), "run_id": self.run_id,
                   "seed": int(self.cfg.seed), "total_s": self.elapsed, "resumed_examples": self.reused,
                   "lossless": METHODS.get(self.method).lossless, **aggregate(self.results),
                   **{f"runtime/{k}": v for k, v in pair.extras.get("runtime", {}).items() if k != "dtype_probe"},
                   **{f"metric/{k}": v for k, v in corpus.items()}}
        if self.mask is not None:
            summary.update({"slim_mask/layers": self.mask["layers"], "slim_mask/source": self.mask["source"],
                            "slim_mask/sha256": self.mask["sha256"]})
        if summary.get("tier1_accepted") or summary.get("escalations") or summary.get("tier2_regenerated"):
            summary.update({f"tier_share/{k}": v for k, v in tier_shares(summary).items()})
        summary.update(matched_speedups(summary, self.resolved, self.store,
                                        float(self.cfg.tracking.get("quality_delta", 1.0))))
        summary = self.run_dir.finish(summary, per_example)
        cut = cut_off_warning([int(r.get("new_tokens") or 0) for r in self.results], int(self.gen.max_new_tokens),
                              bool(corpus))
        if cut:
            print(f"[viasd] {self.run_id}: {cut}", file=sys.stderr)
        if self.wb is not None:
            self.wb.log_run(summary, self.path)
            self.wb.finish()
        else:
            upload_finished(self.cfg.tracking, self.path)
        return summary

    def abort(self, error: BaseException | None = None) -> None:
        """Leave the run unfinished (its complete examples stay for the next attempt); after a full
        disk (``error``), a folder without a single example is removed."""
        if self.run_dir is not None:
            self.run_dir.abort()
            if isinstance(error, StoreFull) and not self.run_dir.records:
                self.store.discard(self.run_id)
        if self.wb is not None:
            self.wb.finish(failed=True)

    def ar_hint(self) -> str | None:
        """The command that creates this run's matched ``ar`` run (checked by composing it), if one is found."""
        return ar_command(command_line(), self.resolved, identity_of)


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(jsonable(value)))


def record_problem(rec: dict[str, Any], ex, task, tokenizer) -> str:
    """Why a stored example record is not the decode of example ``ex`` it claims to be ("" when it
    is): its id, prompt and reference are the example's, ``new_tokens`` counts its ``token_ids``,
    ``raw_output`` is their decoding and ``prediction`` the task's reading of that."""
    tokens = rec.get("token_ids")
    if rec.get("id") != ex.id:
        return f"is of example {rec.get('id')!r}, not {ex.id!r}"
    if rec.get("prompt") != task.render(ex, tokenizer):
        return "its prompt is not the example's"
    if _as_json(rec.get("reference")) != _as_json(ex.reference):
        return "its reference is not the example's"
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        return "its token_ids are not a list of token ids"
    if rec.get("new_tokens") != len(tokens):
        return f"new_tokens {rec.get('new_tokens')!r} is not its {len(tokens)} token ids"
    if rec.get("raw_output") != tokenizer.decode(tokens, skip_special_tokens=True):
        return "its raw_output is not the decoding of its token ids"
    if rec.get("prediction") != task.postprocess(rec["raw_output"]):
        return "its prediction is not the task's reading of its raw_output"
    return ""


#: Stores that hit a full disk in this process (later runs on them fail at once).
FULL_STORES: set[Path] = set()
#: Grid cells another process was writing when their turn came (None: not in a grid; wait instead).
_DEFERRED: list[DictConfig] | None = None


def defer_locked_runs() -> None:
    """From now on (a grid in this process), a run another process is writing is skipped and kept for
    :func:`run_deferred` instead of waited for."""
    global _DEFERRED
    _DEFERRED = []


def run_deferred(runner, label) -> list[str]:
    """Run the deferred cells with ``runner`` (waiting for their locks); returns the ``label`` of each
    that failed (one line each: a ConfigError's message)."""
    global _DEFERRED
    cells, _DEFERRED = _DEFERRED or [], None
    failed = []
    for cfg in cells:
        try:
            out = runner(cfg)
        except Exception as e:  # noqa: BLE001  (one failing cell never stops the others)
            print(f"error in {label(cfg)}: {e}", file=sys.stderr)
            out = {"failed": label(cfg)}
        if isinstance(out, dict) and out.get("failed"):
            failed.append(label(cfg))
    return failed


def run(cfg: DictConfig) -> dict[str, Any]:
    """Execute the run described by a composed config; returns its summary (``{"deferred": run_id}``
    for a grid cell another process is writing, ``{"failed": …}`` on a store that is full)."""
    _prepare(cfg)
    cell = Cell(cfg)
    if cell.store.root in FULL_STORES:
        return {"failed": cell.run_id, "reason": "the run store is full"}
    done = cell.done()
    if done is not None:
        return done
    try:
        if not cell.claim(wait=_DEFERRED is None):
            _DEFERRED.append(cfg)
            return {"deferred": cell.run_id}
        try:
            done = cell.done()  # another process may have finished it while this one waited
            summary = done if done is not None else _decode_all(cell)
        finally:
            cell.release()
    except StoreFull:
        FULL_STORES.add(cell.store.root)
        raise
    if done is None:
        print_summary(summary, cell.path, None if summary.get("ar_run_id") else cell.ar_hint())
    return summary


def _decode_all(cell: Cell) -> dict[str, Any]:
    examples = cell.task.examples()
    pair = cached_pair(cell.cfg.pair)
    examples = fit_examples(cell.task, examples, pair, cell.gen.max_new_tokens)  # over-long prompts: refused or cut
    cell.open(examples, pair=pair)
    try:
        cell.attach(pair)
        cell.warm_up(pair, examples)
        bar = tqdm(examples, desc=f"{cell.labels['job_type']} on {pair.name}/{cell.task.name}", unit="ex",
                   file=sys.stderr)
        for i, ex in enumerate(bar):
            if i < cell.reused:
                continue
            res = cell.decode(pair, i, ex)
            rej = res.rejection_rate  # NaN for a method that drafts nothing (ar): left off the bar
            bar.set_postfix(tok_s=f"{res.tokens_per_s:.1f}", **({} if rej != rej else {"rej": f"{rej:.2f}"}))
        return cell.finish(pair, examples)
    except KeyboardInterrupt as e:
        cell.abort()
        raise RunInterrupted(cell.path) from e
    except BaseException as e:
        cell.abort(e)
        if isinstance(e, SystemExit):  # whoever called sys.exit: an unfinished run never ends with its status
            raise RuntimeError(f"sys.exit({e.code!r}) was called during the run; {cell.path} is unfinished") from e
        raise

