"""Task interface and task registry shared by every evaluation task.

This module owns:

* :class:`Example` — one task input (user-message prompt, reference, metadata);
* :class:`Task` — the base class: configuration handling (the common keys plus each kind's
  ``options``, unknown keys rejected, defaults from ``conf/task/<kind>.yaml`` — the single
  source of every task default, see :func:`task_defaults`), rows through
  :mod:`viasd.tasks.loading` (``source: auto | local | hub``), the seeded ``n_examples``
  subset chosen by stable example ids, prompt rendering (the tokenizer's chat template when
  it has one, else a plain template), stop-string post-processing and scoring through a
  metric module;
* :data:`TASKS` — the registry of task kinds, and :func:`build_task`, which turns a
  ``conf/task/<name>.yaml`` node (or a partial dict of overrides) into a task.

The concrete kinds live in :mod:`viasd.tasks.families`.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml
from omegaconf import DictConfig, OmegaConf

from viasd.errors import ConfigError
from viasd.paths import PROJECT_ROOT
from viasd.registry import Registry
from viasd.tasks.loading import load_rows, resolve_hub, resolve_source, subset_rank
from viasd.tasks.metrics import load_metric

__all__ = ["Example", "Task", "TASKS", "TASK_CONF", "build_task", "common_keys", "task_defaults"]


@dataclass
class Example:
    """One task input.

    ``prompt`` is the input rendered as the user message (no chat template applied yet);
    ``reference`` is whatever the task's metric needs (a string, a list of acceptable
    answers, or test code); ``meta`` holds the plain-template prompt (``plain_prompt``) and
    small per-task fields (ids, categories, entry points).
    """

    id: str
    prompt: str
    reference: Any
    meta: dict = field(default_factory=dict)


TASKS: Registry[type[Task]] = Registry("task")

#: Where each task's configuration, with all its default values, lives: ``<TASK_CONF>/<kind>.yaml``.
TASK_CONF = PROJECT_ROOT / "conf" / "task"

# Keys every task config accepts, with the neutral value a task's YAML may leave out.
_COMMON: dict[str, Any] = {
    "name": None,
    "kind": None,  # task kind to build; defaults to ``name``
    "source": "auto",  # auto (local file if present, else hub) | local (alias: offline) | hub
    "offline_file": None,  # relative to the data dir (VIASD_DATA_DIR), or absolute
    "hub": None,  # {path, name, split, revision, files} for source: hub
    "hub_root": None,  # a local mirror of the hub layout (<hub_root>/<path>/<files>) instead of hf://
    "n_examples": None,  # None: all rows
    "seed": 0,
    "subset": "id",  # id: seeded subset by stable example id | position: by row position (old files)
    "max_new_tokens": 128,
    "truncate": None,  # a prompt over the context: None refuses it, left|right cuts it (viasd.tasks.length)
    "stop_strings": [],
    "chat_stop_strings": None,  # None: same as stop_strings
    "system_prompt": None,
    "prompt_template": None,  # user message; str.format fields from the row
    "plain_template": None,  # prompt for tokenizers without a chat template (T5, base LMs)
}


def common_keys() -> list[str]:
    """The config keys every task accepts (a kind adds its ``options``)."""
    return list(_COMMON)


@functools.cache
def _read_task_yaml(kind: str) -> dict[str, Any]:
    path = TASK_CONF / f"{kind}.yaml"
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of task config keys")
    return data


def task_defaults(kind: str) -> dict[str, Any]:
    """The defaults of task kind ``kind``: ``conf/task/<kind>.yaml`` as a dict ({} if there is none).

    The YAML files are the one place a task's default values are written; :class:`Task`
    merges a config over them, so ``build_task({"name": "xsum"})`` is the same task as
    ``experiments.run task=xsum``.
    """
    return copy.deepcopy(_read_task_yaml(str(kind)))


def _to_plain_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    if isinstance(cfg, Mapping):
        return copy.deepcopy(dict(cfg))
    raise ConfigError(f"task config must be a mapping, got {type(cfg).__name__}")


def _has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


class Task:
    """One configured evaluation task (see the module docstring).

    Subclasses set ``options`` (the config keys they add to the common ones; their default
    values are in ``conf/task/<kind>.yaml``), ``metric`` (a module under
    ``viasd/tasks/metrics``) and implement
    :meth:`make_example`; they may override :meth:`normalize_hub_row`, :meth:`few_shot`,
    :meth:`postprocess` and :meth:`score`.
    """

    options: ClassVar[tuple[str, ...]] = ()
    metric: ClassVar[str | None] = None
    #: Whether :meth:`score` needs no more than each example's prediction and reference (a text
    #: metric), so the examples of a run still being decoded can be scored from their records for an
    #: interim reading (:func:`~viasd.analysis.paired.load_unfinished`). Code tasks execute programs
    #: and read the problem's metadata: False.
    scores_from_records: ClassVar[bool] = True

    def __init__(self, cfg: Mapping[str, Any] | Any):
        raw = _to_plain_dict(cfg)
        allowed = {**_COMMON, **dict.fromkeys(self.options)}
        unknown = sorted(set(raw) - set(allowed))
        if unknown:
            raise ConfigError(
                f"task {raw.get('name')!r}: unknown config keys {unknown}; allowed: {', '.join(sorted(allowed))}"
            )
        defaults = task_defaults(str(raw.get("kind") or raw.get("name")))
        self.cfg: dict[str, Any] = {**copy.deepcopy(allowed), **defaults, **raw}
        self.name: str = str(self.cfg["name"])
        n = self.cfg["n_examples"]
        if n is not None and (not isinstance(n, int) or n < 1):
            raise ConfigError(f"task {self.name!r}: n_examples must be a positive integer or null, got {n!r}")
        if not isinstance(self.cfg["max_new_tokens"], int) or self.cfg["max_new_tokens"] < 1:
            raise ConfigError(f"task {self.name!r}: max_new_tokens must be a positive integer")
        self.max_new_tokens: int = int(self.cfg["max_new_tokens"])
        if self.cfg["truncate"] not in (None, "left", "right"):
            raise ConfigError(f"task {self.name!r}: truncate must be left, right or null (refuse over-long prompts), "
                              f"got {self.cfg['truncate']!r}")
        self.stop_strings: list[str] = [str(s) for s in (self.cfg["stop_strings"] or [])]
        chat_stops = self.cfg["chat_stop_strings"]
        self.chat_stop_strings: list[str] = (
            self.stop_strings if chat_stops is None else [str(s) for s in chat_stops]
        )
        self._examples: list[Example] | None = None

    # -- data ---------------------------------------------------------------------------

    key_field: ClassVar[str | None] = "id"

    def source(self) -> str:
        """What this task reads: ``local`` or ``hub`` (``auto`` resolved, see :func:`resolve_source`)."""
        return resolve_source(self.cfg["source"], self.cfg["offline_file"], self.cfg["hub"], self.name)

    def preflight(self) -> str | None:
        """Raise a one-line ConfigError before any generation if this task could not be scored here;
        else a short line saying what was checked (None: nothing to check)."""
        return None

    def scoring_meta(self) -> dict[str, Any]:
        """Fields a run's ``meta.json`` records about how this task scored it (code tasks: the
        sandbox's ``isolation`` level); called at scoring time, before the run is sealed."""
        return {}

    def load_rows(self) -> list[dict[str, Any]]:
        """All rows of the configured source, in the offline files' field layout."""
        rows = load_rows(self.cfg["source"], self.cfg["offline_file"], self.cfg["hub"], self.name, self.cfg["hub_root"])
        if self.source() == "hub":
            rows = [self.normalize_hub_row(r) for r in rows]
        return rows

    def hub_record(self) -> dict[str, Any] | None:
        """What the hub path read — ``{path, revision, commit, files: {name: sha256}}``
        (:func:`~viasd.tasks.loading.resolve_hub`) — or None when the task reads its offline file."""
        if self.source() != "hub" or not (self.cfg["hub"] or {}).get("files"):
            return None
        return resolve_hub(self.cfg["hub"], self.name, self.cfg["hub_root"])

    def normalize_hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """Map a hub row to the field layout of the offline file (identity by default)."""
        return row

    def offline_row(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        """A normalized hub row as written to the offline file by ``experiments.data fetch``."""
        return row

    def row_key(self, index: int, row: dict[str, Any]) -> str:
        """A stable id of a row, the same in the offline file and on the hub (``key_field``)."""
        if self.key_field and self.key_field in row:
            return str(row[self.key_field])
        return str(index)

    def filter_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rows eligible for sampling (all by default; e.g. the MBPP test range)."""
        return rows

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        """Build the :class:`Example` of one row."""
        raise NotImplementedError

    def examples(self) -> list[Example]:
        """The task's examples: a seeded subset of ``n_examples`` rows (all when null), in file order.

        ``subset: id`` (default) takes the ``n_examples`` rows with the smallest
        :func:`subset_rank` of their :meth:`row_key`, so the choice depends only on the rows'
        ids, not on their order: the offline file and the hub pick the same examples where
        they hold the same rows. ``subset: position`` is ``random.Random(seed).sample`` of
        row positions (the order-dependent rule of earlier versions).
        """
        if self._examples is None:
            rows = self.filter_rows(self.load_rows())
            if not rows:
                raise ConfigError(f"task {self.name!r}: the dataset has no rows")
            idx = list(range(len(rows)))
            n, seed = self.cfg["n_examples"], int(self.cfg["seed"])
            if n is not None and n < len(rows):
                if self.cfg["subset"] == "position":
                    idx = sorted(random.Random(seed).sample(idx, n))
                elif self.cfg["subset"] == "id":
                    idx = sorted(sorted(idx, key=lambda i: subset_rank(seed, self.row_key(i, rows[i])))[:n])
                else:
                    raise ConfigError(f"task {self.name!r}: subset must be id or position, got {self.cfg['subset']!r}")
            self._examples = [self.make_example(i, rows[i]) for i in idx]
        return list(self._examples)

    # -- prompts ------------------------------------------------------------------------

    def format(self, template_key: str, fields: Mapping[str, Any]) -> str:
        """Fill the config template ``template_key`` with ``fields`` (``str.format``)."""
        template = self.cfg[template_key]
        if template is None:
            raise ConfigError(f"task {self.name!r}: {template_key} is not set")
        try:
            return str(template).format(**fields)
        except (KeyError, IndexError) as e:
            raise ConfigError(
                f"task {self.name!r}: {template_key} uses field {e} that the data does not have; "
                f"available: {', '.join(sorted(fields))}"
            ) from None

    def few_shot(self) -> list[tuple[str, str, str]]:
        """Few-shot demonstrations as (user message, plain prompt, answer); none by default."""
        return []

    def chat_messages(self, example: Example) -> list[dict[str, str]]:
        """The conversation for a chat template: system, few-shot turns, then the example."""
        messages: list[dict[str, str]] = []
        if self.cfg["system_prompt"]:
            messages.append({"role": "system", "content": str(self.cfg["system_prompt"])})
        for user, _plain, answer in self.few_shot():
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": example.prompt})
        return messages

    def plain_prompt(self, example: Example) -> str:
        """The prompt for tokenizers without a chat template (few-shot blocks first)."""
        parts = [f"{plain} {answer}" for _user, plain, answer in self.few_shot()]
        parts.append(str(example.meta.get("plain_prompt", example.prompt)))
        return "\n\n".join(parts)

    def render(self, example: Example, tokenizer: Any = None) -> str:
        """The final prompt string fed to the tokenizer.

        With a chat template (``tokenizer.chat_template`` set): ``apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)`` over :meth:`chat_messages`.
        Otherwise (T5-like models, base LMs, ``tokenizer=None``): :meth:`plain_prompt`.
        """
        if _has_chat_template(tokenizer):
            return tokenizer.apply_chat_template(
                self.chat_messages(example), tokenize=False, add_generation_prompt=True
            )
        return self.plain_prompt(example)

    def stop_strings_for(self, tokenizer: Any = None) -> list[str]:
        """Stop strings for generation: ``chat_stop_strings`` with a chat template, else ``stop_strings``."""
        return self.chat_stop_strings if _has_chat_template(tokenizer) else self.stop_strings

    # -- outputs ------------------------------------------------------------------------

    def cut_at_stop(self, text: str) -> str:
        """``text`` up to the earliest stop string (of either list)."""
        cut = len(text)
        for s in {*self.stop_strings, *self.chat_stop_strings}:
            if s:
                i = text.find(s)
                if i != -1:
                    cut = min(cut, i)
        return text[:cut]

    def postprocess(self, text: str) -> str:
        """Generated text → prediction: leading whitespace dropped, cut at the first stop string, stripped."""
        return self.cut_at_stop(text.lstrip()).strip()

    def metric_references(self, examples: Sequence[Example]) -> list[Any]:
        """What the metric receives as references (``example.reference`` by default)."""
        return [e.reference for e in examples]

    def metric_predictions(self, predictions: Sequence[str], examples: Sequence[Example]) -> list[str]:
        """What the metric receives as predictions (the predictions by default)."""
        return list(predictions)

    def metric_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments for the metric's ``compute``."""
        return {}

    def score(
        self, predictions: Sequence[str], examples: Sequence[Example]
    ) -> tuple[dict[str, float], list[dict[str, float]]]:
        """(corpus metrics, per-example scores), all on 0-100.

        ``predictions`` are post-processed outputs (:meth:`postprocess`), aligned with
        ``examples``.
        """
        if len(predictions) != len(examples):
            raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples")
        if self.metric is None or not examples:
            return {}, [{} for _ in examples]
        out = load_metric(self.metric).compute(
            predictions=self.metric_predictions(predictions, examples),
            references=self.metric_references(examples),
            per_example=True,
            **self.metric_kwargs(),
        )
        per_example = [{k: float(v) for k, v in row.items()} for row in out.pop("per_example")]
        corpus = {
            k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        return corpus, per_example

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, source={self.cfg['source']!r}, n_examples={self.cfg['n_examples']!r})"


def build_task(cfg: Mapping[str, Any] | Any) -> Task:
    """Build the task described by ``cfg`` (a dict or DictConfig from ``conf/task/<name>.yaml``).

    Dispatches on ``cfg.kind`` (default: ``cfg.name``); an unknown name is a ConfigError
    that suggests the closest known task.
    """
    raw = _to_plain_dict(cfg)
    if not raw.get("name"):
        raise ConfigError(f"task config needs a name; known tasks: {', '.join(TASKS.names())}")
    kind = raw.get("kind") or raw["name"]
    return TASKS.get(str(kind))(raw)
