"""Fixtures of the bad-input corpus: small compiled packages to damage (see reliability_corpus)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reliability_corpus import FIXTURES, SMOKE, fresh_copy


@pytest.fixture(scope="session")
def small_package(tmp_path_factory) -> Path:
    """The 64-tile smoke MLP compiled once (a TOML model: seeded parameters, no params.npz)."""
    from tileplan.cli import main
    out = tmp_path_factory.mktemp("reliability") / "smoke"
    with pytest.raises(SystemExit) as info:
        main(["compile", str(SMOKE), "-o", str(out), "-j", "1"])
    assert (info.value.code or 0) == 0
    return out


@pytest.fixture(scope="session")
def onnx_package(tmp_path_factory) -> Path:
    """The ONNX smoke MLP compiled once: its package carries params.npz."""
    from tileplan.cli import main
    out = tmp_path_factory.mktemp("reliability") / "onnx"
    with pytest.raises(SystemExit) as info:
        main(["compile", str(FIXTURES / "mlp_smoke_fp8.onnx"), "-o", str(out), "-j", "1", "-t", "ipu21-64"])
    assert (info.value.code or 0) == 0
    assert (out / "params.npz").is_file()
    return out


@pytest.fixture
def damaged(small_package, tmp_path):
    """A fresh copy of the small package to damage."""
    return fresh_copy(small_package, tmp_path)


@pytest.fixture(scope="session")
def guard():
    """The hostile-input runner (``guarded.Guard``): each case in its own forked process under a
    2 GiB address-space limit and a timeout."""
    from guarded import Guard
    g = Guard()
    yield g
    g.close()
