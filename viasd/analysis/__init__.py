"""Analysis of finished runs, without decoding: trace replay, the cost model, paired statistics.

* :mod:`~viasd.analysis.trace` — teacher-force a pair's models along a finished run's outputs
  and keep, per position, what any gate needs (compact files in ``<store>/_traces/``);
* :mod:`~viasd.analysis.replay` — re-run a decoding policy over a trace: the methods' own round loops
  over the trace world (:mod:`~viasd.analysis.traces`, :mod:`~viasd.analysis.verifiers`), with the
  replay drafters of :mod:`~viasd.analysis.sim`;
* :mod:`~viasd.analysis.cost` — load-free speed: forward calls priced with the measured
  ``t(n, context, layers)`` of each model (``<store>/_cost/``);
* :mod:`~viasd.analysis.stats` and :mod:`~viasd.analysis.paired` — paired statistics of a run
  against its ``ar`` run on shared examples.

The package sits above :mod:`viasd.methods` and below :mod:`viasd.harness` (``docs/replay.md``).
"""
