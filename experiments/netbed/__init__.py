"""netbed: an emulated cluster on one Linux host (network namespaces + bridge + tc tbf), and its launcher.

See launch.py for the API (Netbed, run) and netbed.sh for the network itself.
"""

from .launch import (GOODPUT_MTU1500, Interrupted, Netbed, NetbedError, RankResult, RankSpec, RunResult,
                     format_rate, netbed_available, parse_rate, run)

__all__ = ["GOODPUT_MTU1500", "Interrupted", "Netbed", "NetbedError", "RankResult", "RankSpec", "RunResult",
           "format_rate", "netbed_available", "parse_rate", "run"]
