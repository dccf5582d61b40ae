"""FedSMOO Table 2 (Hessian rows): top eigenvalue and trace of the final global model's training-loss Hessian.

For each run folder (a ``fit`` output with ``config.yaml`` and ``checkpoints/last.ckpt``) the global
network is rebuilt from the run's config, loaded from the checkpoint, and the Hessian of the mean
cross-entropy over the dataset's whole training split (full batch) is probed with Hessian-vector
products (double backward): the top eigenvalue by power iteration, the trace by Hutchinson's estimator
with Rademacher vectors. The paper (Sec. 5.2, Table 2) reports both for FedSAM and FedSMOO on
CIFAR-10 / ResNet-18-GN, Dirichlet 0.6 and 0.1; the data of its "global function" is the union of the
clients' (sampled with replacement) sets, here approximated by the training split itself.

    python -m fl_lightning sweep recipes/fedsmoo/sweep_cpu.yaml --rows 'dir0.1/fedsam' 'dir0.1/fedsmoo'
    python recipes/fedsmoo/hessian.py lightning_logs/sweeps/fedsmoo_cpu/dir0.1/{fedsam,fedsmoo}/seed{0,1,2}
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import torch
import yaml
from torch import nn

from fl_lightning.data.datasets import load_dataset
from fl_lightning.runs import latest_run


def build(spec: dict) -> nn.Module:
    """Instantiate a ``{class_path, init_args}`` spec (the run's ``model.client.init_args.net``)."""
    module, _, name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**(spec.get("init_args") or {}))


def load_run(root: Path) -> tuple[nn.Module, dict]:
    run = latest_run(root)
    config = yaml.safe_load((run / "config.yaml").read_text())
    net = build(config["model"]["client"]["init_args"]["net"])
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    net.load_state_dict({k[len("client.net.") :]: v for k, v in state.items() if k.startswith("client.net.")})
    return net.eval(), config


def hessian_stats(net: nn.Module, x: torch.Tensor, y: torch.Tensor, iters: int, probes: int, seed: int):
    """``(top eigenvalue, trace)`` of the Hessian of ``mean CE(net(x), y)`` w.r.t. the parameters."""
    params = [p for p in net.parameters() if p.requires_grad]
    loss = nn.functional.cross_entropy(net(x), y)
    grads = torch.autograd.grad(loss, params, create_graph=True)

    def hvp(v: list[torch.Tensor]) -> list[torch.Tensor]:
        dot = sum((g * u).sum() for g, u in zip(grads, v))
        return list(torch.autograd.grad(dot, params, retain_graph=True))

    gen = torch.Generator().manual_seed(seed)
    v = [torch.randn(p.shape, generator=gen) for p in params]
    eig = 0.0
    for _ in range(iters):
        norm = torch.sqrt(sum((u * u).sum() for u in v))
        v = [u / norm for u in v]
        hv = hvp(v)
        eig = float(sum((a * b).sum() for a, b in zip(hv, v)))
        v = hv
    trace = 0.0
    for _ in range(probes):
        z = [torch.randint(0, 2, p.shape, generator=gen).float() * 2 - 1 for p in params]
        trace += float(sum((a * b).sum() for a, b in zip(hvp(z), z)))
    return eig, trace / probes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", type=Path, nargs="+", help="fit output folders (their latest version)")
    parser.add_argument("--iters", type=int, default=50, help="power-iteration steps")
    parser.add_argument("--probes", type=int, default=100, help="Hutchinson probe vectors")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = ["| run | Hessian top eigenvalue | Hessian trace |", "|---|---|---|"]
    for root in args.runs:
        net, config = load_run(root)
        data = load_dataset(config["data"]["dataset"], config["data"].get("root", "data"))
        eig, trace = hessian_stats(net, data.train_x, data.train_y, args.iters, args.probes, seed=0)
        lines.append(f"| {root} | {eig:.2f} | {trace:.1f} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
