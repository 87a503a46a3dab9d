"""Modality name → encoder class, and building an encoder from a name, config file or config.

    @register("my_modality")
    class MyTaskEncoder(DocumentTaskEncoder): ...

    encoder = get_encoder("configs/encoders/image_text.yaml")   # YAML path: its ``encoder:`` picks the class
    encoder = get_encoder("image_text", seed=3)                 # name: the class with default config
    encoder = get_encoder({"encoder": "text", "text": {...}})   # dict, like a YAML file

The built-in encoders (``text``, ``image_text``, ``audio_text``, ``video_text``,
``pointcloud_text``, ``multimodal``) register on first lookup; others register when their module is
imported, which a config can ask for with ``module: package.module``.

A registered name may have *variants*: a subclass that `get_encoder` builds instead when
the parsed config asks for it (``@register_variant("image_text", when=...)``: an ``image_text``
config with ``prompt.enabled: true`` builds
`task_encoders.vision_language.VisionLanguageTaskEncoder`). The config spelling stays the
registered name's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from task_encoders.config import EncoderConfig
from task_encoders.config_parser import At, ConfigError, parse, read_yaml

_BUILTIN_MODULES = (
    "task_encoders.text",
    "task_encoders.image_text",
    "task_encoders.vision_language",
    "task_encoders.audio_text",
    "task_encoders.video_text",
    "task_encoders.multimodal",
    "task_encoders.conversation",
    "task_encoders.pointcloud_text",
)
_REGISTRY: dict[str, type] = {}
#: name → [(when, class)], tried in registration order (see `register_variant`).
_VARIANTS: dict[str, list[tuple[Callable[[EncoderConfig], bool], type]]] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make an encoder class available under ``name`` (sets ``cls.name``)."""

    def decorate(cls: type) -> type:
        if _REGISTRY.get(name, cls) is not cls:
            raise ValueError(f"encoder name {name!r} is taken by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def register_variant(name: str, when: Callable[[EncoderConfig], bool]) -> Callable[[type], type]:
    """Class decorator: `get_encoder` builds this class for a config of the registered
    ``name`` when ``when(config)`` holds for the parsed config. The class must read the same config
    class as the one registered as ``name``; it keeps ``cls.name == name``."""

    def decorate(cls: type) -> type:
        base = _REGISTRY.get(name)
        if base is None or cls.config_class is not base.config_class:
            raise ValueError(
                f"{cls.__qualname__}: a variant of {name!r} needs that encoder registered first "
                f"and its config class"
            )
        cls.name = name
        variants = _VARIANTS.setdefault(name, [])
        if all(known is not cls for _, known in variants):
            variants.append((when, cls))
        return cls

    return decorate


def available() -> list[str]:
    """Registered encoder names (built-ins included)."""
    _load_builtins()
    return sorted(_REGISTRY)


def encoder_class(name: str, at: At | None = None) -> type:
    """The class registered as ``name``; ``ConfigError`` listing the known names otherwise."""
    _load_builtins()
    if name not in _REGISTRY:
        raise (
            (at or At())
            .child("encoder")
            .error(f"unknown encoder {name!r}", "one of " + ", ".join(sorted(_REGISTRY)))
        )
    return _REGISTRY[name]


def get_encoder(name_or_config: str | Path | Mapping | EncoderConfig, **kwargs: Any) -> Any:
    """An encoder from a registered name, a YAML path, a dict or an `EncoderConfig`: the
    class registered as its ``encoder:`` name, or the variant of it that the config asks for
    (`register_variant`; a bare name builds the registered class with its defaults).

    ``kwargs`` go to the constructor (``seed``, ``training``).
    """
    if isinstance(name_or_config, EncoderConfig):
        _import_module(name_or_config.module, At())
        encoder_class(name_or_config.encoder)
        return _variant(name_or_config.encoder, name_or_config)(name_or_config, **kwargs)
    if isinstance(name_or_config, Mapping):
        data, at, config = dict(name_or_config), At(), name_or_config
    elif (
        isinstance(name_or_config, str)
        and not name_or_config.endswith((".yaml", ".yml"))
        and "/" not in name_or_config
    ):
        return encoder_class(name_or_config)(**kwargs)
    else:
        data, at = read_yaml(name_or_config)
        config = name_or_config
    _import_module(data.get("module"), at)
    name = data.get("encoder")
    if not isinstance(name, str):
        raise at.child("encoder").error("missing", "the name of a registered encoder")
    cls = encoder_class(name, at)
    if name in _VARIANTS:
        cls = _variant(name, parse(cls.config_class, data, at))
    return cls(config, **kwargs)


def _variant(name: str, config: EncoderConfig) -> type:
    """The class to build for ``config`` of the registered ``name``: its first variant whose
    ``when`` holds, else the registered class."""
    return next((cls for when, cls in _VARIANTS.get(name, ()) if when(config)), _REGISTRY[name])


def _import_module(module: Any, at: At) -> None:
    if module is None:
        return
    try:
        importlib.import_module(module)
    except (ImportError, TypeError) as e:
        raise at.child("module").error(
            f"cannot import {module!r}: {e}", "an importable module"
        ) from None


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


__all__ = [
    "ConfigError",
    "available",
    "encoder_class",
    "get_encoder",
    "register",
    "register_variant",
]
