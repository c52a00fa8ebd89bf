"""``python -m experiments.bench [pair=…] [methods=[ar,sd,hf_assisted]] [gamma=4] [variants=…]``

Prints a Markdown table of speed ratios against ``ar`` and writes JSON (``out=``). Speed
goals live here, never in timed unit tests. Use 1 torch thread (``threads=1``).

``python -m experiments.bench --cost-curve [pair=…] [curve.backends=[eager,packed]] [curve.out=…]``
instead prints, per model of the pair (draft, slim verifier at ``curve.keep_ratio``, target) and
per backend, the forward time for 1..``curve.ks`` new tokens after ``curve.context`` cached ones as
ratios t(k)/t(1), and the bandwidth floor; JSON goes to ``curve.out`` (default: the run store).
It also measures the pair's *cost model* once per machine, pair and runtime (``curve.cost``:
``t(n, context)`` per model on a grid, routed passes fitted per layer, the cost of an extra
logits row) into ``<curve.store>/_cost/``, which every replayed policy and ``experiments.compare``
price forward calls with (``viasd.analysis.cost``); ``curve.cost.remeasure=true`` measures again.
With ``curve.tier_paths`` (default) it then prints the per-round cost of each VIA-SD tier path
(tier-1-only, tier-2, escalating with separate caches and with the shared prefix) in target-forward
units for the slim verifier ``curve.slim`` at ``curve.keep_ratio`` (JSON: ``curve.tier_out``).

``python -m experiments.bench --sandbox [sandbox_opts.n_samples=6] [sandbox_opts.reps=3] [sandbox_opts.workers=2]``
instead times the code sandbox: canonical HumanEval samples (synthetic ones without the data folder)
scored at each isolation level this process runs (root namespaces as root, rootless namespaces as
another user, unsafe as the floor), per sample and in samples/s, as ratios to the floor (:mod:`viasd.harness.sandbox_bench`;
JSON: ``sandbox_opts.out``). No model is loaded.

``python -m experiments.bench --custom-generate [pair=…] [n_prompts=3] [max_new_tokens=64] [custom_generate_opts.methods=[ar,sd,cascade_sd,sd_ngram]]``
instead times transformers' greedy ``model.generate(do_sample=False)`` of the pair's target against
``model.generate(custom_generate=<this checkout>, trust_remote_code=True, assistant_model=draft, viasd_method=M)``
per method, per prompt (HumanEval with the offline data folder, else the built-in prompts, each in the
chat template as the tasks render it): token-for-token equality with the greedy output, wall time,
tokens/s and the speedup over greedy ``generate`` (:mod:`viasd.harness.custom_generate_bench`; JSON:
``custom_generate_opts.out``).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from viasd.errors import ConfigError, one_line_errors


def load_prompts(spec: str, n: int, tokenizer=None) -> list[str]:
    """Benchmark prompts: the built-in set, a task's examples, or a prompt file."""
    from viasd.tasks import build_task

    if spec == "builtin":
        task = build_task({"name": "prompts", "path": None})
    elif spec.endswith((".jsonl", ".txt")):
        task = build_task({"name": "prompts", "path": spec})
    else:
        task = build_task({"name": spec, "n_examples": n})
    exs = task.examples()
    out = [task.render(e, tokenizer) for e in exs]
    while len(out) < n:  # cycle a short set
        out += out[: n - len(out)]
    return out[:n]


def random_pair(model_kwargs: DictConfig, backend: str):
    """A target-only pair around a randomly initialized causal LM built from transformers config
    kwargs (``model_type`` plus sizes; fp32, CPU) — cost curves of models too big to download."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from viasd.models.backend import apply_backend
    from viasd.models.pairs import ModelPair

    kw = OmegaConf.to_container(model_kwargs, resolve=True)
    mcfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mcfg, dtype=torch.float32).eval()
    apply_backend(model, backend)
    name = f"random-{mcfg.model_type}-{mcfg.num_hidden_layers}L-{mcfg.hidden_size}"
    return ModelPair(name=name, target=model, draft=None, tokenizer=None,
                     extras={"runtime": {"dtype": "float32", "backend": backend, "dtype_probe": None},
                             "slim_fallback": "every_other"})  # random weights: nothing to search a mask on


def run_cost_curve(cfg: DictConfig) -> None:
    """The ``--cost-curve`` mode. With ``curve.interleave`` each backend gets its own copy of
    the pair's models and all are timed interleaved (memory × backends); otherwise the pair is
    measured eager, packed in place, and measured again."""
    import copy

    import torch

    from viasd.harness.bench import cost_curve_rows, curve_columns, format_table, read_bandwidth, write_json
    from viasd.models.backend import apply_backend, resolve_backend
    from viasd.models.pairs import load_pair

    c = cfg.curve
    backends = [resolve_backend(str(b), cfg.pair.device) for b in c.backends]
    if "eager" in backends[1:]:
        raise ConfigError("curve.backends: list eager first (the other backends are built from it)")
    ks = list(range(1, int(c.ks) + 1))
    if c.get("random_model"):
        pair = random_pair(c.random_model, backends[0])
    else:
        pair = load_pair(cfg.pair, backend=backends[0])
    bandwidth = read_bandwidth(clock=str(c.clock))

    def variant(backend):
        p = copy.copy(pair) if c.interleave else pair
        if c.interleave:
            models = (pair.target, pair.draft, pair.intermediate)
            p.target, p.draft, p.intermediate = (copy.deepcopy(m) for m in models)
        for m in (p.target, p.draft, p.intermediate):
            apply_backend(m, backend)
        return p

    args = (bandwidth, ks, int(c.context), int(c.reps), float(c.keep_ratio), str(c.clock))
    runs_backend = resolve_backend(str(OmegaConf.select(cfg, "pair.backend", default="auto")),  # what runs use
                                   OmegaConf.select(cfg, "pair.device", default="cpu"))
    if c.interleave:
        by_backend = {b: pair if i == 0 else variant(b) for i, b in enumerate(backends)}
        rows = cost_curve_rows(by_backend, *args)
        if runs_backend in by_backend:
            store_cost_model(cfg, by_backend[runs_backend], runs_backend)
    else:
        rows = []
        for i, b in enumerate(backends):
            p = pair if i == 0 else variant(b)  # packed in place: measure the cost model while it is b
            rows += cost_curve_rows({b: p}, *args)
            if b == runs_backend:
                store_cost_model(cfg, p, b)
    print(f"\npair={pair.name} dtype={pair.extras['runtime']['dtype']} threads={torch.get_num_threads()} "
          f"context={c.context} reps={c.reps} clock={c.clock} interleaved={c.interleave} "
          f"read bandwidth={bandwidth / 1e9:.1f} GB/s")
    print(format_table(rows, curve_columns(ks)))
    write_json(c.out, rows, {"pair": OmegaConf.to_container(cfg.pair, resolve=True), "context": c.context,
                             "reps": c.reps, "clock": c.clock, "interleaved": c.interleave,
                             "read_bandwidth_Bps": bandwidth,
                             "dtype": pair.extras["runtime"]["dtype"]})
    print(f"wrote {c.out}")
    if c.get("tier_paths"):
        run_tier_paths(cfg, pair, backends[0] if c.interleave else backends[-1])


def run_tier_paths(cfg: DictConfig, pair, backend: str) -> None:
    """The ``--cost-curve`` rows of VIA-SD's tier paths (:mod:`viasd.harness.tier_cost`): per-round
    cost of each path in target-forward units, JSON to ``curve.tier_out``."""
    import torch

    from viasd.config import to_dataclass
    from viasd.harness.bench import format_table, write_json
    from viasd.harness.tier_cost import TIER_COLUMNS, tier_path_costs
    from viasd.methods.via_sd import SlimConfig

    c = cfg.curve
    slim = to_dataclass(SlimConfig, {"keep_ratio": float(c.keep_ratio), **OmegaConf.to_container(c.slim, resolve=True)})
    rows = tier_path_costs(pair, slim, int(cfg.gamma), int(c.context), int(c.reps), str(c.clock))
    print(f"\nVIA-SD tier paths: pair={pair.name} backend={backend} gamma={cfg.gamma} slim={slim.mask}@{slim.keep_ratio} "
          f"({slim.space}) context={c.context} reps={c.reps} clock={c.clock} threads={torch.get_num_threads()}")
    print(format_table(rows, TIER_COLUMNS))
    write_json(c.tier_out, rows, {"pair": OmegaConf.to_container(cfg.pair, resolve=True), "backend": backend,
                                  "gamma": cfg.gamma, "slim": OmegaConf.to_container(c.slim, resolve=True),
                                  "keep_ratio": c.keep_ratio, "context": c.context, "reps": c.reps, "clock": c.clock})
    print(f"wrote {c.tier_out}")


def store_cost_model(cfg: DictConfig, pair, backend: str) -> None:
    """Measure the pair's cost file (``viasd.analysis.cost``) once per machine, pair and runtime into
    ``<curve.store>/_cost/`` (reused unless ``curve.remeasure``); prints what it holds."""
    import platform
    import time
    from pathlib import Path

    import torch

    from viasd.analysis.cost import COST, CostModel, cost_name
    from viasd.config import to_dataclass
    from viasd.harness.bench import CostGrid, measure_cost_model
    from viasd.paths import runs_dir
    from viasd.utils.machine import cpu_name

    m = to_dataclass(CostGrid, cfg.curve.get("cost"), where="curve.cost")
    if not m.enabled:
        return
    runtime = {**pair.extras.get("runtime", {}), "backend": backend}
    runtime.pop("dtype_probe", None)
    store = Path(str(cfg.curve.get("store") or runs_dir()))
    path = store / COST / cost_name(pair.name, runtime, torch.get_num_threads())
    if path.is_file() and not m.remeasure:
        print(f"cost model reused: {path} (curve.cost.remeasure=true measures it again)")
        return
    print(f"measuring the cost model of {pair.name} ({backend}, {torch.get_num_threads()} thread(s)) ...")
    t0 = time.perf_counter()
    data = measure_cost_model(pair, m.ns, m.contexts, m.prefill_ns, m.reps, str(cfg.curve.clock))
    data["meta"] = {"pair": pair.name, "host": platform.node(), "cpu": cpu_name(), "runtime": runtime,
                    "threads": torch.get_num_threads(),
                    "clock": str(cfg.curve.clock), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "measure_s": time.perf_counter() - t0, "torch": torch.__version__}
    cost = CostModel(data, path)
    cost.save(path)
    for name, e in cost.models.items():
        t1, t8 = e.seconds(1, 512), e.seconds(8, 512, last=8)
        print(f"  {name}: t(1 token | 512 cached) {t1 * 1e3:.2f} ms, t(8 | 512, 8 rows) {t8 * 1e3:.2f} ms, "
              f"extra row {e.head_row * 1e3:.3f} ms" + (f", per layer {e.routed_layer(1, 512) * 1e3:.3f} ms"
                                                        if e.routed_layer is not None else ""))
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")


def run_sandbox_bench(cfg: DictConfig) -> None:
    """The ``--sandbox`` mode: the sandbox's cost per isolation level (no model is loaded)."""
    from viasd.harness.bench import format_table, write_json
    from viasd.harness.sandbox_bench import COLUMNS, sandbox_bench

    o = cfg.sandbox_opts
    rows, meta = sandbox_bench(int(o.n_samples), int(o.reps), int(o.workers))
    print(f"\nsandbox: {meta['n_samples']} canonical HumanEval samples ({meta['source']}) x {meta['reps']} reps, "
          f"{meta['workers']} workers for samples/s, uid {meta['uid']}, load {meta['load_avg'][0]:.1f}")
    print(format_table(rows, COLUMNS))
    for claim, held in meta["orderings"].items():  # the expected orderings, checked here, not in a unit test
        print(f"  {claim}: {'yes' if held else 'NO (a loaded machine? measure again)'}")
    write_json(o.out, rows, meta)
    print(f"wrote {o.out}")


def run_custom_generate_bench(cfg: DictConfig) -> None:
    """The ``--custom-generate`` mode: greedy ``generate`` vs ``generate(custom_generate=…)`` per method."""
    import platform

    import torch
    import transformers

    from viasd.harness.bench import format_table, write_json
    from viasd.harness.custom_generate_bench import COLUMNS, custom_generate_bench
    from viasd.models.pairs import load_pair
    from viasd.utils.machine import cpu_name

    o = cfg.custom_generate_opts
    pair = load_pair(cfg.pair)
    if pair.tokenizer is None or getattr(pair.target.config, "is_encoder_decoder", False):
        raise ConfigError(f"--custom-generate needs a decoder-only pair with a tokenizer; pair={pair.name} is not one")
    spec = str(o.prompts)
    if spec == "auto":
        try:
            prompts, spec = load_prompts("humaneval", int(cfg.n_prompts), pair.tokenizer), "humaneval"
        except ConfigError:  # no offline data folder: the built-in prompts
            prompts, spec = load_prompts("builtin", int(cfg.n_prompts), pair.tokenizer), "builtin"
    else:
        prompts = load_prompts(spec, int(cfg.n_prompts), pair.tokenizer)
    methods = [str(m) for m in o.methods]
    rows, per_prompt = custom_generate_bench(pair.target, pair.draft, pair.tokenizer, prompts, methods,
                                             int(cfg.max_new_tokens), warmup=int(cfg.warmup))
    runtime = pair.extras["runtime"]
    template = "chat template" if getattr(pair.tokenizer, "chat_template", None) else "plain"
    print(f"\npair={pair.name} dtype={runtime['dtype']} backend={runtime['backend']} threads={torch.get_num_threads()} "
          f"prompts={len(prompts)} ({spec}, {template}) max_new_tokens={cfg.max_new_tokens} "
          f"transformers={transformers.__version__} cpu={cpu_name()}")
    print(format_table(rows, COLUMNS))
    write_json(o.out, rows, {"pair": OmegaConf.to_container(cfg.pair, resolve=True), "prompts": spec,
                             "prompt_format": template, "n_prompts": len(prompts),
                             "max_new_tokens": cfg.max_new_tokens, "warmup": cfg.warmup, "runtime": runtime,
                             "methods": methods, "transformers": transformers.__version__, "cpu": cpu_name(),
                             "python": platform.python_version(), "per_prompt": per_prompt})
    print(f"wrote {o.out}")


@hydra.main(version_base="1.3", config_path="../conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    import torch
    import transformers

    from viasd.config import GenerationConfig
    from viasd.harness.bench import COLUMNS, Variant, format_table, run_bench, write_json
    from viasd.harness.host_syncs import SYNC_COLUMNS, add_host_syncs, host_sync_rows
    from viasd.models.pairs import load_pair

    transformers.logging.set_verbosity_error()
    with one_line_errors():
        torch.set_num_threads(int(cfg.threads))
        if cfg.cost_curve:
            return run_cost_curve(cfg)
        if cfg.sandbox:
            return run_sandbox_bench(cfg)
        if cfg.get("custom_generate"):
            return run_custom_generate_bench(cfg)
        pair = load_pair(cfg.pair)
        variants = [Variant(m, m, {} if m == "ar" else {"gamma": int(cfg.gamma)}) for m in cfg.methods]
        for label, v in OmegaConf.to_container(cfg.variants, resolve=True).items():
            v = dict(v)
            variants.append(Variant(label, v.pop("method"), v))
        prompts = load_prompts(str(cfg.prompts), int(cfg.n_prompts), pair.tokenizer)
        gen = GenerationConfig(max_new_tokens=int(cfg.max_new_tokens), temperature=float(cfg.temperature),
                               ignore_eos=True)
        rows = run_bench(pair, prompts, variants, gen, warmup=int(cfg.warmup), seed=int(cfg.seed))
        if cfg.get("host_syncs", True):  # untimed decodes counting device->host reads (viasd.harness.host_syncs)
            rows = add_host_syncs(rows, host_sync_rows(pair, prompts, variants, gen, seed=int(cfg.seed)))
    runtime = pair.extras["runtime"]
    print(f"\npair={pair.name} dtype={runtime['dtype']} backend={runtime['backend']} threads={cfg.threads} "
          f"prompts={len(prompts)} "
          f"max_new_tokens={cfg.max_new_tokens} gamma={cfg.gamma}")
    print(format_table(rows, COLUMNS + (SYNC_COLUMNS if cfg.get("host_syncs", True) else [])))
    write_json(cfg.out, rows, {"pair": OmegaConf.to_container(cfg.pair, resolve=True), "gamma": cfg.gamma,
                               "n_prompts": len(prompts), "max_new_tokens": cfg.max_new_tokens,
                               "runtime": runtime})
    print(f"wrote {cfg.out}")


if __name__ == "__main__":
    for flag, key in (("--cost-curve", "cost_curve"), ("--sandbox", "sandbox"), ("--custom-generate", "custom_generate")):  # flags, not Hydra overrides
        if flag in sys.argv:
            sys.argv = [a for a in sys.argv if a != flag] + [f"{key}=true"]
    main()
