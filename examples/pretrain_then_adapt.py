"""Pre-train in PyTorch, import, verify on the (emulated) board, adapt to new classes there.

1. A W3-shaped CNN (Conv-BN-ReLU-MaxPool x 2, Linear) is trained in PyTorch float on digits
   0-6 only ("the factory"), with a 10-way head.
2. It is imported into tinytrain by post-training quantization (``tt.from_torch``): the report
   gives float and integer accuracy.
3. C is generated and the imported model trains on QEMU's Cortex-M4 (``mps2_an386``) to the
   simulator's state hash, step by step (skipped, with a note, without qemu/arm-gcc/PlatformIO).
4. The device then adapts to all ten digits from a small set it collects (``--per-class``
   samples per digit) with a partial update (the ``train=`` option of integer SGD): ``bias``,
   ``last:1`` (only the Dense head learns; the convolutions stay in flash) or ``all``. The
   adaptation is the integer training the board runs (the simulator equals it bit for bit);
   the ``last:1`` variant is verified on QEMU too. For each variant: accuracy on all digits,
   on the old (0-6) and the new (7-9) ones, and the RAM the board needs.

    .venv/bin/python examples/pretrain_then_adapt.py [--per-class 20] [--epochs 10] [--steps 100]
"""
from __future__ import annotations

import argparse
import shutil

import numpy as np
import torch

import tinytrain as tt
import tinytrain.torch as ttt
from on_device_adaptation import device_set, subset  # the sibling example (its folder is on sys.path)

OLD = list(range(7))


def accuracies(model, ds):
    conf = np.array(tt.evaluate(model, ds)["confusion"])
    new = [c for c in range(ds.n_classes) if c not in OLD]
    return (float(np.trace(conf) / conf.sum()), float(np.trace(conf[OLD][:, OLD]) / conf[OLD].sum()),
            float(conf[new, new].sum() / conf[new].sum()))


def qemu_ready() -> bool:
    try:
        import platformio  # noqa: F401
    except ImportError:
        return False
    return all(shutil.which(t) for t in ("qemu-system-arm", "arm-none-eabi-gcc"))


def verify_on_board(model, ds, steps, what):
    if not qemu_ready():
        print(f"  {what}: QEMU verification skipped (needs qemu-system-arm, arm-none-eabi-gcc, PlatformIO)")
        return
    from tinytrain.verify import verify
    r = verify(model.copy(), ds, steps, board="mps2_an386", json=True)
    print(f"  {what}: {r['steps']} training steps on QEMU mps2_an386 (Cortex-M4), {r['mismatches']} mismatches "
          f"with the simulator, {r['instructions_per_step']:,.0f} instructions/step, ELF RAM {r['ram_bytes']:,} B")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pretrain-epochs", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=10, help="adaptation epochs on the device set")
    ap.add_argument("--per-class", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.02, help="integer SGD learning rate of the adaptation")
    ap.add_argument("--steps", type=int, default=100, help="training steps verified on QEMU")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)

    ds = tt.load_dataset("digits-image")
    factory = subset(ds, np.isin(ds.y_train, OLD), "digits-0-6")
    torch.manual_seed(a.seed)
    net = ttt.train(ttt.digits_cnn(), ttt.dataset_inputs(factory, quantized=False), factory.y_train,
                    a.pretrain_epochs, seed=a.seed)
    base = tt.from_torch(net, None, dataset=factory)
    r = base.import_report
    print(f"1-2. PyTorch float on digits 0-6 ({len(factory.x_train)} samples, {a.pretrain_epochs} epochs), imported: "
          f"test accuracy (all ten digits, 7-9 never seen) float {100 * r['float_accuracy']:.2f} %, "
          f"integer {100 * r['integer_accuracy']:.2f} %")
    all0, old0, new0 = accuracies(base, ds)
    print(f"     imported model on all test digits: all {all0:.3f}, old 0-6 {old0:.3f}, new 7-9 {new0:.3f}")
    print("3. the imported model on the board:")
    verify_on_board(base, factory, a.steps, "imported (train='all')")
    dev = device_set(ds, a.per_class, a.seed)
    print(f"4. adaptation on the device set: {len(dev.x_train)} samples ({a.per_class} per digit), {a.epochs} "
          f"epochs, integer SGD lr {a.lr}\n")
    print(f"   {'update':8s} {'all':>6s} {'0-6':>6s} {'7-9':>6s} | {'RAM B':>7s} {'frozen in flash B':>17s}")
    for train in ("bias", "last:1", "all"):
        m = tt.from_torch(net, None, dataset=ds, optimizer=tt.SGD(lr=a.lr, train=train))
        tt.fit(m, dev, a.epochs, seed=a.seed, progress=False)
        acc, old, new = accuracies(m, ds)
        mem = tt.memory_estimate(m)
        print(f"   {train:8s} {acc:6.3f} {old:6.3f} {new:6.3f} | {mem['ram_total']:7,d} {mem['flash_frozen_params']:17,d}")
        if train == "last:1":
            adapted_last = m
    print("\n   (RAM: the whole firmware's on mps2_an386 by tinytrain.codegen.memory.breakdown: parameters that "
          "learn, optimizer state, activations kept for backward, errors, scratch, protocol, stack)")
    verify_on_board(adapted_last, dev, a.steps, "adapted (train='last:1')")


if __name__ == "__main__":
    main()
