"""The torch importer without torch: one clear error naming the extra to install."""

from __future__ import annotations

import sys

import pytest

from tileplan.errors import TileplanError
from tileplan.graph import torch as tp_torch


def test_missing_torch_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)      # makes `import torch` raise ImportError
    with pytest.raises(TileplanError, match=r"install the torch extra: pip install torch==2\.13\.0"):
        tp_torch.from_module(object(), ())
