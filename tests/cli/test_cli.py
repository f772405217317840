"""The `visionblocks` command: --version, list."""

from __future__ import annotations

import subprocess
import sys

import pytest

import visionblocks
from visionblocks.cli import main
from visionblocks.registry import LOSSES


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"visionblocks {visionblocks.__version__}"


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "usage: visionblocks" in capsys.readouterr().out


def test_list_all_registries(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("backbones", "necks", "heads", "losses", "layers", "initializers", "datasets"):
        assert f"\n{name} (" in f"\n{out}"


def test_list_one_registry_shows_names_and_aliases(capsys):
    LOSSES.register(dict, name="cli_test_loss", aliases=("ctl",))
    try:
        assert main(["list", "losses"]) == 0
    finally:
        LOSSES._remove("cli_test_loss")
    out = capsys.readouterr().out
    assert out.startswith("losses (")
    assert "  cli_test_loss  (aliases: ctl)" in out


def test_list_backbones_names_the_timm_family(capsys):
    assert main(["list", "backbones"]) == 0
    out = capsys.readouterr().out
    assert "  timm/<name>  (a family of names" in out
    assert main(["list", "losses"]) == 0
    assert "<name>" not in capsys.readouterr().out


def test_list_unknown_registry_is_clear_error(capsys):
    assert main(["list", "losess"]) == 2
    err = capsys.readouterr().err
    assert (
        "unknown registry 'losess'" in err and "Did you mean 'losses'" in err and "kernels" in err
    )


def test_list_kernels(capsys):
    assert main(["list", "kernels"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("triton:")
    for field in ("interpreter:", "cuda device:", "default impl:", "kernels:       assign,"):
        assert field in out


def test_python_dash_m_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "visionblocks", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert out.stdout.strip() == f"visionblocks {visionblocks.__version__}"


@pytest.mark.parametrize(
    ("registry", "expected"),
    [
        ("backbones", "resnet50"),
        ("losses", "focal"),
        ("layers", "conv_norm_act"),
        ("initializers", "kaiming"),
        ("datasets", "coco_detection"),
        ("necks", "fpn"),
        ("heads", "fcos"),
        ("models", "detector"),
    ],
)
def test_list_in_a_fresh_process_shows_builtin_entries(registry, expected):
    """Built-in entries register lazily: a cold `visionblocks list NAME` must show them."""
    out = subprocess.run(
        [sys.executable, "-m", "visionblocks", "list", registry], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert f"\n  {expected}" in out.stdout, out.stdout
    assert not out.stdout.startswith(f"{registry} (0)")
