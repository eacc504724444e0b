"""Test worker for the step report: gloo ranks training a tiny model, each step a fixed amount of CPU work, one rank
made slow, under the loop users run.

    step_rank.py OUT MODE SLOW STEPS WRAP    STEPS steps, or with STEPS 0 until OUT/stop exists (ddp and fsdp: every
                                             rank stops at the same step: rank 0's look at the file travels in the
                                             loss's all-reduce)

MODE: ``input`` (rank SLOW's dataset sleeps 30 ms a batch, loading in the main thread), ``compute`` (rank SLOW's
forward does 30 ms more CPU work), ``none`` (every rank alike). WRAP: the loop and its wrapper,

* ``ddp``: a plain loop over DistributedDataParallel, the loss all-reduced after the step as a trainer logs it;
* ``fsdp``: the same loop over FSDP2's fully_shard;
* ``lightning``: a LightningModule under ``lightning.Trainer(strategy="ddp")`` on the CPU (Lightning finds torchrun's
  environment and takes the ranks as they are);
* ``accelerate``: ``accelerate.Accelerator(cpu=True)``: its ``prepare`` wraps the model in DDP, ``backward`` runs the
  loss's backward;
* ``gan``: a generator and a discriminator, each under DDP with its own optimizer, stepped in turn every step
  (``opt_d.step()``, then ``opt_g.step()``), as a GAN's loop does;
* ``join``: the plain DDP loop under ``Join`` (uneven inputs): rank SLOW's data runs out 10 steps before the others';
* ``nostep``: the plain DDP loop with the update made by hand, no ``torch.optim`` optimizer: no step is recorded.

Every rank's forward does 10 ms of CPU work (CPU time: a core shared with another process slows it; ``STEP_WORK_S``
sets another amount, for a job of a few long steps). Each rank writes OUT/pid<RANK> and OUT/started.<RANK> once its
first step is done, then waits while ``STEP_GATE`` names a file that does not exist yet. ``STEP_FAIL_AT=N``: in the
job's first attempt, rank 1 exits 3 after its step N (a restart under ``--max-restarts`` runs the job again; the
ranks meet through ``numarun.init()``, which reads the store under the attempt's prefix).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

out, mode, slow, steps, wrap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
WORK_S, SLOW_S = float(os.environ.get("STEP_WORK_S", "0.010")), 0.030
FAIL_AT = int(os.environ.get("STEP_FAIL_AT", "0"))
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> torch.Tensor:
        if mode == "input" and rank() == slow and i % 4 == 0:
            time.sleep(SLOW_S)
        return torch.randn(16)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spin(WORK_S + (SLOW_S if mode == "compute" and rank() == slow else 0.0))
        return self.b(torch.relu(self.a(x)))


def mark(name: str) -> None:
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))


def started() -> None:
    """After the first step: say so, and wait at the gate."""
    mark(f"started.{rank()}")
    while os.environ.get("STEP_GATE") and not os.path.exists(os.environ["STEP_GATE"]):
        time.sleep(0.01)  # the test sets something up before the steps it judges


def loader() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(Data(), batch_size=4)


def plain() -> None:
    if FAIL_AT:  # a job that restarts: torch's own init may read the last attempt's addresses in the store
        import numarun

        numarun.init("gloo", build_mesh=False)
    else:
        dist.init_process_group("gloo")
    me = dist.get_rank()
    model: torch.nn.Module = Model()
    if wrap in ("ddp", "join", "nostep"):
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.a)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mark(f"pid{me}")
    if wrap == "join":
        from torch.distributed.algorithms.join import Join

        with Join([model]):  # the ranks whose data ran out shadow the others' all-reduces
            for step, x in enumerate(loader(), 1):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                if step == 1:
                    started()
                if step == steps - (10 if me == slow else 0):
                    break
    else:
        for step, x in enumerate(loader(), 1):
            loss = model(x).square().mean()
            loss.backward()
            if wrap == "nostep":  # an update made by hand: no optimizer steps
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                        p.grad = None
            else:
                opt.step()
                opt.zero_grad()
            logged = torch.stack([loss.detach(), torch.tensor(float(me == 0 and os.path.exists(f"{out}/stop")))])
            dist.all_reduce(logged)  # the mean loss, as a trainer logs it, and whether rank 0 was told to stop
            if step == 1:
                started()
            if FAIL_AT and FIRST_ATTEMPT and me == 1 and step == FAIL_AT:
                sys.exit(3)
            if step == steps or logged[1] > 0:
                break
    dist.barrier()
    del model, opt
    dist.destroy_process_group()


def gan() -> None:
    """A GAN's loop: the discriminator, then the generator, each its own DDP module and optimizer, every step."""
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    me = dist.get_rank()
    g = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)))
    d = DistributedDataParallel(Model())
    opt_g = torch.optim.SGD(g.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(d.parameters(), lr=0.01)
    mark(f"pid{me}")
    for step, real in enumerate(loader(), 1):
        fake = g(torch.randn(real.shape[0], 16))
        (d(real).mean() - d(fake.detach()).mean()).backward()
        opt_d.step()
        opt_d.zero_grad()
        (-d(fake).mean()).backward()
        opt_g.step()
        opt_g.zero_grad()
        opt_d.zero_grad()  # the generator's loss reached the discriminator's gradients too
        if step == 1:
            started()
        if step == steps:
            break
    dist.barrier()
    dist.destroy_process_group()


def lightning() -> None:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Model()

        def training_step(self, x: torch.Tensor, i: int) -> torch.Tensor:
            return self.model(x).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_start(self) -> None:
            mark(f"pid{rank()}")

        def on_train_batch_end(self, *args: object) -> None:
            if self.global_step == 1:
                started()

    local = int(os.environ["LOCAL_WORLD_SIZE"])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=local,
        num_nodes=int(os.environ["WORLD_SIZE"]) // local,
        strategy="ddp",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), loader())


def accelerate() -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = acc.prepare(Model())
    opt, data = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.01), loader())
    mark(f"pid{acc.process_index}")
    for step, x in enumerate(data, 1):
        loss = model(x).square().mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if step == 1:
            started()
        if step == steps:
            break
    acc.wait_for_everyone()
    acc.end_training()


torch.set_num_threads(1)
torch.manual_seed(0)
{
    "ddp": plain,
    "fsdp": plain,
    "join": plain,
    "nostep": plain,
    "gan": gan,
    "lightning": lightning,
    "accelerate": accelerate,
}[wrap]()
