"""PowerSGD with DDP's default (several) buckets on Gloo: does it complete?
(The field notes saw 3 of 14 runs complete with 4 ranks on torch 1.13.)

Run one per rank under the launcher, several times:

    for i in $(seq 10); do
      python -m experiments.netbed --world 4 --loopback --timeout 120 -- \
          experiments/netbed/probe_powersgd.py --steps 20
    done

Each run trains a 6-layer MLP (about 10.5 M parameters, so DDP makes several
25 MB buckets) for --steps steps with `powerSGD_hook` (rank 4, compressing
from step 2) and prints, on rank 0, the number of buckets and "ok" with the
final loss; a crash, a gloo abort or a hang (killed by the launcher's
timeout) shows as a failed run.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rank", type=int, default=4, dest="psgd_rank")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(1320, 1320), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers, torch.nn.Linear(1320, 10)))
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    st = ps.PowerSGDState(process_group=None, matrix_approximation_rank=a.psgd_rank, start_powerSGD_iter=2)
    buckets = set()

    def hook(state, bucket):  # powerSGD_hook, noting which buckets DDP made
        buckets.add(bucket.index())
        return ps.powerSGD_hook(state, bucket)

    model.register_comm_hook(st, hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(a.steps):
        x = torch.randn(32, 1320, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    nparams = sum(p.numel() for p in model.parameters())
    if dist.get_rank() == 0:
        print(f"ok: {nparams / 1e6:.1f} M parameters, DDP buckets {len(buckets)}, "
              f"final loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
