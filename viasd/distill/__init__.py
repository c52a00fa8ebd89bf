"""Distillation of the project-built draft of the embedded default pair (SmolLM2-135M-Instruct).

A small ``LlamaForCausalLM`` sharing the target's tokenizer, distilled on CPU in minutes
against the target's own greedy continuations of task-like chat prompts, then cached:

* :mod:`~viasd.distill.config` — :class:`DraftBuildConfig`, every knob of the recipe;
* :mod:`~viasd.distill.data` — task-like prompts (data folder or built-in), train/held-out split;
* :mod:`~viasd.distill.teacher` — the target's greedy continuations, top-k log-probs and final
  hidden states (cached), and their teacher-forced batches;
* :mod:`~viasd.distill.init` — the draft's config, vocabulary subset and initialization from the target;
* :mod:`~viasd.distill.train` — losses, the warmup + cosine schedule, the training loop;
* :mod:`~viasd.distill.evaluate` — held-out agreement, vocabulary coverage, forward cost;
* :mod:`~viasd.distill.cache` — cache keys (fingerprints), thread choice, progress output;
* :mod:`~viasd.distill.build` — the atomic, verified build and ``load_or_build_draft``;
* :mod:`~viasd.distill.draft_model` — the vocabulary-subset-head Llama architecture;
* :mod:`~viasd.distill.pair` — the ``smollm2`` pair loader (registered lazily in
  :data:`viasd.models.pairs.PAIR_LOADERS`).

The package sits above :mod:`viasd.models` and :mod:`viasd.tasks`; nothing below imports it.
"""
