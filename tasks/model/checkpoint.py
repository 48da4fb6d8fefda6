"""Every rule a local checkpoint folder must meet, checked with the standard library alone
(a Hugging Face id is resolved to its snapshot folder first: tasks/model/hub.py).

The driver reads a checkpoint here before any work (its family, its config, its name) and
the worker checks it again here before loading it, so each rule has one home. A refusal is
a ConfigError of one line naming `model.checkpoint`, the value and what was expected.
Weights are read as safetensors headers only (8-byte little-endian length, then JSON):
the tensors' names and shapes are compared with config.json, never their data.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.model import families
from tasks.specs import ConfigError

CONFIG = "config.json"
SINGLE = "model.safetensors"  # what transformers' from_pretrained loads, or the index below
INDEX = "model.safetensors.index.json"
PICKLES = (".bin", ".pt", ".pth", ".ckpt")  # pickle formats: never loaded
MAX_HEADER = 100 << 20  # a header larger than this is no safetensors header
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}  # fmt: skip
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")  # as orchestrator.plan.config.safe_name
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Checkpoint:
    root: Path  # resolved
    config: dict[str, Any]  # its config.json
    family: str  # the model.family of its model_type
    shapes: dict[str, list[int]]  # tensor name -> shape, from the safetensors headers
    revision: str | None = None  # a Hugging Face id's commit (tasks.model.hub); None for a folder

    @property
    def name(self) -> str:
        """What its variants are called: its folder's name when that is a usable name (a
        Hugging Face cache snapshot: its repository's), else its family."""
        folder = self.root.name
        if self.root.parent.name == "snapshots" and self.root.parent.parent.name.startswith("models--"):
            folder = self.root.parent.parent.name.rsplit("--", 1)[-1]
        return folder if NAME.fullmatch(folder) and ".." not in folder else self.family


def read_checkpoint(path: str | None, label: str | None = None, shapes: dict[str, list[int]] | None = None) -> Checkpoint:
    """The checkpoint at `path`, every rule checked; a ConfigError naming the first one broken.
    `label`: what the error names instead of `path` (a Hugging Face id and its commit);
    `shapes`: the tensors' shapes read elsewhere (a Hub id's safetensors headers, by HTTP
    range), checked against config.json instead of the folder's weights files."""

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"model.checkpoint={label or repr(path)}: {why}")

    if path is None or not str(path).strip():
        raise refuse("empty; name a local Hugging Face model folder or a Hub id ORG/NAME, or null (model.checkpoint=null) for the preset")
    root = Path(path).expanduser()
    if not root.exists():
        raise refuse("no such folder; expected a local Hugging Face model folder (save_pretrained output) or a Hub id ORG/NAME")
    if not root.is_dir():
        raise refuse("is not a folder; expected a local Hugging Face model folder (save_pretrained output)")
    root = root.resolve()
    config = _config(root, refuse)
    try:
        family = families.family_of(config["model_type"])
        families.check_architecture(config)
    except ValueError as e:
        raise refuse(str(e)) from None
    if config.get("quantization_config"):
        quant = config["quantization_config"]
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise refuse(f"{CONFIG} has a quantization_config (quant_method={method!r}); load full-precision weights")
    try:
        shapes = _weights(root, refuse) if shapes is None else shapes
    except OSError as e:  # a folder or file this user cannot read
        raise refuse(f"cannot read {e.filename or root} ({e.strerror or e})") from None
    _check_shapes(family, config, shapes, refuse)
    return Checkpoint(root, config, family, shapes)


def _config(root: Path, refuse) -> dict[str, Any]:
    path = root / CONFIG
    if not path.is_file():
        raise refuse(f"no {CONFIG} there; expected a local Hugging Face model folder (save_pretrained output)")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise refuse(f"{CONFIG} is not readable JSON ({e})") from None
    if not isinstance(config, dict):
        raise refuse(f"{CONFIG} holds a {type(config).__name__}, not an object")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise refuse(f"{CONFIG} has no model_type (got {model_type!r}); transformers needs it to choose the model")
    return config


def _weights(root: Path, refuse) -> dict[str, list[int]]:
    """Tensor name -> shape over the files transformers would load: the index's shards, or model.safetensors."""
    if (root / INDEX).is_file():
        try:
            weight_map = json.loads((root / INDEX).read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise refuse(f"{INDEX} is not readable JSON with a weight_map ({type(e).__name__}: {e})") from None
        missing = [f for f in files if not (root / f).is_file()]
        if missing:
            raise refuse(f"{INDEX} names shard(s) not there: {', '.join(missing[:3])}")
    elif (root / SINGLE).is_file():
        weight_map, files = None, [SINGLE]
    else:
        others = sorted(p.name for p in root.glob("*.safetensors"))
        pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLES)
        if others:
            raise refuse(f"found {', '.join(others[:3])} but neither {SINGLE} nor {INDEX}, which transformers loads")
        hint = f" (found {', '.join(pickles[:3])}: pickle weights are never loaded)" if pickles else ""
        raise refuse(f"no *.safetensors weights{hint}")
    shapes: dict[str, list[int]] = {}
    for name in files:
        header = _header(root / name, refuse)
        for tensor, info in header.items():
            if tensor == "__metadata__":
                continue
            shapes[tensor] = info["shape"]
        if weight_map is not None:
            absent = [t for t, f in weight_map.items() if f == name and t not in header]
            if absent:
                raise refuse(f"{INDEX} puts {absent[0]} in {name}, which does not hold it")
    return shapes


def _header(path: Path, refuse) -> dict[str, Any]:
    """A safetensors file's header, checked against the file's size."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(size - 8, MAX_HEADER):
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
        if not isinstance(header, dict):
            raise ValueError("the header is not an object")
        end = 0
        for tensor, info in header.items():
            if tensor == "__metadata__":
                continue
            shape, (begin, stop) = info["shape"], info["data_offsets"]
            if not all(isinstance(d, int) and d >= 0 for d in shape) or not 0 <= begin <= stop:
                raise ValueError(f"{tensor}: shape {shape}, offsets {[begin, stop]}")
            width = DTYPE_BYTES.get(info["dtype"])
            if width is not None and stop - begin != math.prod(shape) * width:
                raise ValueError(f"{tensor}: {stop - begin} bytes for {info['dtype']} {shape}")
            end = max(end, stop)
    except (struct.error, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise refuse(f"{path.name} is not a readable safetensors file ({e})") from None
    if 8 + length + end > size:
        raise refuse(f"{path.name} is truncated: its header needs {8 + length + end} bytes, the file has {size}")
    return header


def _check_shapes(family: str, config: dict[str, Any], shapes: dict[str, list[int]], refuse) -> None:
    """The tensors agree with config.json: layer count, embedding, attention projections."""
    try:
        dims = families.model_dims(family, config)
        hidden = config.get("hidden_size") or families.get_family(family).defaults["hidden_size"]
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise refuse(f"{CONFIG} lacks or mistypes {e}") from None
    layers = sorted({int(m.group(1)) for t in shapes if (m := LAYER.search(t))})
    if layers != list(range(dims["layers"])):
        got = f"{len(layers)} (indices {layers[0]}..{layers[-1]})" if layers else "none"
        raise refuse(f"{CONFIG} says num_hidden_layers={dims['layers']}; the weights hold layers: {got}")
    q, kv = dims["heads"] * dims["head_dim"], dims["kv_heads"] * dims["head_dim"]
    adapter = families.get_family(family).attention
    want = {"embed_tokens": [dims["vocab"], hidden], "lm_head": [dims["vocab"], hidden]}
    if adapter.fused:
        want[f"self_attn.{adapter.projections[0]}"] = [q + 2 * kv, hidden]
    else:
        for proj, rows in zip(adapter.projections, (q, kv, kv), strict=True):
            want[f"self_attn.{proj}"] = [rows, hidden]
    want[f"self_attn.{adapter.o_proj}"] = [hidden, q]
    if not any(t.endswith("embed_tokens.weight") for t in shapes):
        raise refuse("the weights hold no embed_tokens.weight")
    for part, expected in want.items():
        for tensor, shape in shapes.items():
            if tensor.endswith(f"{part}.weight") and shape != expected:
                raise refuse(
                    f"{tensor} has shape {shape}, config.json implies {expected} (vocab_size={dims['vocab']}, "
                    f"hidden_size={hidden}, heads={dims['heads']}, kv_heads={dims['kv_heads']}, "
                    f"head_dim={dims['head_dim']})"
                )
