"""Weight quantisation of a torch module's linear layers with torchao's public API
(`torchao.quantization.quantize_`), for model.quant (tasks.specs.QUANTS):

- int8: Int8WeightOnlyConfig, symmetric int8 per output channel.
- int4: IntxWeightOnlyConfig(int4, PerGroup(quant_group)). torchao's Int4WeightOnlyConfig has no
  CPU path in the pinned torchao (its tile-packed layout needs CUDA and bfloat16, its plain one
  mslk's CUDA kernels); this is ExecuTorch's own weight-only int4 (`export_llama -qmode 4w`).
- 8da4w: Int8DynamicActivationIntxWeightConfig(int4, PerGroup(quant_group)): int8 activations
  quantised per token at run time, int4 weights per group; ExecuTorch's `-qmode 8da4w`.

Every nn.Linear is quantised, the output head included; embeddings never are, as ExecuTorch's
export_llama does unless asked (`-E`). Group-wise modes skip a linear whose input width is not a
multiple of the group (export_llama's filter); the driver refuses a group that does not divide
the hidden size, so only such a model's down projection can stay float. Scales are chosen by
HQQ (scale only) for the int4 modes, as export_llama does by default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tasks.specs import GROUPED_QUANTS

TORCHAO = ("int8", "int4", "8da4w")  # the model.quant values (tasks.specs.QUANTS) torchao makes here

if TYPE_CHECKING:
    import torch


def config(quant: str, group: int) -> Any:
    """torchao's config for one model.quant value."""
    import torch  # lazy: torch, torchao, only in an export's process
    from torchao.quantization import (  # lazy: torch, torchao, only in an export's process
        Int8DynamicActivationIntxWeightConfig,
        Int8WeightOnlyConfig,
        IntxWeightOnlyConfig,
    )
    from torchao.quantization.granularity import PerGroup  # lazy: torch, torchao, only in an export's process

    if quant == "int8":  # inductor's settings left as they are, so compile compares like with like
        return Int8WeightOnlyConfig(set_inductor_config=False)
    if quant == "int4":
        return IntxWeightOnlyConfig(
            weight_dtype=torch.int4, granularity=PerGroup(group), intx_choose_qparams_algorithm="hqq_scale_only"
        )
    if quant == "8da4w":
        return Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=PerGroup(group), intx_choose_qparams_algorithm="hqq_scale_only"
        )
    raise ValueError(f"model.quant={quant!r} is not torchao's; choose one of: {', '.join(TORCHAO)}")


def quantize(module: torch.nn.Module, quant: str, group: int) -> dict[str, int]:
    """Quantise `module`'s linear layers in place (model.quant=none: nothing); returns how many
    linears were quantised and how many stayed float."""
    import torch  # lazy: torch, torchao, only in an export's process
    from torchao.quantization import quantize_  # lazy: torch, torchao, only in an export's process

    linears = {name: m for name, m in module.named_modules() if type(m) is torch.nn.Linear}
    if quant == "none":
        return {"quantized_linears": 0, "float_linears": len(linears)}
    grouped = quant in GROUPED_QUANTS
    chosen = {name for name, m in linears.items() if not grouped or m.in_features % group == 0}
    with torch.no_grad():
        quantize_(module, config(quant, group), filter_fn=lambda m, fqn: fqn in chosen)
    return {"quantized_linears": len(chosen), "float_linears": len(linears) - len(chosen)}
