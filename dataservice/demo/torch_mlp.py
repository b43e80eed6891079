"""The demo's MLP trained in PyTorch, fed by the service through DataLoader workers, without TensorFlow.

    python -m dataservice.demo.torch_mlp [--workers 2] [--loader_workers 2] [--epochs 8] [--batch 64]

The same model and data as the DTensor and JAX demos: the digits' 64-256-128-10
MLP, Adam at 3e-3. The pipeline is registered by a process of its own
(register_digits.py) and runs on the service's workers in distributed_epoch,
batched there; this process builds a DataLoader over a ServiceIterableDataset
whose worker processes share one job (each batch to one of them), calls
set_epoch before each epoch, and never imports TensorFlow (it says so at the
end). Nor does it make an RPC itself: only the DataLoader's workers do, so
no gRPC state crosses their fork.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

NUM_FEATURES = 64
NUM_CLASSES = 10


def make_model(seed: int = 22):
    """Xavier-uniform weights and zero biases, as the DTensor demo's DenseLayer."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(NUM_FEATURES, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, NUM_CLASSES),
    )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(layer.weight)
            torch.nn.init.zeros_(layer.bias)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="the service's worker processes")
    parser.add_argument("--loader_workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="batch size (batched on the service's workers)")
    args = parser.parse_args(argv)
    if min(args.workers, args.epochs, args.batch, args.loader_workers + 1) < 1:
        parser.error("--workers, --epochs and --batch must be positive, --loader_workers not negative")
    import torch

    from dataservice.demo.register_digits import register_in_a_process
    from dataservice.frameworks.torch_input import ServiceIterableDataset
    from dataservice.local_cluster import LocalCluster

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, eps=1e-7)
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    device = accelerator or torch.device("cpu")
    model.to(device)
    with LocalCluster(num_workers=args.workers) as cluster:
        ids = register_in_a_process(cluster.target, tempfile.mkdtemp(prefix="dataservice-digits-"), args.batch)
        train = ServiceIterableDataset(cluster.target, ids["train"], "distributed_epoch")
        test = ServiceIterableDataset(cluster.target, ids["test"], "distributed_epoch")

        def loader(dataset: ServiceIterableDataset) -> torch.utils.data.DataLoader:
            # batch_size=None: the service batches. Pinned batches copy to an accelerator asynchronously.
            return torch.utils.data.DataLoader(
                dataset, batch_size=None, num_workers=args.loader_workers, pin_memory=accelerator is not None
            )

        train_loader, test_loader = loader(train), loader(test)
        print(
            f"training a 64-256-128-10 MLP in PyTorch on {accelerator or 'the CPU'}, batch {args.batch}, fed by "
            f"the service through {args.loader_workers} DataLoader workers",
            flush=True,
        )
        for epoch in range(1, args.epochs + 1):
            train.set_epoch(epoch - 1)
            test.set_epoch(epoch - 1)
            start = time.monotonic()
            model.train()
            loss_sum, correct, examples = 0.0, 0, 0
            for x, y in train_loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                loss_sum += float(loss) * len(y)
                correct += int((logits.argmax(1) == y).sum())
                examples += len(y)
            seconds = time.monotonic() - start
            model.eval()
            test_correct, test_examples = 0, 0
            with torch.no_grad():
                for x, y in test_loader:
                    logits = model(x.to(device))
                    test_correct += int((logits.argmax(1).cpu() == y).sum())
                    test_examples += len(y)
            test_acc = test_correct / test_examples
            print(
                f"epoch {epoch}: train loss {loss_sum / examples:.3f} accuracy {correct / examples:.3f} | test "
                f"accuracy {test_acc:.3f} | {examples} examples in {seconds:.2f} s "
                f"({examples / seconds:.0f} examples/s)",
                flush=True,
            )
    print(f"final test accuracy {test_acc:.3f}")
    print(f"tensorflow imported by the trainer: {'yes' if 'tensorflow' in sys.modules else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
