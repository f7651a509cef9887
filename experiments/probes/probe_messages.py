"""Where the time of one exact (mode none) all-reduce goes, by block size:
2 local ranks on loopback, Gloo's own all-reduce and dynamiq's alternating.

    python experiments/probes/probe_messages.py --mb 16 --block-bytes 262144 1048576 4194304

Prints per iteration: Gloo's time, dynamiq's time and dynamiq's own split
(t_wait: blocked on the network; t_post: inside the transport's isend/irecv,
where Gloo already writes into the socket; t_kernel: sums and copies).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import dynamiq
    from dynamiq.api import run_collective

    x = torch.randn(int(args.mb * 2**20) // 4)
    name = dist.group.WORLD.group_name
    seq = 0
    for bb in args.block_bytes:
        cfg = dynamiq.Config(mode="none", topology="ring", block_bytes=bb)
        for it in range(args.iters + 2):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            tg = time.perf_counter() - t
            dist.barrier()
            t = time.perf_counter()
            seq += 1
            st = run_collective(x, name, cfg, "sum", seq)
            td = time.perf_counter() - t
            if rank == 0 and it >= 2:  # two warm-up iterations
                split = " ".join(f"{k}={st[k] * 1e3:.1f}" for k in ("t_header", "t_kernel", "t_wait", "t_post"))
                print(f"block {bb >> 10:6d} KiB  messages {st['messages_sent']:3d}  gloo {tg * 1e3:6.1f} ms  "
                      f"dynamiq {td * 1e3:6.1f} ms  ({split} ms)", flush=True)
            x.div_(4)  # keep values bounded
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=16)
    p.add_argument("--block-bytes", type=int, nargs="+", default=[262144, 1048576, 4194304])
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--port", type=int, default=29714)
    args = p.parse_args()
    mp.spawn(rank_main, args=(args,), nprocs=2)


if __name__ == "__main__":
    main()
