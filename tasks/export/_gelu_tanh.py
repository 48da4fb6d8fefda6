"""A tanh GELU written out as the ops of its formula, for the XNNPACK delegate.

ExecuTorch's XNNPACK lowering maps aten.gelu to XNNPACK's exact (erf) GELU whatever its
`approximate` argument says (executorch/backends/xnnpack/operators/op_gelu.py passes no
such flag), so Gemma's gelu_pytorch_tanh would run as another function there (logits off by
~5e-4 on the tiny preset). Before lowering, a tanh GELU becomes 0.5 x (1 + tanh(sqrt(2/pi)
(x + 0.044715 x^3))), which XNNPACK runs as mul, add and tanh; an exact GELU stays one op.
"""

from __future__ import annotations

import math
from typing import Any


def _tanh_gelus(program: Any) -> int:
    # lazy: torch, only in a job's process
    import torch

    gelu = torch.ops.aten.gelu.default
    return sum(1 for n in program.graph.nodes if n.target is gelu and n.kwargs.get("approximate") == "tanh")


def write_out_tanh_gelu(program: Any) -> Any:
    """The exported program with every tanh GELU decomposed (the same program when it has none)."""
    # lazy: torch, only in a job's process
    import torch

    if not _tanh_gelus(program):
        return program

    def gelu(x, approximate: str = "none"):
        if approximate != "tanh":
            return NotImplemented  # exact GELU: traced as the op itself, XNNPACK's own
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1 + torch.tanh(inner))

    return program.run_decompositions({torch.ops.aten.gelu.default: gelu})
