"""dynamiq: compressed gradient all-reduce for PyTorch DistributedDataParallel.

    import dynamiq
    state = dynamiq.HookState(dynamiq.Config(mode="dynamiq", bits=5.0, topology="ring"))
    ddp_model.register_comm_hook(state, dynamiq.comm_hook)   # torch's convention
    # or, in one call: state = dynamiq.register(ddp_model, config)
    print(state.summary())                                    # after each step

    # FSDP2 (fully_shard): compressed reduce-scatter, lossless all-gather
    fsdp_state = dynamiq.fsdp.enable(fsdp_model, dynamiq.Config(mode="dynamiq", bits=5.0))

See README.md for modes, topologies and what has run on which hardware.
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from ._torch_check import TorchVersionMismatch, check_torch_version

check_torch_version()  # before the extension: another torch than the build's is named, not a symbol error
from . import _C  # noqa: E402
from .api import (DynamiqError, MalformedMessage, TransportError, all_gather, all_reduce, lossless_stats,
                  reduce_scatter, simulate)
from .config import Config, ConfigError
from .hook import HookState, comm_hook, register

__version__ = "0.1.0"


def available_modes():
    """Modes this build provides, by id: the C++ codec registry's list (valid `Config.mode` values)."""
    return list(_C.available_modes())


def available_topologies(collective=None, compositions=True):
    """Topologies this build provides, by id: the C++ topology registry's list (valid
    `Config.topology` values). `collective` ("all_reduce", "reduce_scatter",
    "all_gather"): only those that run it; `compositions=False`: the schedules alone."""
    from .config import topologies

    return topologies(collective, compositions)


def built_with_cuda() -> bool:
    """True if the CUDA kernels were compiled into this build (they have not run without a GPU)."""
    return bool(_C.built_with_cuda())


def cpu_isa() -> str:
    """Vector ISA the CPU kernels run with: "avx2" on x86, AVX-512 CPUs included (the build has
    no AVX-512 kernels: DynamiQ's were withdrawn until an AVX-512 machine runs them), or
    "generic" (a build without the x86 kernels: the portable loops, as on aarch64). "avx512"
    would name AVX-512 kernels in a build that has some.

    Chosen once per process (DYNAMIQ_CPU_ISA=avx2 forces AVX2). Results are bit-identical
    either way.
    """
    return str(_C.cpu_isa())


def cpu_threads() -> int:
    """Threads one CPU codec call may use (default 1; env DYNAMIQ_CPU_THREADS=N)."""
    return int(_C.cpu_threads())


def set_cpu_threads(n: int) -> int:
    """Lets each CPU codec call split its units over `n` threads (1..256); returns the old value.

    Applies to the dynamiq, bitsplit and lossless codecs. Process-wide,
    like ``torch.set_num_threads``. Results are bit-identical for every `n`. The
    default is 1 because a DDP job usually runs one process per core or GPU (torchrun sets
    OMP_NUM_THREADS=1 for the same reason); raise it when a rank has cores to itself. A call that
    finds the helper threads busy (another process group's call) runs on its own thread.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 256:
        raise ValueError(f"dynamiq.set_cpu_threads: n must be an int in [1, 256], got {n!r}")
    return int(_C.set_cpu_threads(n))


def __getattr__(name: str):
    # dynamiq.fsdp imports torch's FSDP2: loaded on first use
    if name == "fsdp":
        import importlib

        return importlib.import_module(".fsdp", __name__)
    raise AttributeError(f"module 'dynamiq' has no attribute {name!r}")


__all__ = [
    "Config", "ConfigError", "DynamiqError", "HookState", "MalformedMessage", "TorchVersionMismatch", "TransportError",
    "all_gather", "all_reduce", "available_modes", "available_topologies", "built_with_cuda", "comm_hook", "cpu_isa",
    "cpu_threads", "lossless_stats", "reduce_scatter", "register",
    "set_cpu_threads", "simulate",
]
