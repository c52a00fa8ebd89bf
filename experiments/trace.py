"""``python -m experiments.trace run=<run id> [masks=[auto@0.8,every_other@0.5,…]] [draft=true] [intermediate=false]
[selves=[default]] [topk=32] [temperatures=[1.0]] [chunk=128] [share_prefix=true] [threads=1] [examples=N]
[runs_dir=…] [pair.KEY=V …]``

Teacher-forces the models of a finished run's pair along its outputs (``viasd.analysis.trace``):
the target always, the draft (``draft=true`` when the pair has one), the independent
intermediate (``intermediate=true``), the run's own slim mask and ``self``-drafter plan, and
every mask of ``masks`` — ``NAME[@KEEP][/OBJECTIVE|/seedN]`` with NAME one of ``auto`` (the DIMR
mask), ``random``, ``first_k``, ``every_other``, ``independent``, ``full``, or a list of kept
layers; ``selves`` adds ``self``-drafter plans (``default`` or a layer list). ``pair.KEY=V`` sets
values of the run's pair config, e.g. ``pair.intermediate.id=qwen2.5-coder-0.5b-instruct`` to trace
an independent intermediate a run's pair did not load (an intermediate that is the draft is traced
once, as the draft). The token prefix every prompt shares (few-shot exemplars) is fed once per model
and each example starts from its KV (``share_prefix=false``: every prompt fed whole). Files go to
``<store>/_traces/<run id>/``, are reused when present and resume after an interruption. Prints
each model's trace time against the run's own decode time. Then replay policies with
``python -m experiments.replay run=<run id> …``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
import yaml
from omegaconf import OmegaConf

from viasd.analysis.paired import resolve_run_id
from viasd.analysis.trace import Example, TraceSettings, subjects_for, trace_dir, trace_run
from viasd.config import to_dataclass
from viasd.errors import ConfigError, one_line_errors
from viasd.methods.api import method_config
from viasd.methods.via_sd import SlimConfig
from viasd.models.pairs import MASK_OPTIONS
from viasd.paths import PROJECT_ROOT, runs_dir
from viasd.tracking.store import RunStores


@dataclass
class TraceArgs:
    """The command's ``key=value`` arguments."""

    run: str = ""
    masks: list[Any] = field(default_factory=list)
    draft: bool = True
    intermediate: bool = False
    selves: list[Any] = field(default_factory=list)
    topk: int = 32
    temperatures: list[float] = field(default_factory=lambda: [1.0])
    chunk: int = 128
    share_prefix: bool = True
    threads: int = 1
    examples: int | None = None
    runs_dir: str | None = None
    pair: dict[str, Any] = field(default_factory=dict)


def parse_args(argv: list[str], schema: type) -> Any:
    """``key=value`` arguments into ``schema`` (unknown keys and wrong types: one ConfigError line)."""
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise ConfigError(f"arguments are key=value (got {bad[0]!r}); see `python -m {schema.__module__} --help`")
    return to_dataclass(schema, OmegaConf.to_container(OmegaConf.from_dotlist(argv)), where="")


def argv_or_help(argv: list[str] | None, doc: str) -> list[str] | None:
    """The command's arguments, or None after printing ``doc`` for ``-h``/``--help``."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(doc)
        return None
    return argv


def parse_mask(item: Any, default_keep: float) -> SlimConfig:
    """``NAME[@KEEP][/OBJECTIVE|/seedN]`` or a layer list → a :class:`SlimConfig`."""
    if isinstance(item, (list, tuple)):
        return SlimConfig(mask=[int(i) for i in item])
    name, _, rest = str(item).partition("/")
    name, _, keep = name.partition("@")
    cfg = SlimConfig(mask=name, keep_ratio=float(keep) if keep else default_keep)
    if rest.startswith("seed"):
        cfg.seed = int(rest[4:])
    elif rest:
        cfg.objective = rest
    return cfg


def pair_config(stored: dict[str, Any], overrides: dict[str, Any] | None = None):
    """The run's pair config: its ``conf/pair`` file (shipped masks included) under the stored values,
    under ``overrides`` (the command's ``pair.KEY=V``)."""
    base = PROJECT_ROOT / "conf" / "pair" / f"{stored.get('name')}.yaml"
    node = OmegaConf.load(base) if base.is_file() else OmegaConf.create({})
    return OmegaConf.merge(node, stored, overrides or {})


def own_models(method: dict[str, Any]) -> tuple[list[SlimConfig], list[Any], list[float]]:
    """The slim mask, ``self`` plans and gate temperature the run's own method reads."""
    cfg = method_config(method["name"], method)
    slims = cfg.slims() if hasattr(cfg, "slims") else [cfg.slim] if hasattr(cfg, "slim") else []  # every verifier
    drafter = getattr(cfg, "drafter", None)
    names = {drafter.name} if drafter is not None else set()
    for lv in getattr(cfg, "levels", None) or []:
        names |= {lv.name, *lv.vertical}
    selves = [drafter.layers] if "self" in names else []
    temps = [float(cfg.gate_temperature)] if hasattr(cfg, "gate_temperature") else []
    return slims, selves, temps


def main(argv: list[str] | None = None) -> int:
    from viasd.models.pairs import load_pair
    from viasd.tasks import build_task

    argv = argv_or_help(argv, __doc__)
    if argv is None:
        return 0
    with one_line_errors():
        args = parse_args(argv, TraceArgs)
        if not args.run:
            raise ConfigError("name the finished run to trace: run=<run id> (its folder name in the run store)")
        if args.pair and {"target", "name", "tokenizer"} & set(args.pair):
            raise ConfigError("trace pair.KEY=V may add or change the draft and intermediate models, not the target, "
                              "tokenizer or pair name: the trajectory is the run's target's (trace a run decoded with "
                              "that target instead)")
        torch.set_num_threads(int(args.threads))
        store = RunStores.default(args.runs_dir or runs_dir())  # traces are written into the first (the user's)
        args.run = resolve_run_id(store, args.run)
        cfg = yaml.safe_load((store.path(args.run) / "config.yaml").read_text())
        records = store.examples(args.run)[: args.examples]
        slims, selves, temps = own_models(cfg["method"])
        keep = float((cfg["method"].get("slim") or {}).get("keep_ratio", 0.8))
        slims += [parse_mask(m, keep) for m in args.masks]
        selves += [None if s == "default" else list(s) for s in args.selves]
        gen = cfg.get("generation") or {}
        temperature = float(gen.get("temperature") or 0.0)
        settings = TraceSettings(args.topk, sorted({*map(float, args.temperatures), *temps,
                                                    *([temperature] if temperature > 0 else [])}), args.chunk,
                                 args.share_prefix)
        settings.validate()
        import transformers

        transformers.logging.set_verbosity_error()
        stored = (cfg["pair"].get("options") or {}) if cfg["pair"].get("loader") == "smollm2" else {}
        if stored.get("draft") == "trained":  # the run's own draft: the one its id names, or none
            from viasd.distill.pair import DRAFT_PROMPTS, check_draft_prompts

            check_draft_prompts({k: v for k, v in stored.items() if k not in MASK_OPTIONS and k != DRAFT_PROMPTS},
                                stored.get(DRAFT_PROMPTS))
        pair = load_pair(pair_config(cfg["pair"], args.pair))
        if pair.draft is None and any(a.split("=", 1)[0] == "draft" for a in argv) and args.draft:
            raise ConfigError(
                f"draft=true: run {args.run}'s pair {pair.name!r} loads no draft model, so there is none to trace; "
                "add one with pair.options.draft=trained (smollm2: the distilled draft, built once, 12–21 min on 2 "
                "cores) or pair.draft.id=<hub id or folder>, or replay a model-free drafter without it "
                "(method.drafter.name=ngram)")
        max_new = gen.get("max_new_tokens") or build_task(cfg["task"]).max_new_tokens
        examples = [Example(pair.encode(r["prompt"]), list(r["token_ids"])) for r in records]
        subjects = subjects_for(pair, slims, args.draft, args.intermediate, selves)
        meta = {"run_id": args.run, "max_new_tokens": int(max_new), "temperature": temperature,
                "top_k": int(gen.get("top_k") or 0), "top_p": float(gen.get("top_p") or 1.0),
                "encoder_decoder": pair.is_encoder_decoder, "method": cfg["method"].get("name"),
                "task": (cfg.get("task") or {}).get("name")}
        folder = trace_dir(store.root, args.run)
        t0 = time.perf_counter()
        report = trace_run(folder, pair, examples, subjects, settings, meta)
    decode_s = sum(float(r.get("wall_s") or 0.0) for r in records)
    rows = [[r["name"], ", ".join(r["specs"]), r["rows"], "reused" if r["reused"] else f"{r['seconds']:.1f}",
             f"{r['seconds'] / decode_s:.3f}" if decode_s else "–"] for r in report]
    print(pd.DataFrame(rows, columns=["trace", "specs", "rows", "trace s", "trace s / run's decode s"]
                       ).to_markdown(index=False))
    print(f"\n{len(examples)} examples, {sum(len(e.tokens) for e in examples)} positions; the run decoded them in "
          f"{decode_s:.1f} s; this call {time.perf_counter() - t0:.1f} s. Traces in {folder}")
    print(f"next: python -m experiments.replay run={args.run} method=… (or grid=conf/replay/<grid>.yaml)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
