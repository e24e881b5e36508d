"""An elastic torch training script for the elastic launcher's tests: deterministic data per (step, rank), SGD with
momentum, a commit every ``--commit-every`` steps. Faults come from the script itself (``--kill SLOT:STEP``: the
worker of that slot SIGKILLs itself mid-step, after its backward pass, while its peers are in the gradient
allreduce). Rank 0 writes ``resume.pt`` (the state every rank resumed from after the first reset), ``final.pt``
and one ``log`` line per step (step, size). ``--resume FILE`` starts from such a state (the clean-run reference)."""

import argparse
import os
import signal
import time

import torch

import hora.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--commit-every", type=int, default=3)
p.add_argument("--kill", default="")
p.add_argument("--out", required=True)
p.add_argument("--resume", default="")
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--wait-size", type=int, default=0, help="sleep each step until the job has this many ranks")
args = p.parse_args()

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), named_parameters=model.named_parameters()
)
step = 0
if args.resume:
    saved = torch.load(args.resume)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    step = saved["step"]
state = hvd.elastic.TorchState(model, opt, step=step, resets=0)
slot = os.environ.get("HORA_ELASTIC_SLOT", "")
kill_slot, _, kill_step = args.kill.rpartition(":")


def on_reset():
    state.resets += 1
    if hvd.rank() == 0 and state.resets == 1:
        torch.save(
            {"model": model.state_dict(), "opt": opt.state_dict(), "step": state.step},
            os.path.join(args.out, "resume.pt"),
        )


state.register_reset_callbacks([on_reset])


def batch(step, rank):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)


@hvd.elastic.run
def train(state):
    while state.step < args.steps:
        x, y = batch(state.step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if args.kill and slot == kill_slot and state.step == int(kill_step):
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        if hvd.rank() == 0:
            with open(os.path.join(args.out, "log"), "a") as f:
                f.write(f"{state.step} {hvd.size()}\n")
        state.step += 1
        while args.wait_size and hvd.size() < args.wait_size and state.step == args.steps // 2:
            time.sleep(0.1)
            state.check_host_updates()
        time.sleep(args.step_sleep)
        if state.step % args.commit_every == 0:
            state.commit()


train(state)
if hvd.rank() == 0:
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
print(f"finished rank {hvd.rank()} of {hvd.size()} at step {state.step}", flush=True)
