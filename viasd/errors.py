"""User-facing error types.

Every error a user can cause by configuration or input (an unknown method, a vocabulary
mismatch, an out-of-range threshold, a missing data file, ...) is raised as a
:class:`ConfigError` whose message names the fix. Entry points catch it and print one line
instead of a traceback. A Ctrl-C inside a run becomes :class:`RunInterrupted`, which carries
the partial run's folder so the entry point can say where it was left.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


class ConfigError(ValueError):
    """Bad user input or configuration; the message says how to fix it."""


def no_draft_model(what: str, pair_name: str, model_free_ok: bool = False) -> ConfigError:
    """The error for ``what`` needing a draft model that pair ``pair_name`` lacks, naming the fixes."""
    alt = "; or use a model-free drafter: method.drafter.name=ngram" if model_free_ok else ""
    return ConfigError(
        f"{what} needs a draft model and pair {pair_name!r} has none; add pair.options.draft=trained "
        f"(smollm2: the distilled draft, built on first use, about 20 min on 2 cores, or ahead with "
        f"`python -m experiments.build_draft`) or pick a pair with a draft (e.g. pair=tiny-llama){alt}"
    )


def check(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; ``path`` is the run folder left without ``summary.json``."""

    def __init__(self, path: object):
        super().__init__(f"interrupted: partial run left at {path}, not marked finished")
        self.path = path


@contextmanager
def one_line_errors() -> Iterator[None]:
    """For command-line entry points: a ConfigError or Ctrl-C ends the command with one line on
    stderr (exit status 2, resp. 130) instead of a traceback."""
    try:
        yield
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:
        print(e if isinstance(e, RunInterrupted) else "interrupted: nothing was marked finished", file=sys.stderr)
        sys.exit(130)
