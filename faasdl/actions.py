"""faasdl's own actions: their code (``openwhisk_actions/<name>/__main__.py``) and the variants
deployed per memory/time class (OpenWhisk limits are per action, so each class is an action)."""

from __future__ import annotations

from importlib import resources
from typing import Any

from faasdl.errors import ActionNotFound
from faasdl.platform.base import ActionSpec, Platform, variant_name

TRAIN = "train"
AGGREGATE = "aggregate"
#: Prefix of every action faasdl deploys, so that they are easy to find and clean up.
PREFIX = "faasdl-"


def action_code(name: str) -> str:
    """The source of one of faasdl's actions (a thin entry point that imports faasdl)."""
    return (resources.files("openwhisk_actions") / name / "__main__.py").read_text("utf-8")


def deploy_variant(
    platform: Platform,
    name: str,
    *,
    memory_mb: int,
    timeout_ms: int,
    parameters: dict[str, Any] | None = None,
) -> str:
    """Deploy (or keep) the variant of action ``name`` with these limits; returns its name.

    Idempotent: an existing variant with the same limits, parameters and image is left alone, so
    that its warm containers survive. On a platform with an ``action_image``, the variant is a
    blackbox action in that image.
    """
    variant = variant_name(PREFIX + name, memory_mb, timeout_ms)
    bound = parameters or {}
    image = platform.action_image
    try:
        current = platform.get_action(variant)
    except ActionNotFound:
        current = None
    if (
        current is None
        or current.limits.memory != memory_mb
        or current.limits.timeout != timeout_ms
        or {p.key: p.value for p in current.parameters} != bound
        or current.exec.image != image
    ):
        platform.deploy(
            ActionSpec(
                name=variant,
                code=action_code(name),
                **({"kind": "blackbox", "image": image} if image else {}),
                memory_mb=memory_mb,
                timeout_ms=timeout_ms,
                parameters=bound,
            )
        )
    return variant
