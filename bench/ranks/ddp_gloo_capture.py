"""A real multi-rank capture on the CPU: 2-process DDP (gloo) under torch.profiler.

    python bench/ranks/ddp_gloo_capture.py OUT_DIR [--slow-rank 1 --slow-ms 30]

Each rank trains a small MLP on random batches from a DataLoader and writes its own Kineto
trace (gloo_cpu_rank<R>.json.gz, with distributedInfo). --slow-rank makes that rank's data loading
slower by --slow-ms per batch (a sleep in __getitem__ of the batch), so the job has a known
straggler: the other rank waits for it inside gloo's all-reduce.
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    def __init__(self, n, delay_s):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)   # stands for slow storage or decoding on this rank
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)


def worker(rank, world, out_dir, slow_rank, slow_ms, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    delay = slow_ms / 1000 if rank == slow_rank else 0.0
    loader = DataLoader(Batches(10, delay), batch_size=None, num_workers=0)
    sched = torch.profiler.schedule(wait=1, warmup=1, active=6, repeat=1)
    path = os.path.join(out_dir, f"gloo_cpu_rank{rank}.json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.unlink(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-ms", type=float, default=30.0)
    ap.add_argument("--port", type=int, default=29533)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    mp.spawn(worker, args=(a.world, a.out_dir, a.slow_rank, a.slow_ms, a.port), nprocs=a.world)


if __name__ == "__main__":
    main()
