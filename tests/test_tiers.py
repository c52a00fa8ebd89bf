"""VIA-SD routing by hand: :func:`route_round` on 5-token vocabularies, every band and knob."""

from __future__ import annotations

import pytest
import torch

from viasd.core.tiers import (
    BONUS,
    CONTINUE,
    END,
    ESCALATE,
    KEEP,
    REWRITE,
    Step,
    agreement_scores,
    gate_distribution,
    route_round,
)

V = 5
Y = torch.tensor([0, 1, 3])
# Gate distributions (softmax of raw logits). Agreement s_i = min(1, q̂'(y_i) / p̂(y_i)):
P_GATE = torch.tensor([[0.60, 0.10, 0.10, 0.10, 0.10],
                       [0.10, 0.80, 0.05, 0.05, 0.00],
                       [0.10, 0.10, 0.10, 0.60, 0.10]])
Q_GATE = torch.tensor([[0.70, 0.10, 0.10, 0.05, 0.05],   # s_0 = 1       conf 0.70
                       [0.10, 0.40, 0.45, 0.00, 0.05],   # s_1 = 0.5     conf 0.45, argmax 2
                       [0.20, 0.10, 0.10, 0.35, 0.25],   # s_2 = 0.583   conf 0.35, argmax 3 (= y_2)
                       [0.05, 0.05, 0.80, 0.05, 0.05]])  # bonus position: conf 0.80, argmax 2


def onehot(idx) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.as_tensor(idx), V).float()


def greedy_route(y=Y, p_gate=P_GATE, q_gate=Q_GATE, **knobs):
    """Route with greedy processed distributions (one-hot on the draft / on the slim argmax)."""
    return route_round(y, onehot(y), onehot(q_gate.argmax(-1)), p_gate, q_gate, None, **knobs)


def actions(route) -> list[str]:
    return [s.action for s in route.steps]


def test_scores_and_confidence_are_read_from_the_gate_distributions():
    r = greedy_route(tau_accept=0.4, tau_slim=0.6)
    assert torch.allclose(r.scores, torch.tensor([1.0, 0.5, 0.35 / 0.6]))
    assert torch.allclose(r.confidence, torch.tensor([0.70, 0.45, 0.35, 0.80]))
    # TV agreement: s_0 = Σ min(p̂_0, q̂'_0) = 0.6 + 0.1 + 0.1 + 0.05 + 0.05.
    assert torch.allclose(agreement_scores(P_GATE, Q_GATE[:3], Y, "tv")[0], torch.tensor(0.9))


def test_high_band_accepts_every_token_then_slim_bonus():
    r = greedy_route(tau_accept=0.4, tau_slim=0.6)
    assert actions(r) == [CONTINUE, CONTINUE, CONTINUE, BONUS]
    assert [s.source for s in r.steps] == ["draft", "draft", "draft", "slim"]
    assert r.accepted == 3 and r.token == 2 and r.verify_from is None


@pytest.mark.parametrize("knobs", [{"tau_slim": 0.9}, {"tau_slim": 0.6, "slim_bonus": False}])
def test_bonus_position_without_a_confident_slim_ends_the_round(knobs):
    r = greedy_route(tau_accept=0.4, **knobs)
    assert actions(r) == [CONTINUE] * 3 + [END]
    assert r.steps[-1] == Step(3, 0, END, "none")
    assert r.accepted == 3 and r.token is None


def test_medium_band_confident_slim_rewrites_and_ends_the_round():
    r = greedy_route(tau_accept=0.9, tau_slim=0.4)
    assert actions(r) == [CONTINUE, REWRITE]  # position 2 is not routed
    assert r.steps[-1] == Step(1, 2, REWRITE, "slim")
    assert r.accepted == 1 and r.token == 2  # greedy: argmax q'_1


def test_medium_band_unsure_slim_escalates():
    r = greedy_route(tau_accept=0.9, tau_slim=0.5)  # conf 0.45 < 0.5
    assert actions(r) == [CONTINUE, ESCALATE]
    assert r.steps[-1] == Step(1, 3, ESCALATE, "full")
    assert r.accepted == 1 and r.verify_from == 1 and r.token is None


def test_low_band_escalates_even_when_the_slim_is_confident():
    r = greedy_route(tau_accept=0.9, tau_escalate=0.6, tau_slim=0.4)  # s_1 = 0.5 < 0.6
    assert actions(r) == [CONTINUE, ESCALATE]
    # and tau_escalate just below s_1 puts it back in the medium band
    assert actions(greedy_route(tau_accept=0.9, tau_escalate=0.5, tau_slim=0.4)) == [CONTINUE, REWRITE]


def test_slim_keeping_the_draft_token_goes_on_routing():
    """Block ``[y_2]``: medium agreement (0.583) and slim argmax = y_2: tier 2 emits the draft's own
    token, so the round is not cut there — it goes on to the bonus position."""
    r = greedy_route(y=Y[2:], p_gate=P_GATE[2:], q_gate=Q_GATE[2:], tau_accept=0.9, tau_slim=0.3)
    assert r.steps == [Step(0, 2, KEEP, "slim"), Step(1, 0, BONUS, "slim")]
    assert r.accepted == 1 and r.token == 2
    # a kept position followed by an unsure slim verifier escalates after it
    r = greedy_route(y=Y[2:], p_gate=P_GATE[2:], q_gate=Q_GATE[2:], tau_accept=0.9, tau_slim=0.3, slim_bonus=False)
    assert actions(r) == [KEEP, END] and r.accepted == 1


def test_reverify_on_escalation_verifies_from_the_first_token():
    r = greedy_route(tau_accept=0.9, tau_slim=0.5, reverify_on_escalation=True)
    assert actions(r) == [CONTINUE, ESCALATE]
    assert r.accepted == 1 and r.verify_from == 0


@pytest.mark.parametrize("unverified,limit,at", [(1, 2, 1), (0, 0, 0), (5, 3, 0), (0, 3, 3)])
def test_max_unverified_forces_escalation(unverified, limit, at):
    r = greedy_route(tau_accept=0.4, tau_slim=0.6, unverified=unverified, max_unverified=limit)
    assert actions(r) == [CONTINUE] * at + [ESCALATE]
    assert r.accepted == at and r.verify_from == at  # at == 3: the full model supplies the bonus token


def test_empty_block_escalates():
    r = route_round(Y[:0], torch.zeros(0, V), onehot([2]), torch.zeros(0, V), Q_GATE[3:], None,
                    tau_accept=0.4, tau_slim=0.0)
    assert actions(r) == [ESCALATE] and r.verify_from == 0


def test_thresholds_above_one_switch_the_tiers_off():
    eye = torch.eye(V)[:4]  # even perfect agreement and full confidence
    r = route_round(Y, onehot(Y), eye, onehot(Y), torch.cat([onehot(Y), eye[:1]]), None,
                    tau_accept=1.01, tau_slim=1.01)
    assert actions(r) == [ESCALATE] and r.verify_from == 0


def test_gate_differs_from_processed_distributions_in_greedy_mode():
    """Processed (one-hot) draft and slim agree on y_2, yet the gate's agreement is medium."""
    r = greedy_route(tau_accept=0.4, tau_slim=0.6)
    assert r.steps[2].action == CONTINUE  # 0.583 >= 0.4
    r = greedy_route(tau_accept=0.6, tau_slim=0.6)
    assert actions(r) == [CONTINUE, ESCALATE]  # s_1 = 0.5 < 0.6 and conf 0.45 < 0.6


def test_sampling_rewrite_draws_from_the_residual():
    """Tier 2 in sampling mode draws norm(max(0, q' − p)) of the processed distributions."""
    p = torch.tensor([[0.7, 0.3, 0.0, 0.0, 0.0]])
    q_slim = torch.tensor([[0.1, 0.3, 0.3, 0.3, 0.0], [0.2] * 5])
    seen = set()
    for seed in range(40):
        rng = torch.Generator().manual_seed(seed)
        r = route_round(torch.tensor([0]), p, q_slim, p, q_slim, rng, tau_accept=0.9, tau_slim=0.2)
        assert r.action == REWRITE
        seen.add(r.token)
    assert seen == {2, 3}


def test_gate_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.0, 0.0]])
    fallback = onehot([4])
    assert torch.allclose(gate_distribution(logits), logits.softmax(-1))
    assert torch.allclose(gate_distribution(logits, 2.0), (logits / 2).softmax(-1))
    assert torch.equal(gate_distribution(None, 1.0, fallback=fallback), fallback)  # lookup: one-hot proposal
    assert torch.equal(gate_distribution(logits[:0], 1.0, fallback=fallback), fallback)  # row mismatch


def test_gate_variants_are_off_by_default_and_each_tightens_tier_1():
    """``tier1_needs_slim_argmax``: y_1 = 1 is not the slim argmax (2), so it leaves tier 1 (conf 0.45 <
    τ_slim: escalate). ``tier1_min_draft_confidence=0.7``: y_0 and y_2 (max p̂ = 0.6) leave tier 1; y_0 is
    the slim verifier's own token (kept by tier 2), y_2's slim verifier is unsure (escalate)."""
    assert actions(greedy_route(tau_accept=0.4, tau_slim=0.6)) == [CONTINUE] * 3 + [BONUS]
    assert actions(greedy_route(tau_accept=0.4, tau_slim=0.6, tier1_needs_slim_argmax=True)) == [CONTINUE, ESCALATE]
    assert actions(greedy_route(tau_accept=0.4, tau_slim=0.6, tier1_min_draft_confidence=0.7)) == [
        KEEP, CONTINUE, ESCALATE]


def test_route_positions_is_the_decision_route_round_makes():
    """The bands over plain per-position values: what trace replay calls with values read from a trace."""
    from viasd.core.tiers import route_positions

    ref = greedy_route(tau_accept=0.9, tau_slim=0.4)
    top = Q_GATE.argmax(-1).tolist()
    r = route_positions(ref.scores.tolist(), ref.confidence.tolist(), Y.tolist(), top.__getitem__, lambda: top[-1],
                        tau_accept=0.9, tau_slim=0.4)
    assert r.steps == ref.steps and r.token == ref.token and r.accepted == ref.accepted
