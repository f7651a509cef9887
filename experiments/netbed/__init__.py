"""netbed: an emulated cluster on one Linux host (network namespaces + bridge + tc tbf), and its launcher.

    from experiments.netbed import Netbed, run

See launch.py for the API and netbed.sh for the network itself. Names load lazily (PEP 562), so that
`python -m experiments.netbed.launch` does not import launch twice.
"""

__all__ = ["GOODPUT_MTU1500", "Interrupted", "Netbed", "NetbedError", "RankResult", "RankSpec", "RunResult",
           "format_rate", "netbed_available", "parse_rate", "run"]


def __getattr__(name):
    if name in __all__:
        from . import launch
        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
