"""Pruning a decoder-only model in place, before it is saved as a plain Hugging Face model and exported to GGUF.

- magnitude (unstructured): in every linear layer of the decoder blocks, the given share of weights with the
  smallest magnitude set to zero (torch.nn.utils.prune's L1 criterion, made permanent). The file does not shrink
  (GGUF stores dense tensors; llama.cpp has no sparse kernels), so its worth is in the report's quality column,
  or as the start of a sparse export elsewhere.
- mlp_channels (structured): in every block's gated MLP (gate/up/down projections), the given share of
  intermediate channels with the smallest importance removed, so the matrices, the file and the compute shrink.
  Importance is the product of the channel's gate and up row norms times its down column norm (the size of what
  the channel can add to the residual stream). The number kept is rounded to a multiple of 256, which llama.cpp's
  k-quants need along a row (32 when the width is small); the report states the sparsity actually reached.

Attention-head pruning is not offered: with grouped-query attention a head can only go with its whole KV group
(SmolLM2-135M has 3 groups, Gemma-3-270M one), far coarser than a chosen sparsity.
"""

METHODS = ("magnitude", "mlp_channels")


class PruneRefused(ValueError):
    pass


def _blocks(model):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise PruneRefused(f"{model.__class__.__name__} has no decoder blocks at model.layers to prune.")
    return layers


def magnitude(model, sparsity: float) -> dict:
    import torch
    from torch.nn.utils import prune

    zeroed = total = 0
    for block in _blocks(model):
        for module in block.modules():
            if isinstance(module, torch.nn.Linear):
                prune.l1_unstructured(module, name="weight", amount=sparsity)
                prune.remove(module, "weight")
                zeroed += int((module.weight == 0).sum())
                total += module.weight.numel()
    return {"method": "magnitude", "requested_sparsity": sparsity, "sparsity": zeroed / total if total else 0.0,
            "zeroed_weights": zeroed, "linear_weights": total}


def _kept_width(width: int, sparsity: float) -> int:
    keep = width * (1 - sparsity)
    step = 256 if width >= 1024 else 32
    # The nearest multiple of the step, a tie keeping more.
    return int(max(step, min(width, int(keep / step + 0.5) * step)))


def _select_rows(linear, index, dim: int):
    import torch

    weight = linear.weight.data.index_select(dim, index).clone()
    out_features, in_features = weight.shape
    pruned = torch.nn.Linear(in_features, out_features, bias=linear.bias is not None, dtype=weight.dtype)
    pruned.weight.data.copy_(weight)
    if linear.bias is not None:
        pruned.bias.data.copy_(linear.bias.data.index_select(0, index) if dim == 0 else linear.bias.data)
    return pruned


def mlp_channels(model, sparsity: float) -> dict:
    import torch

    with torch.no_grad():
        return _remove_mlp_channels(model, sparsity)


def _remove_mlp_channels(model, sparsity: float) -> dict:
    width = kept = None
    for block in _blocks(model):
        mlp = getattr(block, "mlp", None)
        if mlp is None or not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
            raise PruneRefused("Structured pruning here needs gated MLPs (gate_proj, up_proj, down_proj), as in "
                               "Llama, SmolLM2, Qwen and Gemma.")
        width = mlp.gate_proj.out_features
        kept = _kept_width(width, sparsity)
        importance = (mlp.gate_proj.weight.norm(dim=1) * mlp.up_proj.weight.norm(dim=1)
                      * mlp.down_proj.weight.norm(dim=0))
        index = importance.topk(kept).indices.sort().values
        mlp.gate_proj = _select_rows(mlp.gate_proj, index, 0)
        mlp.up_proj = _select_rows(mlp.up_proj, index, 0)
        mlp.down_proj = _select_rows(mlp.down_proj, index, 1)
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = kept
    if width is None:
        raise PruneRefused("The model has no decoder blocks to prune.")
    config = getattr(model.config, "text_config", model.config)
    config.intermediate_size = kept
    return {"method": "mlp_channels", "requested_sparsity": sparsity, "sparsity": 1 - kept / width,
            "intermediate_size": {"before": width, "after": kept}}


def prune_model(model, method: str, sparsity: float) -> dict:
    if method not in METHODS:
        raise PruneRefused(f"Unknown pruning method '{method}'; use {' or '.join(METHODS)}.")
    summary = (magnitude if method == "magnitude" else mlp_channels)(model, sparsity)
    summary["parameters_after"] = sum(p.numel() for p in model.parameters())
    return summary
