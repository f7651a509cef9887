"""Can two NCCL ranks share one GPU? (NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1; older NCCL
refuses with "Duplicate GPU detected".) Run by scripts/gpu_check.sh; prints one line per rank."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", NCCL_MULTI_RANK_GPU_ENABLE="1")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    x = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    y = torch.zeros(4, device="cuda")
    if rank == 0:
        dist.send(torch.ones(4, device="cuda"), 1)
    else:
        dist.recv(y, 0)
    torch.cuda.synchronize()
    print(f"rank {rank}: all_reduce {x[0].item()} (want 3.0), p2p {y.sum().item()} (want {4.0 * rank})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    print("nccl", torch.cuda.nccl.version(), flush=True)
    mp.spawn(run, nprocs=2)
