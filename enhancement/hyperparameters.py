"""A fine-tune job's settings: defaults, and the range each must lie in. Every refusal names the setting and its
allowed range."""

from django.utils.translation import gettext as _

from accounts.errors import ValidationFailed

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")

# name: (default, minimum, maximum, type)
RANGES = {
    "max_steps": (0, 0, 1_000_000, int),  # 0: train for `epochs` instead
    "epochs": (1.0, 0.01, 100.0, float),
    "learning_rate": (2e-4, 1e-7, 1.0, float),
    "warmup_steps": (0, 0, 100_000, int),
    "batch_size": (4, 1, 4096, int),  # samples per optimizer step
    "micro_batch_size": (0, 0, 1024, int),  # 0: the plan's
    "cutoff": (512, 16, 32_768, int),
    "lora_rank": (8, 1, 1024, int),
    "lora_alpha": (16.0, 0.01, 4096.0, float),
    "lora_dropout": (0.05, 0.0, 0.9, float),
    "seed": (42, 0, 2 ** 31 - 1, int),
    "save_steps": (50, 1, 1_000_000, int),
    "eval_steps": (50, 1, 1_000_000, int),
    # Data-parallel training processes; more than one run on Ray Train (enhancement/training/distributed.py).
    "workers": (1, 1, 64, int),
    # An elastic job's fewest workers (0: `workers`, a fixed size): it starts on what the pool has free, at least
    # this many, and grows or shrinks at checkpoints keeping the global batch (cluster/scheduling/).
    "min_workers": (0, 0, 64, int),
}


def checked(values: dict) -> dict:
    """The full settings: the given values checked, the rest defaulted."""
    unknown = set(values) - set(RANGES) - {"lr_scheduler", "lora_targets", "recompute", "packing"}
    if unknown:
        raise ValidationFailed(f"Unknown setting(s): {', '.join(sorted(unknown))}.",
                               fields={name: ["Unknown setting."] for name in sorted(unknown)})
    out = {}
    for name, (default, low, high, kind) in RANGES.items():
        value = values.get(name, default)
        if value is None or value == "":
            value = default
        try:
            value = kind(value)
            if kind is int and isinstance(values.get(name), float) and values[name] != int(values[name]):
                raise ValueError
        except (TypeError, ValueError):
            raise ValidationFailed((_("%(name)s must be a whole number.") if kind is int else
                                    _("%(name)s must be a number.")) % {"name": name},
                                   fields={name: ["Not a number."]})
        if not low <= value <= high:
            raise ValidationFailed(_("%(name)s must be between %(low)s and %(high)s (got %(value)s).")
                                   % {"name": name, "low": low, "high": high, "value": value},
                                   fields={name: [f"Between {low} and {high}."]})
        out[name] = value
    scheduler = values.get("lr_scheduler") or "linear"
    if scheduler not in SCHEDULERS:
        raise ValidationFailed(f"lr_scheduler must be one of {', '.join(SCHEDULERS)} (got '{scheduler}').",
                               fields={"lr_scheduler": ["Unknown schedule."]})
    out["lr_scheduler"] = scheduler
    targets = values.get("lora_targets") or ["q_proj", "v_proj"]
    if isinstance(targets, str):
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    bad = [t for t in targets if t not in LORA_TARGETS]
    if bad or not targets:
        raise ValidationFailed(f"LoRA targets must be among {', '.join(LORA_TARGETS)} "
                               f"(got {', '.join(bad) or 'none'}).",
                               fields={"lora_targets": ["Unknown module."]})
    out["lora_targets"] = list(dict.fromkeys(targets))
    out["recompute"] = bool(values.get("recompute", False))
    # Short samples end to end in rows of up to `cutoff` tokens (enhancement/training/batches.py); a micro-batch is
    # then that many rows.
    out["packing"] = bool(values.get("packing", True))
    if out["micro_batch_size"] and out["batch_size"] % out["micro_batch_size"]:
        raise ValidationFailed(f"The batch size ({out['batch_size']}) must be a multiple of the micro-batch size "
                               f"({out['micro_batch_size']}).",
                               fields={"micro_batch_size": ["Must divide batch_size."]})
    if out["batch_size"] % out["workers"]:
        raise ValidationFailed(f"The batch size ({out['batch_size']}) must be a multiple of the workers "
                               f"({out['workers']}): each worker takes an equal share of every step.",
                               fields={"workers": ["Must divide batch_size."]})
    if out["min_workers"] > out["workers"]:
        raise ValidationFailed(_("min_workers (%(least)s), the fewest devices the job runs on, cannot exceed "
                                 "workers (%(most)s), the most.") % {"least": out["min_workers"],
                                                                     "most": out["workers"]},
                               fields={"min_workers": [f"At most {out['workers']}."]})
    return out
