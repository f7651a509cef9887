"""Fixed cost of a small Gloo all-reduce on this machine, against a 1 MB one.

    python -m experiments.netbed --world 4 --rate 1gbit --tee 0 -- experiments/probes/probe_latency.py
    torchrun --nproc_per_node 2 experiments/probes/probe_latency.py

Per row, 12 timed all-reduces right after a barrier and 12 back to back: the
median and the minimum in ms. Rows: 64 int64 values on the default group, the
same on a second group (dynamiq's own group is one such), 2^18 float32 values
(1 MB). Every rank prints its own line.
"""

import time

import torch
import torch.distributed as dist


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    g2 = dist.new_group(list(range(dist.get_world_size())))
    for name, n, dt, grp in [("64 x int64", 64, torch.int64, None),
                             ("64 x int64, second group", 64, torch.int64, g2),
                             ("1 MB float32", 262144, torch.float32, None)]:
        x = torch.zeros(n, dtype=dt)
        after_barrier, back_to_back = [], []
        for _ in range(12):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x, group=grp)
            after_barrier.append((time.perf_counter() - t) * 1e3)
        for _ in range(12):
            t = time.perf_counter()
            dist.all_reduce(x, group=grp)
            back_to_back.append((time.perf_counter() - t) * 1e3)
        after_barrier.sort()
        back_to_back.sort()
        print(f"rank {dist.get_rank()} {name}: after a barrier median {after_barrier[6]:.2f} ms "
              f"min {after_barrier[0]:.2f} | back to back median {back_to_back[6]:.2f} "
              f"min {back_to_back[0]:.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
