"""Test worker for the hang watchdog: gloo ranks that hang outside their main thread's own frames.

    hang_elsewhere.py OUT ROLE0 ROLE1 ...   rank r plays ROLE_r; every rank all-reduces a batch each step, and at
                                            step 3 each role but ``wait`` goes astray:

    wait     goes on all-reducing (it then waits in all_reduce for the others)
    loader   reads its batches from a DataLoader with 2 worker processes; worker 1 blocks in __getitem__ on the
             batch of step 3, so the main thread waits in the loader's __next__
    stop     stops itself with SIGSTOP, as a debugger or job control would
    kernel   sleeps in the kernel (state D): posix_spawn waits uninterruptibly (vfork) for a child that opens a
             FIFO no one writes to before it can exec
    exit     leaves its loop and exits 0 (the others all-reduce in a group without it, so they wait, not fail)
    save     saves a checkpoint: a thread 'ckpt-save' starts a process 'ckpt-writer' that blocks writing its
             shard; the thread waits for the process, the main thread for the thread

Each rank writes OUT/pid<RANK> (its pid) and OUT/started.<RANK>; a rank that starts processes writes their pids
to OUT/helpers.<RANK> once they stand where they block.
"""

import multiprocessing
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

STEP = 3


def mark(name: str, text: str) -> None:
    with open(os.path.join(OUT, name), "w") as f:
        f.write(text)


class Batches(Dataset):
    def __len__(self) -> int:
        return 100000

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == STEP:
            mark(f"helpers.{dist_rank()}", str(os.getpid()))
            time.sleep(3600)  # the worker's stuck line
        return torch.ones(8)


def dist_rank() -> int:
    return int(os.environ["RANK"])


def write_shard(path: str) -> None:
    mark(f"helpers.{dist_rank()}", str(os.getpid()))
    with open(path, "wb") as f:  # the writer's stuck line: a FIFO no one reads
        f.write(b"weights")


def save(path: str) -> None:
    writer = multiprocessing.get_context("spawn").Process(target=write_shard, args=(path,), name="ckpt-writer")
    writer.start()
    writer.join()  # the save thread's line


def astray(role: str) -> None:
    fifo = os.path.join(OUT, f"fifo.{dist_rank()}")
    if role == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # the stop line
    elif role == "kernel":
        os.mkfifo(fifo)
        opens = [(os.POSIX_SPAWN_OPEN, 3, fifo, os.O_RDONLY, 0)]
        os.posix_spawn("/bin/true", ["true"], os.environ, file_actions=opens)  # the kernel line
    elif role == "exit":
        sys.exit(0)
    elif role == "save":
        os.mkfifo(fifo)
        thread = threading.Thread(target=save, args=(fifo,), name="ckpt-save")
        thread.start()
        thread.join()  # the save line: the main thread waits for the save thread


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mark(f"pid{rank}", str(os.getpid()))
    mark(f"started.{rank}", "")
    role = ROLES[rank]
    stayers = dist.new_group([r for r, x in enumerate(ROLES) if x != "exit"])
    batches = iter(DataLoader(Batches(), batch_size=None, num_workers=2)) if role == "loader" else None
    for step in range(100000):
        batch = next(batches) if batches is not None else torch.ones(8)  # the loader line
        if step == STEP and role != "loader":
            astray(role)
        if role == "exit":
            time.sleep(0.1)
        else:
            dist.all_reduce(batch, group=stayers)  # the collective line


OUT, ROLES = sys.argv[1], sys.argv[2:]
if __name__ == "__main__":
    main()
