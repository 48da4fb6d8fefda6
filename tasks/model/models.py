"""Build a causal LM from a preset (seeded random weights) or a local checkpoint."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.model import families
from tasks.model.checkpoint import read_checkpoint
from tasks.specs import DTYPES, ModelSpec

if TYPE_CHECKING:
    import torch


def torch_dtype(name: str) -> torch.dtype:
    import torch  # lazy: torch, only in a job's process

    if name not in DTYPES:
        raise ValueError(f"model.dtype={name!r} is not supported; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def _classes(family: str):
    """The family's transformers (config class, model class), from tasks.model.families.FAMILIES."""
    fam = families.get_family(family)
    transformers = importlib.import_module("transformers")
    return getattr(transformers, fam.config_class), getattr(transformers, fam.model_class)


def check_checkpoint(path: str) -> Path:
    """The checkpoint folder, every rule of tasks.model.checkpoint checked again where it is loaded."""
    return read_checkpoint(path).root


def build_model(spec: ModelSpec) -> torch.nn.Module:
    """The reference transformers model, in eval mode, on CPU."""
    import torch  # lazy: torch, only in a job's process

    config_cls, model_cls = _classes(spec.family)
    dtype = torch_dtype(spec.dtype)
    if spec.checkpoint:
        root = check_checkpoint(spec.checkpoint)
        model = model_cls.from_pretrained(str(root), use_safetensors=True, dtype=dtype, attn_implementation="eager")
    else:
        config = config_cls(**spec.arch, attn_implementation="eager")  # the reference: plain softmax attention
        torch.manual_seed(spec.seed)
        model = model_cls(config).to(dtype)
    return model.eval()


def model_family(model: torch.nn.Module) -> str:
    """The model.family of a built model, from its config's model_type."""
    return families.family_of(model.config.model_type)


def model_dims(model: torch.nn.Module) -> dict[str, int]:
    """Sizes the phase inputs are generated from (tasks.model.families.model_dims of its config)."""
    return families.model_dims(model_family(model), model.config.to_dict())


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def embedding_facts(model: torch.nn.Module) -> dict[str, int]:
    """What a decode step reads of the embeddings: the input table's size, its row width,
    and whether the output head shares it (then the head reads the whole table anyway)."""
    table = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    return {
        "embedding_parameters": table.numel(),
        "hidden_size": table.shape[1],
        "tied_embeddings": int(head is not None and head.weight.data_ptr() == table.data_ptr()),
    }
