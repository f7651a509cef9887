"""The check that the running torch is the one dynamiq's extension was built against.

dynamiq._C is compiled against one torch's C++ headers and linked against its
libraries; under another torch it fails to load with an undefined symbol, or loads
and misbehaves. dynamiq/__init__.py calls `check_torch_version()` before it imports
the extension, so that the user sees both versions and what to do instead.
"""

from __future__ import annotations

import os
from typing import Optional

SKIP_ENV = "DYNAMIQ_SKIP_TORCH_CHECK"


class TorchVersionMismatch(ImportError):
    """The installed torch is not the one dynamiq was built against."""


def built_torch_version() -> Optional[str]:
    """The torch version recorded by the build (None: no record, e.g. a build older than the record)."""
    try:
        from ._build_info import TORCH_VERSION
    except ImportError:
        return None
    return str(TORCH_VERSION)


def check_torch_version(built: Optional[str] = None, running: Optional[str] = None) -> None:
    """Raises TorchVersionMismatch if `running` (default: torch.__version__) differs from
    `built` (default: the build's record). Skipped when DYNAMIQ_SKIP_TORCH_CHECK=1."""
    if os.environ.get(SKIP_ENV) == "1":
        return
    if built is None:
        built = built_torch_version()
        if built is None:
            return
    if running is None:
        import torch

        running = str(torch.__version__)
    if str(running) == str(built):
        return
    raise TorchVersionMismatch(
        f"dynamiq was built against torch {built}, but this process imported torch {running}: its C++ "
        f"extension (dynamiq._C) only works with the torch it was built against. Rebuild dynamiq against this "
        f"torch (pip install --no-build-isolation --no-deps --force-reinstall <dynamiq source directory>), or "
        f"install torch=={built}. ({SKIP_ENV}=1 skips this check and lets the loader decide.)")
