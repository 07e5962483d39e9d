"""Integrations with training frameworks that need more than the ``torch.utils.data.DataLoader``
subclass (each imports its framework lazily: ``headrace.integrations.accelerate``).

Lightning and Fabric need none: they rebuild a headrace loader with their ``DistributedSampler``
and save its ``state_dict()`` in their checkpoints.
"""

ACCELERATE_PREPARE = (
    "accelerate's prepare() would replace this headrace loader by a plain torch DataLoader "
    "rebuilt from its attributes (no headrace scheduling, no headrace state). Prepare it with "
    "headrace.integrations.accelerate: `loader = prepare_data_loader(accelerator, loader)` (then "
    "pass the result to accelerator.prepare as usual), or `model, opt, loader = "
    "prepare(accelerator, model, opt, loader)`."
)
"""The error ``accelerator.prepare(headrace_loader)`` raises (``DataLoader._is_accelerate_prepared``)."""
