"""faasdl's own actions: their code (``openwhisk_actions/<name>/__main__.py``) and the variants
deployed per memory/time class (OpenWhisk limits are per action, so each class is an action)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterable
from importlib import resources
from typing import Any

from faasdl import __version__
from faasdl.errors import ActionNotFound
from faasdl.platform.base import Action, ActionSpec, Platform, variant_name

TRAIN = "train"
AGGREGATE = "aggregate"
#: Prefix of every action faasdl deploys, so that they are easy to find and clean up.
PREFIX = "faasdl-"
#: The memory classes (MB) and time classes (s) deployed ahead of the first job by default; the
#: controller deploys any other class a job needs when it needs it.
MEMORY_CLASSES_MB = (512, 1024, 2048)
TIME_CLASSES_S = (60, 300)
#: Where wskdeploy's manifest of faasdl's actions lives (``faasdl platform manifest`` writes it).
MANIFEST = "openwhisk_actions/manifest.yaml"
#: The annotation of a variant that stands for its parameters where the platform shows them
#: encrypted (OpenWhisk's parameter storage: the record holds ciphertext, new at each deploy): a
#: salted scrypt digest of them, from which none of them (a store's password) can be read or
#: cheaply guessed.
PARAMETERS_DIGEST = "faasdl-parameters"
#: scrypt's cost (2**14, r=8: 16 MiB and some 30 ms a digest), made at each deploy and compared
#: only where the parameters are encrypted.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}


def action_code(name: str) -> str:
    """The source of one of faasdl's actions (a thin entry point that imports faasdl)."""
    return (resources.files("openwhisk_actions") / name / "__main__.py").read_text("utf-8")


def deploy_variant(
    platform: Platform,
    name: str,
    *,
    memory_mb: int,
    timeout_ms: int,
    environment: dict[str, str],
    parameters: dict[str, Any] | None = None,
) -> str:
    """Deploy (or keep) the variant of action ``name`` with these limits; returns its name.
    ``environment``: its init parameters (:func:`faasdl.store.action_environment`: the store's
    settings, which its containers open the store with; required, as a caller that forgot them
    made its actions open the store with none, and alike variants deploy each other again).

    Idempotent: an existing variant with the same limits, parameters, environment, image and code
    is left alone, so that its warm containers survive. On a platform with an ``action_image``,
    the variant is a blackbox action in that image.
    """
    return _deploy(platform, name, memory_mb, timeout_ms, parameters or {}, environment)[0]


def deploy_variants(
    platform: Platform,
    memories: Iterable[int],
    timeouts_s: Iterable[int],
    environment: dict[str, str],
) -> list[tuple[str, bool]]:
    """:func:`deploy_variant` for each of :func:`variants`, in their order: each one's name and
    whether it was deployed (new, or its limits, parameters, environment, image or code had
    changed) rather than left alone."""
    return [
        _deploy(platform, name, mb, ms, {}, environment)
        for name, _, mb, ms in variants(memories, timeouts_s)
    ]


def _deploy(
    platform: Platform,
    name: str,
    memory_mb: int,
    timeout_ms: int,
    bound: dict[str, Any],
    environment: dict[str, str],
) -> tuple[str, bool]:
    """:func:`deploy_variant`'s work: the variant's name, and whether it was deployed."""
    variant = variant_name(PREFIX + name, memory_mb, timeout_ms)
    image = platform.action_image
    code = action_code(name)
    try:
        current = platform.get_action(variant, code=True)
    except ActionNotFound:
        current = None
    if (
        current is None
        or current.limits.memory != memory_mb
        or current.limits.timeout != timeout_ms
        or not _holds(current, bound, environment)
        or current.exec.image != image
        or current.exec.code != code  # an older faasdl's entry point
    ):
        platform.deploy(
            ActionSpec(
                name=variant,
                code=code,
                **({"kind": "blackbox", "image": image} if image else {}),
                memory_mb=memory_mb,
                timeout_ms=timeout_ms,
                parameters=bound,
                environment=environment,
                annotations={PARAMETERS_DIGEST: parameters_digest(bound, environment)},
            )
        )
        return variant, True
    return variant, False


def _holds(current: Action, bound: dict[str, Any], environment: dict[str, str]) -> bool:
    """Whether the variant ``current`` has these parameters (``bound``) and init parameters
    (``environment``): by their values, or where the platform shows them encrypted, by their
    names and the digest noted as it was deployed (:data:`PARAMETERS_DIGEST`)."""
    held = current.parameters
    if not any(p.encryption for p in held):
        return {p.key: p.value for p in held if not p.init} == bound and {
            p.key: p.value for p in held if p.init
        } == environment
    if {p.key for p in held if not p.init} != bound.keys() or {
        p.key for p in held if p.init
    } != environment.keys():
        return False
    noted = str(next((a.value for a in current.annotations if a.key == PARAMETERS_DIGEST), ""))
    kind, _, rest = noted.partition(":")
    try:
        salt = bytes.fromhex(rest.partition(":")[0])
    except ValueError:  # not a digest of ours
        return False
    return (
        kind == "scrypt"
        and len(salt) > 0
        and hmac.compare_digest(parameters_digest(bound, environment, salt=salt), noted)
    )


def parameters_digest(
    bound: dict[str, Any], environment: dict[str, str], *, salt: bytes | None = None
) -> str:
    """``scrypt:SALT:DIGEST`` (hex) of a variant's parameters, with ``salt`` (by default 16
    random bytes)."""
    salt = salt or os.urandom(16)
    text = json.dumps([bound, environment], sort_keys=True).encode()
    return f"scrypt:{salt.hex()}:{hashlib.scrypt(text, salt=salt, **_SCRYPT).hex()}"


def variants(
    memories: Iterable[int] = MEMORY_CLASSES_MB, timeouts_s: Iterable[int] = TIME_CLASSES_S
) -> list[tuple[str, str, int, int]]:
    """Every variant of faasdl's actions for these classes: (action, variant, MB, ms)."""
    return [
        (name, variant_name(PREFIX + name, mb, s * 1000), mb, s * 1000)
        for name in (TRAIN, AGGREGATE)
        for mb in memories
        for s in timeouts_s
    ]


def wskdeploy_manifest(
    image: str | None,
    memories: Iterable[int] = MEMORY_CLASSES_MB,
    timeouts_s: Iterable[int] = TIME_CLASSES_S,
) -> dict[str, Any]:
    """wskdeploy's manifest of the variants ``faasdl platform deploy`` deploys: in OpenWhisk's
    default package (where the controller invokes them), as blackbox actions in ``image`` (none:
    python:3.11 actions, for an OpenWhisk whose Python image has faasdl installed)."""
    actions = {
        variant: {
            "function": f"{name}/__main__.py",  # relative to the manifest
            **({"docker": image} if image else {"runtime": "python:3.11"}),
            "limits": {"memorySize": mb, "timeout": ms},
        }
        for name, variant, mb, ms in variants(memories, timeouts_s)
    }
    return {
        "packages": {
            "default": {"version": __version__, "license": "Apache-2.0", "actions": actions}
        }
    }
