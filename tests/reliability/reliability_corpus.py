"""Shared pieces of the bad-input corpus: the refusal contract and the manifest re-hash.

The contract (README, "Errors"): exit status 2, exactly one line on stderr starting
``error: ``, naming the file, no traceback.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
SMOKE = FIXTURES / "mlp_smoke_fp8.toml"


def assert_refused(result, *named: str) -> str:
    """``result`` = (code, out, err) of a CLI run that must be refused; returns the error line."""
    code, _, err = result
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for word in named:
        assert str(word) in lines[0], (word, lines[0])
    return lines[0]


def rehash(pkg: Path) -> None:
    """Recompute the manifest's digests after an edit: the damage must be found by the content checks."""
    mpath = pkg / "manifest.json"
    manifest = json.loads(mpath.read_text())
    manifest["files"] = {n: hashlib.sha256((pkg / n).read_bytes()).hexdigest() for n in manifest["files"]}
    mpath.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def fresh_copy(package: Path, tmp_path: Path) -> Path:
    """A copy of a session package in this test's folder, to damage or validate in place."""
    dst = tmp_path / "pkg"
    shutil.copytree(package, dst)
    return dst
