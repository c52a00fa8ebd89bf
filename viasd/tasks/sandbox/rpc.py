"""The checks' side of a sandboxed sample: they run here, in the harness, never in the program's process.

This module owns :class:`Link` (the harness's end of a sample's pipes: its output, read
against the deadline and the output cap, and the request/reply channel to the driver) and
:func:`run_checks`, which executes a sample's checks in a namespace of their own whose
unknown names resolve to the program's: a function becomes a stub that calls it in the
program's process (arguments and the return value cross as plain data through
:mod:`viasd.tasks.sandbox.codec`; an exception comes back as its class name), a module the
program imported under its own name is the harness's copy of it when the module is one of
:data:`CHECK_MODULES` (imported when this module loads; nothing is ever imported, evaluated or
called here by a name the program supplies), a plain value is copied. The verdict is decided
here, so nothing the program does to its own process can reach the checks' code, their
builtins or the verdict, and whatever the checks raise (``SystemExit`` included) is the
sample's failure. Design in ``docs/sandbox.md``.
"""

from __future__ import annotations

import ast
import bisect
import builtins
import cmath
import collections
import copy
import functools
import heapq
import itertools
import math
import operator
import os
import random
import re
import select
import string
import subprocess
import sys
import threading
import time
import traceback
from types import MappingProxyType, ModuleType

from viasd.tasks.sandbox.codec import FRAME_HEADER, CrossError, decode, encode, frame, unframe_length
from viasd.tasks.sandbox.scripts import READY

__all__ = [
    "CHECK_MODULES", "CandidateError", "Link", "LinkClosed", "builtin_shadows", "converse", "run_checks",
]  # fmt: skip

SERVING = b"serving\n"

#: The modules a check may take from the program's namespace without importing them itself (MBPP 596's
#: checks call ``sys.getsizeof`` after the program's ``import sys``), by name: fixed here, imported when
#: this module loads, none with side effects on import. A name the checks look up that the program says
#: is a module resolves to this table's entry of *that same name* (``import math`` binds ``math`` to
#: the module ``math``) and to nothing else: the module name the program answers with never reaches an
#: import, so a program cannot make the scorer import (and run) ``venv.__main__``, ``antigravity``, …
CHECK_MODULES: MappingProxyType[str, ModuleType] = MappingProxyType({
    m.__name__: m
    for m in (bisect, cmath, collections, copy, functools, heapq, itertools, math, operator, random, re,
              string, sys)
})  # fmt: skip


class LinkClosed(Exception):
    """The sample stopped answering: ``stop`` is ``"timeout"``, ``"output"`` or ``"exited"``."""

    def __init__(self, stop: str):
        super().__init__(stop)
        self.stop = stop


class CandidateError(Exception):
    """Raised in the checks for an exception of the program that is not a builtin one."""


class Link:
    """The harness's end of one sample's pipes (``out_r`` output, ``res_r`` replies, ``req_w`` requests).

    The deadline is ``setup_s + timeout_s`` until the driver says ``READY``, then
    ``timeout_s`` from that moment; output past ``max_output`` bytes stops the sample.
    """

    def __init__(self, proc: subprocess.Popen, out_r: int, res_r: int, req_w: int, timeout_s: float,
                 max_output: int, setup_s: float, keep_chars: int = 2000) -> None:  # fmt: skip
        self.proc, self.out_r, self.res_r, self.req_w = proc, out_r, res_r, req_w
        self.timeout_s, self.max_output, self.keep_chars = timeout_s, max_output, keep_chars
        self.deadline = time.monotonic() + setup_s + timeout_s
        self.tail, self.total, self.buf, self.started = bytearray(), 0, bytearray(), False
        self.channel = bytearray()  # everything before the calls: READY, setup lines, the program's record
        self.open = {out_r, res_r}

    def _pump(self) -> None:
        """Wait for more bytes on either pipe (raises LinkClosed at the deadline, output cap or EOF)."""
        now = time.monotonic()
        if now >= self.deadline:
            raise LinkClosed("timeout")
        if self.res_r not in self.open:
            raise LinkClosed("exited")
        ready, _, _ = select.select(list(self.open), [], [], min(self.deadline - now, 0.25))
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:
                self.open.discard(fd)
            elif fd == self.out_r:
                self.total += len(data)
                self.tail += data
                del self.tail[: -4 * self.keep_chars]
                if self.total > self.max_output:
                    raise LinkClosed("output")
            else:
                self.buf += data
                if len(self.buf) > self.max_output + FRAME_HEADER:
                    raise LinkClosed("output")

    def line(self) -> bytes:
        """The next line of the result pipe (READY restarts the deadline at ``timeout_s``)."""
        while b"\n" not in self.buf:
            self._pump()
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf[:] = rest
        self.channel += line + b"\n"
        if not self.started and line + b"\n" == READY:
            self.started, self.deadline = True, time.monotonic() + self.timeout_s
        return line + b"\n"

    def call(self, request: tuple):
        """Send one request; the decoded reply (CrossError when it is not plain data)."""
        msg = frame(encode(request))
        try:
            os.write(self.req_w, msg)  # requests are small; the pipe buffer holds them
        except (BrokenPipeError, OSError):
            raise LinkClosed("exited") from None
        while len(self.buf) < FRAME_HEADER:
            self._pump()
        n = unframe_length(bytes(self.buf[:FRAME_HEADER]))
        while len(self.buf) < FRAME_HEADER + n:
            self._pump()
        payload = bytes(self.buf[FRAME_HEADER : FRAME_HEADER + n])
        del self.buf[: FRAME_HEADER + n]
        return decode(payload)

    def output(self) -> str:
        """The tail of the sample's output (without ``unshare``'s own lines)."""
        text = self.tail.decode("utf-8", "replace")
        lines = [ln for ln in text.splitlines(keepends=True) if not ln.startswith("unshare: ")]
        return "".join(lines)[-self.keep_chars :]

    def drain(self, wait_s: float = 1.0) -> None:
        """Read what is left of the output until both pipes close or ``wait_s`` passes."""
        end = time.monotonic() + wait_s
        while self.open and time.monotonic() < end:
            try:
                self.deadline = end
                self._pump()
            except LinkClosed:
                return


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,79}")


def _exception(name: object) -> type[BaseException]:
    """The class to raise in the checks for the program's exception called ``name``.

    A builtin ``Exception`` subclass is raised as itself (so ``except ValueError`` in the
    checks still works); anything else as a :class:`CandidateError` subclass of that name.
    """
    name = name if type(name) is str and _NAME.fullmatch(name) else "Exception"
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls
    return type(name, (CandidateError,), {})


class _Ref:
    """An object of the program's namespace that is not plain data (MBPP 367's trees): it stays
    in the program's process; passed to one of the program's functions, it is sent by name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<the program's {self.name}>"


class _Remote:
    """A function of the program, called in the program's process."""

    def __init__(self, link: Link, name: str) -> None:
        self._link, self.__name__ = link, name

    def __call__(self, *args, **kwargs):
        refs = {i: a.name for i, a in enumerate(args) if type(a) is _Ref}
        plain = tuple(None if i in refs else a for i, a in enumerate(args))
        reply = self._link.call(("call", self.__name__, plain, kwargs, refs))
        if reply[0] == "ok":
            return reply[1]
        if reply[0] == "raise":
            raise _exception(reply[1])(f"{reply[1]} raised by the program's {self.__name__}")
        raise CrossError(str(reply[1]))

    def __repr__(self) -> str:
        return f"<the program's {self.__name__}>"


# CPython 3.11 keeps ast.parse's recursion depth in per-interpreter state: two samples' harness threads
# parsing at once can raise "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905;
# seen on 3.11.7 with 4 scoring threads under load, a canonical HumanEval solution scored "error"), so
# parses take turns.
_AST_LOCK = threading.Lock()


def builtin_shadows(code: str) -> frozenset[str]:
    """Names of builtins that ``code`` redefines with a top-level ``def`` (MBPP 126 tests its own ``sum``).

    Only these of the program's names take precedence over the checks' builtins, as they would
    in a shared namespace; a builtin rebound any other way (``abs = …``) does not reach the checks.
    """
    try:
        with _AST_LOCK:
            tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    defs = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return frozenset(n for n in defs if hasattr(builtins, n))


class _ChecksGlobals(dict):
    """The checks' globals: their own names and builtins; any other name is the program's."""

    def __init__(self, link: Link, shadows: frozenset[str]) -> None:
        super().__init__(__name__="__checks__", __builtins__=builtins)
        self._link, self._shadows = link, shadows

    def __missing__(self, name: str):
        if hasattr(builtins, name) and name not in self._shadows:
            raise KeyError(name)
        reply = self._link.call(("look", name))
        kind = reply[0]
        if kind == "call":
            value = _Remote(self._link, name)
        elif kind == "module" and reply[1:] == (name,) and name in CHECK_MODULES:
            value = CHECK_MODULES[name]  # never imported by the program's word: a fixed module of that name
        elif kind == "value":
            value = reply[1]
        elif kind == "ref":
            value = _Ref(name)
        else:
            raise KeyError(name)
        self[name] = value
        return value


def run_checks(link: Link, checks: str, shadows: frozenset[str] = frozenset()) -> tuple[str, str, str]:
    """Run ``checks`` here against the program behind ``link``: ``(status, reason, traceback)``.

    ``shadows``: the builtins whose name resolves to the program's (:func:`builtin_shadows`).

    ``("passed", …)`` iff the checks ran to completion; a value that cannot cross fails with
    that reason; anything else the checks raise, ``BaseException`` included (``SystemExit``,
    ``KeyboardInterrupt``), fails the sample; LinkClosed (timeout, output cap, the program
    exited) propagates.
    """
    try:
        exec(compile(checks, "checks.py", "exec"), _ChecksGlobals(link, shadows))  # noqa: S102 - the dataset's checks
    except LinkClosed:
        raise
    except CrossError as e:
        return "failed", f"a value could not cross to the checks: {e}", ""
    except BaseException as e:  # noqa: BLE001 - the checks' verdict: nothing they raise may end the scorer
        return "failed", f"{type(e).__name__} in the checks", traceback.format_exc(limit=-3)
    return "passed", "the checks ran to completion", ""


def converse(link: Link, checks: str, program: str = "") -> tuple[str | None, str, str, str]:
    """Wait for ``program`` to run, then run the checks against it: ``(status, reason, stop, traceback)``.

    ``status`` None: :func:`~viasd.tasks.sandbox.proc.judge` decides from the channel and
    ``stop`` (``"timeout"``, ``"output"``, ``"exited"``, ``"tampered"``).
    """
    try:
        while link.line() != READY:
            pass
        line = link.line()
        if line != SERVING:
            return None, "", "exited" if line.startswith(b"failed program ") else "tampered", ""
        status, reason, trace = run_checks(link, checks, builtin_shadows(program))
        try:
            link.call(("end",))
        except (LinkClosed, CrossError):
            pass
        return status, reason, "", trace
    except LinkClosed as e:
        return None, "", e.stop, ""
    except CrossError:
        return None, "", "tampered", ""
