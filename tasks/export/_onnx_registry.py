"""torch.onnx's table of ATen -> ONNX functions, built once by the export server before it
forks (this module is in tasks/export/onnx.py's PRELOAD: importing it does the work).

`torch.onnx.export` builds that table anew on every call (`ONNXRegistry.from_torchlib`):
0.48-0.67 s in a child forked from a server that had not built it, 0.15 s in one whose
server had (measured here). Most of it is onnxscript's `get_torchlib_ops` (0.38 s), which
derives each of ~560 functions' IR from the function's source only to read its domain.
Here that list is made once and onnxscript's function returns a copy of it (from_torchlib
only reads it: each export still builds its own registry from it), and one registry is
built, so the lookups its first build makes are done; the children inherit both. Nothing
here touches a tensor or starts a thread: safe to do before a fork."""

from __future__ import annotations

import onnxscript._framework_apis.torch_2_11 as apis  # the module torch.onnx's exporter calls
from torch.onnx._internal.exporter import _registration

TORCHLIB_OPS = tuple(apis.get_torchlib_ops())


def torchlib_ops() -> list:
    return list(TORCHLIB_OPS)


apis.get_torchlib_ops = torchlib_ops
_registration.ONNXRegistry.from_torchlib()
