"""dynamiq: compressed gradient all-reduce for PyTorch DistributedDataParallel.

    import dynamiq
    state = dynamiq.register(ddp_model, dynamiq.Config(mode="dynamiq", bits=5.0, topology="ring"))

See README.md for modes, topologies and what has run on which hardware.
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C
from .api import (DynamiqError, MalformedMessage, TransportError, all_reduce, lossless_stats, simulate)
from .config import Config, ConfigError
from .hook import HookState, register

__version__ = "0.1.0"


def available_modes():
    """Modes this build provides."""
    return list(_C.available_modes())


def built_with_cuda() -> bool:
    """True if the CUDA kernels were compiled into this build (they have not run without a GPU)."""
    return bool(_C.built_with_cuda())


def cpu_isa() -> str:
    """Vector ISA the CPU kernels run with: "avx512" (AVX-512 F/BW/DQ/VL present) or "avx2".

    Chosen once per process; set DYNAMIQ_CPU_ISA=avx2 before the first call to force AVX2.
    Results are bit-identical either way.
    """
    return str(_C.cpu_isa())


__all__ = [
    "Config", "ConfigError", "DynamiqError", "HookState", "MalformedMessage", "TransportError",
    "all_reduce", "available_modes", "built_with_cuda", "cpu_isa", "lossless_stats", "register", "simulate",
]
