"""Models come from timm. Pretrained weights are used only from this machine's caches,
unless the network can reach the Hugging Face hub; otherwise --pretrained stops with one line.

Small enough for a CPU: test_resnet (0.37 M parameters, BatchNorm), test_efficientnet_gn
(0.10 M, GroupNorm), test_vit (0.31 M), resnet10t (4.9 M).
"""

from __future__ import annotations

import os
import socket

from ddpcourse.runtime import fail

HUB_HOST = "huggingface.co"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def create_model(name: str, num_classes: int, pretrained: bool = False, **options):
    """timm.create_model(name, pretrained=..., num_classes=..., **options), with one-line
    errors. `options` go to the model, e.g. drop_rate=0.2."""
    import timm

    if not timm.is_model(name):
        fail(f"timm has no model called {name!r}; try test_resnet, test_efficientnet_gn or "
             "resnet10t (python -c 'import timm; print(timm.list_models())' lists them all)")
    if not pretrained:
        return timm.create_model(name, pretrained=False, num_classes=num_classes, **options)
    local = cached_weights(name)
    if local:  # load the file directly: no network call, no retries
        return timm.create_model(name, pretrained=True, num_classes=num_classes,
                                 pretrained_cfg_overlay={"file": local}, **options)
    if not hub_reachable():
        fail(f"no pretrained weights for {name} on this machine, and {HUB_HOST} cannot be "
             "reached to fetch them; run without --pretrained (the lessons train from "
             "scratch), or fetch them once where there is a network")
    return timm.create_model(name, pretrained=True, num_classes=num_classes, **options)


def cached_weights(name: str) -> str | None:
    """The weights file of `name` in the Hugging Face or torch hub cache, if it is there."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    hub_id, url = (cfg.hf_hub_id, cfg.url) if cfg else (None, None)
    if not hub_id and not url:
        fail(f"timm has no pretrained weights for {name}; run without --pretrained")
    if hub_id:
        from huggingface_hub import try_to_load_from_cache

        repo, _, revision = hub_id.partition("@")
        filenames = [cfg.hf_hub_filename] if cfg.hf_hub_filename else WEIGHT_FILES
        for filename in filenames:
            path = try_to_load_from_cache(repo, filename, revision=revision or None)
            if isinstance(path, str) and os.path.exists(path):
                return path
    if url:
        import torch.hub

        path = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(url))
        if os.path.exists(path):
            return path
    return None


def hub_reachable(timeout: float = 3.0) -> bool:
    """Can this machine open a connection to the hub? False at once when HF_HUB_OFFLINE=1."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0"):
        return False
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False
