"""What the fork server of dist_utils imports once, before it forks the ranks.

The fork server survives an ImportError in a preloaded module but no other exception
(dynamiq.fsdp on a torch whose FSDP2 API differs raises AttributeError), and without
it every multi-process test fails. Here each module is imported on its own, and one
that fails is left to the test that needs it, which then reports the real error.
"""
import importlib

MODULES = ["torch", "torch.distributed", "numpy", "dynamiq", "dist_utils", "torch.distributed.fsdp", "dynamiq.fsdp"]

for _name in MODULES:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001,S110 -- see the docstring
        pass
