"""Argus: always-on tracing and performance diagnosis for large GPU training jobs.

The composition root: the public API (``argus.attach``), configuration and the ``argus``
command wire the packages ``schemas``, ``producers``, ``detectors``, ``streams`` and
``sinks`` together.
"""

from __future__ import annotations

import typing
from importlib.metadata import PackageNotFoundError, version

from ._errors import ArgusError
from .api import attach, detach, pause, step
from .config import ConfigError, Settings, load_settings

try:
    __version__ = version("argus-gpu")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+local"

# also ``ArgusLightningCallback`` and ``ArgusHFCallback``, built on first access (below)
__all__ = [
    "ArgusError",
    "ConfigError",
    "Settings",
    "__version__",
    "attach",
    "detach",
    "load_settings",
    "pause",
    "step",
]


def __getattr__(name: str) -> typing.Any:
    """``argus.ArgusLightningCallback`` / ``argus.ArgusHFCallback``: built on first access
    (they subclass the framework's callback class, imported only then)."""
    if name in ("ArgusLightningCallback", "ArgusHFCallback"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
