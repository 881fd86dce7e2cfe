"""A rank that allreduces until stopped, printing its pid once and a line every 100 steps: the
victim of the failure tests."""
import os
import time

import torch

import krug.torch as hvd

hvd.init()
print(f"rank {hvd.rank()} pid {os.getpid()}", flush=True)
step = 0
while True:
    total = hvd.allreduce(torch.ones(1000), name=f"grad.{step % 10}", op=hvd.Sum)
    assert total[0].item() == hvd.size()
    step += 1
    if step % 100 == 0:
        print(f"rank {hvd.rank()} step {step}", flush=True)
    time.sleep(0.002)
