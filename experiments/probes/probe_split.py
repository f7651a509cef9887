"""Where the time of one dynamiq all-reduce goes, per rank: one rank script,
run under the netbed launcher (or any env:// launcher).

    python -m experiments.netbed --world 4 --rate 1gbit --tee all -- \
        experiments/probes/probe_split.py 64 dynamiq:ring:5 none:ring

Arguments: bucket MB, then methods as <mode>:<topology>[:<bits>]. Prints, for
3 timed calls after one warm-up, the call's time and dynamiq's own split:
t_local (statistics pass), t_header (fingerprint all-reduce, includes waiting
for the slowest rank), t_meta (statistics all-reduce), t_plan, t_kernel,
t_wait (blocked on the network), t_post (inside isend/irecv).
"""

import sys
import time

import torch
import torch.distributed as dist


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    import dynamiq
    from dynamiq.api import run_collective

    x0 = torch.randn(int(float(sys.argv[1]) * 2**20) // 4)
    name = dist.group.WORLD.group_name
    for k, method in enumerate(sys.argv[2:]):
        parts = method.split(":")
        kw = dict(mode=parts[0], topology=parts[1])
        if len(parts) > 2:
            kw["bits"] = int(parts[2]) if parts[0] == "bitsplit" else float(parts[2])
        cfg = dynamiq.Config(**kw)
        for it in range(4):
            x = x0.clone()
            dist.barrier()
            t = time.perf_counter()
            st = run_collective(x, name, cfg, "mean", 1000 * (k + 1) + it)  # same sequence on every rank
            dt = time.perf_counter() - t
            if it >= 1:
                split = " ".join(f"{key}={st[key] * 1e3:.1f}" for key in st if key.startswith("t_"))
                print(f"{method:20s} {dt * 1e3:7.1f} ms  {split}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
