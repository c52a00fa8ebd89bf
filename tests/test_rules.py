"""Pure acceptance rules and processors on hand-made distributions."""

from __future__ import annotations

import pytest
import torch

from viasd.config import GenerationConfig
from viasd.core import rules
from viasd.core.sampling import probs_from_logits


def test_accept_prob_and_residual_by_hand():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    assert rules.sd_accept_prob(p[0], q[0]).item() == pytest.approx(0.4)
    assert rules.sd_accept_prob(p[2], q[2]).item() == pytest.approx(1.0)
    assert torch.allclose(rules.sd_residual(p, q), torch.tensor([0.0, 0.0, 1.0]))
    assert rules.acceptance_rate(p, q).item() == pytest.approx(0.7)
    assert torch.allclose(rules.sd_residual(p, p), p)  # degenerate case falls back to q


def test_expected_tokens_and_ideal_speedup():
    assert rules.expected_tokens(0.0, 4) == pytest.approx(1.0)
    assert rules.expected_tokens(1.0, 4) == 5
    assert rules.expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert rules.ideal_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / 0.2 / 1.4)


def test_verify_block_greedy():
    onehot = lambda i: torch.nn.functional.one_hot(torch.tensor(i), 4).float()  # noqa: E731
    draft = torch.tensor([1, 2, 3])
    p = torch.stack([onehot(1), onehot(2), onehot(3)])
    q = torch.stack([onehot(1), onehot(2), onehot(0), onehot(3)])
    assert rules.verify_block(draft, p, q, None) == (2, 0)
    q_all = torch.stack([onehot(1), onehot(2), onehot(3), onehot(2)])
    assert rules.verify_block(draft, p, q_all, None) == (3, 2)
    assert rules.verify_block(draft[:0], p[:0], q[:1], None) == (0, 1)


def test_processors():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    assert torch.equal(probs_from_logits(logits, GenerationConfig(temperature=0)), torch.tensor([1.0, 0, 0, 0]))
    pk = probs_from_logits(logits, GenerationConfig(temperature=1.0, top_k=2))
    assert (pk[2:] == 0).all() and pk.sum().item() == pytest.approx(1.0)
    full = logits.softmax(-1)
    pp = probs_from_logits(logits, GenerationConfig(temperature=1.0, top_p=0.7))
    assert pp[0] > 0 and (pp[1] > 0) == (full[0] < 0.7) and pp[3] == 0
