"""One loop per method, decoded or replayed (issue 61): the registry says which methods replay, and the
replay of ``ar``/``sd``/``cascade_sd``/``via_sd`` runs the method's own round loop over a trace world.

Exactness of those replays (a run's own trajectory reproduces its counters) is tested in
``tests/test_replay.py`` and ``tests/test_replay_cascades.py``.
"""

from __future__ import annotations

import pytest

from viasd.analysis import deferral
from viasd.analysis import replay as replay_mod
from viasd.analysis.replay import REPLAYS, Episode, VerifiersTrace, replayed
from viasd.errors import ConfigError
from viasd.methods import ar, cascade_sd, faster_cascades, sd, via_sd
from viasd.methods.registry import METHODS

WORLD = ("done", "remaining", "counters", "propose", "verify", "next_token", "commit", "record")


def test_the_registry_says_which_methods_replay():
    replayable = {n for n in METHODS.names() if METHODS.get(n).replayable}
    assert replayable == set(REPLAYS.names()) == {"ar", "sd", "cascade_sd", "via_sd", "faster_cascades"}
    assert replayed("viasd") is replayed("via_sd")  # the alias resolves through the registry


@pytest.mark.parametrize("method", ["hf_assisted", "hf_prompt_lookup"])
def test_a_method_that_does_not_replay_is_one_line(method):
    with pytest.raises(ConfigError, match=r"replay supports ar, cascade_sd, faster_cascades, sd, via_sd") as e:
        replayed(method)
    assert "\n" not in str(e.value)


def test_replay_runs_the_methods_own_loops():
    """The trace worlds implement the loops' interface, and replay imports the loops themselves (no copies)."""
    assert all(hasattr(Episode, name) for name in WORLD)
    via = ("done", "remaining", "counters", "propose", "route", "escalate", "host", "commit", "tail", "record")
    assert all(hasattr(VerifiersTrace, name) for name in via)
    assert replay_mod.ar_steps is ar.ar_steps and replay_mod.sd_rounds is sd.sd_rounds
    assert replay_mod.cascade_rounds is cascade_sd.cascade_rounds and replay_mod.via_rounds is via_sd.via_rounds
    assert not hasattr(replay_mod, "_speculate")
    assert deferral.deferral_rounds is faster_cascades.deferral_rounds
