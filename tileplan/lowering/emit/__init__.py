"""Emission: Poplar C++ codelets and the ``host.cpp`` that builds the same graph.

- ``emit_codelets(tile_program, target)`` -> ``{"codelets/<key>.cpp": source}``,
  one file per kernel specialisation the program uses;
- ``codelet_manifest(tile_program, target)`` -> one entry per compute-set group:
  its vertex class, file and field values;
- ``emit_host(tile_program, target, model_name)`` -> ``{"host.cpp": text,
  "host/tables.bin": tables}``: the host program and the binary tables it reads.
"""

from .codelets import codelet_manifest, emit_codelets
from .host import emit_host

__all__ = ["codelet_manifest", "emit_codelets", "emit_host"]
