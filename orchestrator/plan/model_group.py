"""The model group's schema: its checks, and its architecture (a size preset's, or a
checkpoint's config.json, a Hugging Face id resolved first) checked against its family."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from orchestrator.plan.checks import safe_name
from tasks.model.checkpoint import read_checkpoint
from tasks.model.families import FAMILIES, check_attention, estimated_parameters, graph_scalings, model_dims
from tasks.model.hub import hub_checkpoint, is_hub_id
from tasks.specs import (
    ATTENTIONS,
    DTYPES,
    GROUPED_QUANTS,
    KV_CACHES,
    ConfigError,
    check_model_choices,
    check_quant,
    choice,
    resolve_attention,
)


@dataclass
class ModelCfg:
    name: str
    family: str
    size: str
    sizes: dict[str, Any]
    checkpoint: str | None = None
    dtype: str = "float32"
    seed: int = 0
    kv_cache: str = "static"
    attention: str = "sdpa"
    quant: str = "none"
    quant_group: int = 32
    revision: str | None = None  # a Hub id's branch, tag or commit (null: its default branch); once read, the commit

    def check(self) -> None:
        safe_name("model.name", self.name)
        if self.revision is not None and not (self.checkpoint and is_hub_id(self.checkpoint)):
            raise ConfigError(
                f"model.revision={self.revision!r} with model.checkpoint={self.checkpoint!r}: a revision chooses a "
                "commit of a Hugging Face id (model.checkpoint=ORG/NAME, no local path of that name); leave it null"
            )
        choice("model.family", self.family, FAMILIES)
        choice("model.size", self.size, self.sizes)
        choice("model.dtype", self.dtype, DTYPES)
        choice("model.kv_cache", self.kv_cache, KV_CACHES)
        choice("model.attention", self.attention, ("auto", *ATTENTIONS))  # auto: resolved with the architecture
        check_quant(self.quant, self.quant_group)
        if self.attention != "auto":
            check_model_choices(self.kv_cache, self.attention)

    def architecture(self, chosen: str | None = None, named: bool = False) -> tuple[dict[str, Any], int | None]:
        """The transformers config, the size preset's or the checkpoint's config.json, and a
        checkpoint's exact parameter count (from its tensors' shapes; None for a preset). A
        checkpoint (tasks.model.checkpoint: every rule, before any work) sets the family and,
        unless `named` (model.name given), the name; `chosen`: the command line's `model=` or
        `model.family=`, refused when its family is not the checkpoint's. A Hugging Face id
        (tasks.model.hub) is resolved first: `revision` becomes the commit it names."""
        if self.checkpoint is None:
            return dict(self.sizes[self.size]), None
        if is_hub_id(self.checkpoint):
            ckpt = hub_checkpoint(self.checkpoint, self.revision)
            self.revision = ckpt.revision
        else:
            ckpt = read_checkpoint(self.checkpoint)
        if ckpt.family != self.family:
            if chosen is not None:
                raise ConfigError(
                    f"{chosen} (family {self.family}) and model.checkpoint={self.checkpoint!r} (family "
                    f"{ckpt.family}, config.json model_type={ckpt.config['model_type']!r}) disagree; leave model= out "
                    "and the checkpoint chooses"
                )
            self.family = ckpt.family
        if not named:
            self.name = ckpt.name
        return ckpt.config, sum(math.prod(shape) for shape in ckpt.shapes.values())


Model = tuple[dict[str, Any], dict[str, int], int]  # arch, dims, parameters (a checkpoint's exact, else estimated)


def architecture(model: ModelCfg, chosen: str | None, named: bool) -> Model:
    arch, parameters = model.architecture(chosen, named)
    try:
        dims = model_dims(model.family, arch)
        parameters = parameters or estimated_parameters(model.family, arch)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"model.checkpoint={model.checkpoint!r}: config.json lacks {e}") from None
    if model.attention == "auto":  # soft-capped scores need math; else the kv_cache's own attention
        capped = graph_scalings(model.family, arch)["attention_softcap"] is not None
        model.attention = (
            "math" if capped and model.kv_cache != "update_cache" else resolve_attention(model.kv_cache, "auto")
        )
    if (
        model.quant in GROUPED_QUANTS and arch.get("hidden_size", 0) % model.quant_group
    ):  # every linear but down_proj reads it
        raise ConfigError(
            f"model.quant_group={model.quant_group} does not divide the model's hidden size {arch['hidden_size']} "
            f"(model.quant={model.quant}): choose a group that does"
        )
    try:  # what the config asks of the attention scores (soft-capping needs model.attention=math)
        check_attention(model.family, arch, model.attention, model.kv_cache)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return arch, dims, parameters
