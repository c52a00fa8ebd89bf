"""The concrete task kinds, one module per family, registered in :data:`viasd.tasks.base.TASKS`.

Each kind maps dataset rows to :class:`~viasd.tasks.base.Example` (prompt fields, reference,
metadata), hub rows to the offline file's layout, and names the metric it is scored with.
Every configuration value and default lives in ``conf/task/<name>.yaml`` (the single
source); a kind only declares the option keys it adds to the common ones (``options``).

=============  ===============  ======================================  ==================
task           module           offline file (under VIASD_DATA_DIR)     metric
=============  ===============  ======================================  ==================
xsum           summarization    summarization/xsum_test_1000.jsonl      rouge
cnndm          summarization    summarization/cnndm_test_summeval_100   rouge
wmt14_deen     translation      translation/wmt14_newstest2014_de-en    bleu (BLEU, chrF)
gsm8k          reasoning        math/gsm8k_test.jsonl                   gsm8k_accuracy
nq_open        qa               qa/nq_open_dev.jsonl                    squad_qa
squad          qa               qa/squad_v1.1_dev_1000.jsonl            squad_qa
humaneval      coding           code/HumanEval.jsonl                    code_pass_at_1
mbpp           coding           code/mbpp.jsonl (task_id 11-510)        code_pass_at_1
specbench      prompts          specbench/question.jsonl                none (speed only)
prompts        prompts          built in, or a .jsonl/.txt file         none
=============  ===============  ======================================  ==================

:data:`HUB` holds, per task with one, the hub dataset its offline file was made from (id,
config, split, pinned revision, parquet files), read from the task's YAML.
"""

from __future__ import annotations

from typing import Any

from viasd.tasks.base import task_defaults
from viasd.tasks.families.coding import HumanEvalTask, MbppTask, extract_code_block
from viasd.tasks.families.prompts import PromptsTask, SpecBenchTask, read_prompt_file
from viasd.tasks.families.qa import NqOpenTask, SquadTask
from viasd.tasks.families.reasoning import Gsm8kTask
from viasd.tasks.families.summarization import CnnDmTask, XSumTask
from viasd.tasks.families.translation import Wmt14DeEnTask

__all__ = [
    "HUB",
    "CnnDmTask",
    "Gsm8kTask",
    "HumanEvalTask",
    "MbppTask",
    "NqOpenTask",
    "PromptsTask",
    "SpecBenchTask",
    "SquadTask",
    "Wmt14DeEnTask",
    "XSumTask",
    "extract_code_block",
    "read_prompt_file",
]

#: Task name → ``{path, name, split, revision, files}`` of its hub dataset (from conf/task/<name>.yaml).
HUB: dict[str, dict[str, Any]] = {
    name: task_defaults(name)["hub"]
    for name in ("xsum", "cnndm", "wmt14_deen", "gsm8k", "nq_open", "squad", "humaneval", "mbpp", "specbench")
    if task_defaults(name).get("hub")
}
