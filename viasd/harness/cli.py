"""The command line of the Hydra entry points, checked before Hydra runs it: one line per mistake.

Hydra answers a typo in a config group option (``pair=tiny-llamma``) with its 20-line option
list, a typo in a key (``pairr=…``) or a value of the wrong type (``seed=abc``, typed by
:class:`~viasd.harness.config.RunConfig` and the other schemas) with a several-line report.
:func:`check_command_line` composes the command line the way Hydra is about to (a multirun: its
fixed overrides, and every value of a swept config group against that group's options) and
raises one :class:`~viasd.errors.ConfigError` line instead, in the registries' wording
(:func:`viasd.registry.unknown_name`): ``unknown pair 'tiny-llamma'. Did you mean 'tiny-llama'?
Known pairs: …``. :func:`hydra_error_line` is that line for any composition error (the grid
callback reports a cell that does not compose with it); :func:`check_argv` is the entry points'
call (``error: …`` on stderr, exit status 2).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf

from viasd.errors import ConfigError, one_line_errors
from viasd.paths import PROJECT_ROOT
from viasd.registry import unknown_name

CONF_DIR = PROJECT_ROOT / "conf"

__all__ = ["CONF_DIR", "hydra_error_line", "group_options", "check_command_line", "check_argv", "python_command"]

_NOISE = ("object_type=", "reference_type=", "Set the environment variable HYDRA_FULL_ERROR", "Config search path", "provider=")


def python_command() -> str:
    """How to invoke this interpreter in a hint the user copies: ``python`` when that is what ``python``
    on ``PATH`` runs (an activated venv), else this interpreter's path (``.venv/bin/python`` relative to
    the current folder when under it), so ``<it> -m experiments.…`` works outside the venv too."""
    exe = Path(sys.executable)
    on_path = shutil.which("python")
    if on_path and Path(on_path).absolute() == exe.absolute():
        return "python"
    return str(exe.relative_to(Path.cwd())) if exe.is_relative_to(Path.cwd()) else os.fspath(exe)


def _option_error(missing: str, options: list[str]) -> ConfigError:
    """``unknown pair 'x'. Did you mean …`` for a missing ``group/name`` (``scale/fig_gap/x``: a fig_gap scale)."""
    group, _, name = missing.rpartition("/")
    parts = group.split("/")
    kind = group if parts[0] == "hydra" or len(parts) == 1 else f"{parts[-1]} {parts[0]}"
    return unknown_name(kind, name, [o for o in options if not o.startswith("base_")])


def hydra_error_line(e: BaseException) -> str:
    """One line for a Hydra/OmegaConf composition error: a missing group option with the closest
    known one, else the messages of the exception and its causes joined, Hydra's hints kept."""
    if isinstance(e, MissingConfigException) and "/" in str(e.missing_cfg_file or ""):
        return str(_option_error(str(e.missing_cfg_file), list(e.options or [])))
    parts: list[str] = []
    err: BaseException | None = e
    while err is not None:
        for line in str(err).splitlines():
            line = line.strip().rstrip(".")
            if line and not line.startswith(_NOISE) and not line.startswith("full_key:") and line not in parts:
                parts.append(line)
        err = err.__cause__
    return "; ".join(parts) or type(e).__name__


def group_options(group: str) -> list[str]:
    """The options of config group ``group`` (``pair``, ``hydra/launcher`` …; [] if it is not a group).
    Call inside an initialized Hydra (:func:`check_command_line` does)."""
    return list(GlobalHydra.instance().config_loader().get_group_options(group))


def _key_error(key: str, cfg: DictConfig) -> ConfigError | None:
    """``unknown config key 'method.gama'. Did you mean 'method.gamma'?`` when ``key`` is not in ``cfg``."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    if not isinstance(node, DictConfig) or leaf in node:
        return None
    prefix = f"{parent}." if parent else ""
    return unknown_name("config key", key, [prefix + str(k) for k in node.keys()])


def _compose_error(e: Exception, fixed: list[str], config_name: str) -> ConfigError:
    """The one-line error for composing ``fixed``; an unknown key gets the closest known key."""
    m = re.match(r"Could not override '([^']+)'", str(e))
    if m and "No match in the defaults list" not in str(e) and not m.group(1).startswith("hydra"):
        rest = [o for o in fixed if o.split("=", 1)[0].lstrip("+~") != m.group(1)]
        try:
            key_error = _key_error(m.group(1), compose(config_name=config_name, overrides=rest))
        except Exception:  # another override fails too: report the first one as Hydra words it
            key_error = None
        if key_error is not None:
            return key_error
    return ConfigError(hydra_error_line(e))


def check_command_line(args: list[str], config_name: str = "config") -> None:
    """Raise a one-line ConfigError for the first override in ``args`` (a Hydra command line, flags
    included) that Hydra would reject: a config group option, a key, a value's type, the syntax.

    Command lines that name another config folder or ask Hydra for help are left to Hydra.
    """
    try:
        ns = get_args_parser().parse_args(args)
    except SystemExit:  # an unknown flag: Hydra's own usage message says it
        return
    if ns.help or ns.hydra_help or ns.info or ns.shell_completion or ns.config_path or ns.config_dir or (
            ns.config_name not in (None, config_name)):
        return
    parser, parsed = OverridesParser.create(), []
    for arg in ns.overrides:
        try:
            parsed += parser.parse_overrides([arg])
        except Exception as e:
            raise ConfigError(f"{arg}: {hydra_error_line(e)}") from None
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            compose(config_name=config_name, overrides=fixed, return_hydra_config=True)
        except Exception as e:
            raise _compose_error(e, fixed, config_name) from None
        for o in parsed:
            if not o.is_sweep_override() or not (options := group_options(o.key_or_group)):
                continue
            try:
                values = [str(v) for v in o.sweep_string_iterator()]
            except Exception:  # a range or glob sweep over a group: Hydra expands and checks it
                continue
            for v in values:
                if v not in options and "${" not in v:
                    raise _option_error(f"{o.key_or_group}/{v}", options)


def check_argv(config_name: str = "config") -> None:
    """:func:`check_command_line` on ``sys.argv``: a mistake ends the command with ``error: …`` (exit 2)."""
    with one_line_errors():
        check_command_line(sys.argv[1:], config_name)
