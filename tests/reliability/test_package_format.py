"""A package of an older format is refused by every command that reads one, with the advice to
compile again: its files follow another layout (an older ``host/tables.bin``, an indented index),
so nothing of it is read past the manifest's format."""

from __future__ import annotations

import json

import pytest

from guarded import tree
from reliability_corpus import assert_refused

from tileplan.lowering.package import FORMAT


@pytest.mark.parametrize("command", ["validate", "report"])
def test_a_package_of_the_previous_format_is_refused_with_the_advice_to_compile_again(guard, damaged, tmp_path,
                                                                                     command):
    manifest = json.loads((damaged / "manifest.json").read_text())
    manifest["format"] = "tileplan-package/3"
    (damaged / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    (damaged / ".tileplan-package").write_text("tileplan-package/3\n")
    before = tree(damaged)
    line = assert_refused(guard.run([command, str(damaged)], tmp_path, timeout=60), "manifest.json",
                          "'tileplan-package/3'", repr(FORMAT))
    assert "compile the model again" in line
    assert tree(damaged) == before
