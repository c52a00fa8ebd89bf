"""Evaluation tasks, their data, prompts and metrics.

Public interface (see :mod:`viasd.tasks.base`): :class:`Example`, :class:`Task`, the task
registry :data:`TASKS` and :func:`build_task` (a ``conf/task/<name>.yaml`` node → task).
Task kinds are in :mod:`viasd.tasks.families` (one module per family; importing it registers
them), row loading in :mod:`viasd.tasks.loading`, metric modules in
:mod:`viasd.tasks.metrics`, the code sandbox in :mod:`viasd.tasks.sandbox`.
"""

from __future__ import annotations

from viasd.tasks import families  # noqa: F401  (registers the task kinds)
from viasd.tasks.base import TASKS, Example, Task, build_task
from viasd.tasks.loading import load_rows

__all__ = ["Example", "Task", "TASKS", "build_task", "load_rows"]
