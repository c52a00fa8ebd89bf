"""Registries: lazy entries are imported on first use only, and keep duplicates and typo hints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from viasd.errors import ConfigError
from viasd.registry import Registry

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def widget_module(tmp_path, monkeypatch):
    """A throwaway module ``lazy_widgets`` (not imported yet) defining ``make``."""
    (tmp_path / "lazy_widgets.py").write_text("def make():\n    return 'made'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_widgets", raising=False)
    yield "lazy_widgets"
    sys.modules.pop("lazy_widgets", None)


def test_lazy_entry_is_imported_on_first_get_only(widget_module):
    reg: Registry = Registry("widget")
    reg.register("eager")(len)
    reg.register_lazy("lazy", f"{widget_module}:make")
    assert "lazy" in reg and reg.names() == ["eager", "lazy"] and list(reg) == ["eager", "lazy"]
    assert widget_module not in sys.modules  # listing and membership import nothing
    make = reg.get("lazy")
    assert widget_module in sys.modules and make() == "made"
    assert reg.get("lazy") is make and reg.names() == ["eager", "lazy"]


def test_lazy_entries_keep_duplicate_errors_and_typo_suggestions(widget_module):
    reg: Registry = Registry("widget")
    reg.register_lazy("smollm2", f"{widget_module}:make")
    with pytest.raises(ValueError, match="duplicate widget name 'smollm2'"):
        reg.register("smollm2")(len)
    with pytest.raises(ValueError, match="duplicate widget name 'smollm2'"):
        reg.register_lazy("smollm2", "json:dumps")
    reg.register("tiny")(len)
    with pytest.raises(ValueError, match="duplicate widget name 'tiny'"):
        reg.register_lazy("tiny", "json:dumps")
    with pytest.raises(ConfigError, match=r"unknown widget 'smolm2'\. Did you mean 'smollm2'\?.*smollm2, tiny"):
        reg.get("smolm2")
    assert widget_module not in sys.modules
    with pytest.raises(ValueError, match=r"expected 'package.module\[:attribute\]'"):
        reg.register_lazy("bad", "json:")


def test_a_wrong_lazy_path_fails_loudly_on_get():
    reg: Registry = Registry("widget")
    reg.register_lazy("gone", "viasd.no_such_module:thing")
    with pytest.raises(ModuleNotFoundError, match="viasd.no_such_module"):
        reg.get("gone")


def test_smollm2_pair_loader_is_lazy_and_models_do_not_import_distill():
    """The models layer names the smollm2 loader without importing the distill package."""
    code = ("import sys; from viasd.models.pairs import PAIR_LOADERS; "
            "assert 'smollm2' in PAIR_LOADERS.names(), PAIR_LOADERS.names(); "
            "assert not [m for m in sys.modules if m.startswith('viasd.distill')], 'distill imported early'; "
            "from viasd.distill.pair import load_smollm2_pair; "
            "assert PAIR_LOADERS.get('smollm2') is load_smollm2_pair")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_module_form_lazy_entry_registers_through_the_decorator_and_aliases_resolve(tmp_path, monkeypatch):
    """``register_lazy(name, "pkg.mod")``: importing the module runs ``register(name)``; an alias reaches it."""
    reg: Registry = Registry("widget")
    monkeypatch.setitem(sys.modules, "widget_reg", type(sys)("widget_reg"))
    sys.modules["widget_reg"].REG = reg
    (tmp_path / "decorated_widgets.py").write_text(
        "from widget_reg import REG\n\n@REG.register('deco')\ndef deco():\n    return 'deco'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg.register_lazy("deco", "decorated_widgets")
    reg.alias("old_deco", "deco")
    assert "old_deco" in reg and reg.names() == ["deco"]
    assert reg.get("old_deco")() == "deco" and reg.get("deco") is reg.get("old_deco")
    with pytest.raises(ValueError, match="duplicate widget name 'old_deco'"):
        reg.register("old_deco")(len)
    sys.modules.pop("decorated_widgets", None)


def test_methods_are_listed_without_importing_them_and_viasd_is_via_sd():
    code = ("import sys; from viasd.methods.registry import METHODS; names = METHODS.names(); "
            "assert 'via_sd' in names and 'viasd' not in names, names; "
            "assert 'viasd.methods.via_sd' not in sys.modules; "
            "assert METHODS.get('viasd') is METHODS.get('via_sd'); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
