"""Corpus BLEU and chrF as an offline ``evaluate`` metric (wraps ``sacrebleu``).

Loaded by path (``viasd.tasks.metrics.load_metric("bleu")``). The corpus scores are exactly
``sacrebleu.corpus_bleu`` / ``sacrebleu.corpus_chrf`` on the same inputs (0-100, default
13a tokenization); per-example scores are the sentence-level versions. A reference may be
one string or a list of strings; every example must then have the same number.
"""

from __future__ import annotations

import evaluate
import sacrebleu

from viasd.tasks.metrics.info import metric_info

_DESCRIPTION = "sacrebleu corpus BLEU and chrF (0-100); per-example sentence BLEU/chrF."
_KWARGS = """
Args:
    predictions: list of hypotheses (detokenized text).
    references: list of references, or of equally long lists of references.
    tokenize: sacrebleu tokenizer for BLEU (default "13a").
    lowercase: case-insensitive BLEU (default False).
    per_example: also return "per_example", a list of {"bleu", "chrf"} dicts.
Returns:
    {"bleu", "chrf", "bp", "sys_len", "ref_len", "precisions": [4 floats]}.
"""
_CITATION = "Post, M. (2018). A Call for Clarity in Reporting BLEU Scores."


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class Bleu(evaluate.Metric):
    """sacrebleu BLEU + chrF."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS, "https://github.com/mjpost/sacrebleu", many_references=True)

    def _compute(self, predictions, references, tokenize="13a", lowercase=False, per_example=False):
        refs = [[r] if isinstance(r, str) else list(r) for r in references]
        n_refs = {len(r) for r in refs}
        if len(n_refs) > 1:
            raise ValueError(f"every prediction needs the same number of references, got {sorted(n_refs)}")
        streams = [list(s) for s in zip(*refs, strict=True)] if refs else [[]]
        bleu = sacrebleu.corpus_bleu(predictions, streams, tokenize=tokenize, lowercase=lowercase)
        chrf = sacrebleu.corpus_chrf(predictions, streams)
        result = {
            "bleu": float(bleu.score),
            "chrf": float(chrf.score),
            "bp": float(bleu.bp),
            "sys_len": int(bleu.sys_len),
            "ref_len": int(bleu.ref_len),
            "precisions": [float(p) for p in bleu.precisions],
        }
        if per_example:
            result["per_example"] = [
                {
                    "bleu": float(
                        sacrebleu.sentence_bleu(p, r, tokenize=tokenize, lowercase=lowercase).score
                    ),
                    "chrf": float(sacrebleu.sentence_chrf(p, r).score),
                }
                for p, r in zip(predictions, refs, strict=True)
            ]
        return result
