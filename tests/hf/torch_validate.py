"""The one check of an imported torch module: compile it onto the 64-tile target and validate the
package on the IPU model against torch's own output (fp16 modules: the same fp16-valued weights,
torch computing in fp32)."""

from __future__ import annotations

import numpy as np
import torch

from tileplan.graph.core import Role
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.sim.validate import validate_package
from tileplan.target import load_target


def compile_and_validate(model, module, x, tmp_path, min_cosine: float | None = 0.999):
    """Compile ``model`` (the import of ``module`` on example input ``x``) onto ipu21-64 and validate
    it against ``module(x)`` (and, unless ``min_cosine`` is None, the output's cosine above it);
    returns (plan, validation)."""
    p, _, path = compile_model(model.graph, load_target("ipu21-64"), tmp_path / "pkg", params=model.params, jobs=1)
    (inp,) = model.graph.by_role(Role.INPUT)
    (out,) = model.graph.by_role(Role.OUTPUT)
    with torch.no_grad():
        want = module.float()(x.float()).numpy()
    np.savez(tmp_path / "inputs.npz", **{inp.name: x.float().numpy()})
    np.savez(tmp_path / "expected.npz", **{out.name: want.reshape(out.shape)})
    v = validate_package(load_package(path), inputs_path=tmp_path / "inputs.npz",
                         expected_path=tmp_path / "expected.npz")
    assert v.passed, v.outputs
    if min_cosine is not None:
        assert v.outputs[out.name]["cosine"] > min_cosine
    return p, v


class Pooled(torch.nn.Module):
    """``model(pixel_values, **forward_kwargs).pooler_output``: a whole vision model's pooled row
    as the one output (``forward_kwargs``: e.g. ``interpolate_pos_encoding=True``)."""

    def __init__(self, model, **forward_kwargs):
        super().__init__()
        self.model, self.forward_kwargs = model, forward_kwargs

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values, **self.forward_kwargs).pooler_output
