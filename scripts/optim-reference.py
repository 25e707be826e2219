"""Expected values for the tests in src/train/optim.rs.

Runs torch.optim.AdamW and torch.optim.SGD (single-tensor path, foreach=False)
on the fixed parameters and gradients that the Rust tests use, and prints the
parameters after the three steps as float32 literals. Regenerate with
    .venv/bin/python scripts/optim-reference.py
and paste the printed arrays into the tests.
"""

import numpy as np
import torch

A0 = [[0.5, -1.0, 2.0], [0.25, -0.75, 1.5]]
B0 = [0.1, -0.2, 0.3, -0.4]
# Per step: gradient of `a` and of `b` (None: `b` gets no gradient that step).
GRADS = [
    ([[0.1, -0.2, 0.3], [-0.4, 0.5, -0.6]], None),
    ([[1.0, 0.5, -0.25], [0.0, -2.0, 3.0]], [0.01, -0.02, 0.03, -0.04]),
    ([[-0.3, 0.3, -0.3], [0.7, -0.1, 0.2]], [1.0, 2.0, -3.0, 4.0]),
]
LRS = [1e-2, 5e-3, 2e-2]


def run(make_opt):
    a = torch.tensor(A0, dtype=torch.float32, requires_grad=True)
    b = torch.tensor(B0, dtype=torch.float32, requires_grad=True)
    opt = make_opt([a, b])
    for (ga, gb), lr in zip(GRADS, LRS):
        a.grad = torch.tensor(ga, dtype=torch.float32)
        b.grad = None if gb is None else torch.tensor(gb, dtype=torch.float32)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    return a.detach(), b.detach()


def show(name, t):
    # Shortest literal that round-trips to the same float32 (what clippy wants).
    vals = ", ".join(str(np.float32(v)) for v in t.flatten().tolist())
    print(f"{name} = [{vals}]")


for label, make in [
    (
        "adamw (betas 0.9/0.999, eps 1e-8, wd 0.1)",
        lambda ps: torch.optim.AdamW(
            ps, lr=0.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, foreach=False
        ),
    ),
    (
        "sgd (momentum 0.9, wd 0.01)",
        lambda ps: torch.optim.SGD(
            ps, lr=0.0, momentum=0.9, weight_decay=0.01, foreach=False
        ),
    ),
]:
    a, b = run(make)
    print(f"# {label}, torch {torch.__version__}")
    show("a", a)
    show("b", b)
