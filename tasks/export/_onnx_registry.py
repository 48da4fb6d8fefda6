"""torch.onnx's table of ATen -> ONNX functions, built once by the export server before it
forks (this module is in tasks/export/onnx.py's PRELOAD: importing it does the work).

`torch.onnx.export` builds that table anew on every call (`ONNXRegistry.from_torchlib`):
onnxscript's `get_torchlib_ops` derives each of its ~560 functions' IR from the function's
source only to read its domain (0.4 s), and the first call in a process resolves every
`torch.ops` overload it names (0.5 s more). A child forked from a server that did neither
paid both on every export. Here the list is made once and onnxscript's function returns
a copy of it (from_torchlib only reads it: each export still builds its own registry from
it), and one registry is built to resolve the overloads, which the children inherit.
Nothing here touches a tensor or starts a thread: safe to do before a fork.
"""

from __future__ import annotations

import onnxscript._framework_apis.torch_2_11 as apis  # the module torch.onnx's exporter calls
from torch.onnx._internal.exporter import _registration

TORCHLIB_OPS = tuple(apis.get_torchlib_ops())


def torchlib_ops() -> list:
    return list(TORCHLIB_OPS)


apis.get_torchlib_ops = torchlib_ops
_registration.ONNXRegistry.from_torchlib()
