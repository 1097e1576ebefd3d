"""Shared fixtures for the graph tests: a writer for small inline model files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def write_model(tmp_path):
    """Write a TOML model (dedented) into tmp_path and return its path."""

    def write(text: str, name: str = "model.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write
