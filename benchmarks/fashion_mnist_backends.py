"""Train the textbook LeNet on real Fashion-MNIST with every framework, same seed, and
compare: accuracy per epoch, seconds per epoch, and the spread between frameworks.

Writes results.json, curves.png and table.md into --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import multigpu
from multigpu.devices import CPUFallbackWarning
from multigpu.plotting import plot_curves


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; exit 1 if the final accuracies spread by more than --max-spread."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="torch,mxnet,paddle")
    p.add_argument("--gpus", default="2")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-limit", type=int, default=None)
    p.add_argument("--test-limit", type=int, default=None)
    p.add_argument("--max-spread", type=float, default=0.02)
    p.add_argument("--out", default="benchmarks/out/fashion_mnist")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = int(args.gpus) if args.gpus.isdigit() else args.gpus
    results = []
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CPUFallbackWarning)
            r = multigpu.train(backend=name, num_gpus=gpus, batch_size=args.batch_size, lr=args.lr,
                               num_epochs=args.epochs, seed=args.seed, progress=not args.quiet,
                               train_limit=args.train_limit, test_limit=args.test_limit)
        results.append(r)
        (out / "results.json").write_text(json.dumps([x.to_dict() for x in results], indent=2))
    plot_curves(results, out / "curves.png", title=f"LeNet on Fashion-MNIST, {gpus} devices, same seed")
    rows = ["| backend | devices | best test acc | final test acc | sec/epoch (mean) | samples/sec |",
            "|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r.backend} | {', '.join(r.devices)} | {max(r.test_acc):.3f} | {r.test_acc[-1]:.3f} | "
                    f"{sum(r.sec_per_epoch) / len(r.sec_per_epoch):.1f} | {r.samples_per_sec:.0f} |")
    finals = [r.test_acc[-1] for r in results]
    spread = max(finals) - min(finals)
    rows.append(f"\nspread of final accuracies: {spread:.4f}")
    (out / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0 if spread <= args.max_spread else 1


if __name__ == "__main__":
    sys.exit(main())
