"""The ``import`` and ``export`` commands (registered into tinytrain.cli)."""
from __future__ import annotations

from pathlib import Path

from tinytrain import cli
from tinytrain.interop.ir import InteropError

#: file suffix -> importer
FORMATS = {".pt": "torch", ".pth": "torch", ".onnx": "onnx", ".tflite": "tflite"}


def _input_scale(v: str):
    if v in ("unit", "data"):
        return v
    try:
        return float(v)
    except ValueError:
        raise InteropError(f"--input-scale {v!r}: use unit, data or a positive number") from None


def _load_torch(path: Path):
    try:
        import torch
    except ImportError:
        raise InteropError("importing a PyTorch file needs torch: pip install 'tinytrain-mcu[interop]'") from None
    try:  # a pickled nn.Module runs code from the file: import only files you trust
        obj = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as exc:
        raise InteropError(f"{path}: not a readable PyTorch file ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:150]})") from None
    return obj


def import_file(path, dataset, *, calibrate=100, input_scale="unit", fold_batchnorm=False, lr=None, seed=0):
    """The tinytrain model of a .pt/.pth (a saved nn.Module), .onnx or .tflite file."""
    from tinytrain.graph.optim import SGD, ConfigError

    p = Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise InteropError(f"{p}: unknown model format {p.suffix or '(none)'!r}: import .pt/.pth (a saved "
                           "PyTorch nn.Module), .onnx or .tflite")
    if not p.is_file():
        raise InteropError(f"{p}: no such file")
    try:
        opt = SGD(lr=lr) if lr is not None else SGD()
        opt.compile()
    except ConfigError as exc:
        raise InteropError(f"--lr: {exc}") from None
    kw = dict(dataset=dataset, input_scale=input_scale, fold_batchnorm=fold_batchnorm, optimizer=opt,
              seed=seed, calibrate=calibrate, name=p.stem)
    if fmt == "torch":
        from tinytrain.interop.torch_import import from_torch
        return from_torch(_load_torch(p), None, **kw)
    if fmt == "onnx":
        from tinytrain.interop.onnx_import import from_onnx
        return from_onnx(p, **kw)
    from tinytrain.interop.tflite_import import from_tflite
    kw.pop("fold_batchnorm")
    return from_tflite(p, **kw)


def _import_args(p):
    p.add_argument("file", metavar="FILE", help="a saved PyTorch nn.Module (.pt/.pth, torch.save(model)), "
                   "an ONNX model (.onnx) or a TFLite model (.tflite, int8 or float)")
    p.add_argument("--data", required=True, help="the dataset the model reads (built-in name or file): "
                   "shapes are checked, calibration and accuracy use it")
    p.add_argument("--out", required=True, help="the tinytrain model file (.tt) to write")
    p.add_argument("--calibrate", type=int, default=100, metavar="N",
                   help="training samples for the per-layer quantization error (default 100)")
    p.add_argument("--input-scale", default="unit", metavar="S",
                   help="what the source model reads relative to the data's floats: unit (floats / "
                   "2^ceil(log2 max|x|), tinytrain's convention; default), data (the floats as they are) "
                   "or a number c (it reads c * x)")
    p.add_argument("--fold-batchnorm", action="store_true",
                   help="fold each BatchNorm into the convolution before it instead of keeping it as a layer")
    p.add_argument("--lr", type=float, help="learning rate of the imported model's integer SGD (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of the training PRNG stored in the model")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--json", action="store_true", help="print the import report as JSON (stdout holds only it)")


def _import_run(args) -> int:
    from tinytrain import data
    from tinytrain.graph import io as tio

    if args.calibrate < 1:
        raise InteropError(f"--calibrate must be >= 1, got {args.calibrate}")
    tio.check_writable(args.out)
    if Path(args.out).exists() and not args.force:
        raise InteropError(f"{args.out} exists: pass --force to replace it or choose another --out")
    ds = data.load(args.data)
    model = import_file(args.file, ds, calibrate=args.calibrate, input_scale=_input_scale(args.input_scale),
                        fold_batchnorm=args.fold_batchnorm, lr=args.lr, seed=args.seed)
    rep = dict(model.import_report, source=str(args.file), out=str(args.out), data=ds.name,
               state_hash=f"{model.state_hash():08x}", params=model.param_count())
    tio.save(model, args.out, extra={"dataset": ds.name, "data_source": ds.source, "seed": args.seed,
                                     "import": rep})
    if args.json:
        cli._emit_json(rep)
        return 0
    print(model.summary())
    print(f"{'layer':>5} {'type':16s} {'node':20s} {'rel. RMS error':>14} {'SQNR dB':>8} {'sat.':>5} {'k':>2}")
    for r in rep["layers"]:
        sq = "-" if r["sqnr_db"] is None else f"{r['sqnr_db']:.1f}"
        print(f"{r['layer']:5d} {r['type']:16s} {r['node'][:20]:20s} {r['rel_rms_error']:14.4f} {sq:>8} "
              f"{r['act_saturations']:5d} {r['weight_shift']:2d}")
    print(f"accuracy on {ds.name} test: float {100 * rep['float_accuracy']:.2f} %, integer "
          f"{100 * rep['integer_accuracy']:.2f} % ({rep['accuracy_drop_points']:+.2f} points drop); "
          f"saved to {args.out}")
    return 0


def _export_args(p):
    p.add_argument("--model", required=True, help="a saved tinytrain model (.tt)")
    p.add_argument("--onnx", required=True, metavar="OUT.onnx", help="the ONNX file to write")
    p.add_argument("--qdq", action="store_true", help="store parameters as their integers behind "
                   "DequantizeLinear (int16 weights, int32 biases) and quantize the input to int8 as tinytrain does")
    p.add_argument("--json", action="store_true", help="print a JSON summary (stdout holds only it)")


def _export_run(args) -> int:
    from tinytrain.graph import io as tio
    from tinytrain.interop.export_onnx import to_onnx

    tio.check_writable(args.onnx)
    model, _ = tio.load(args.model)
    m = to_onnx(model, args.onnx, qdq=args.qdq)
    info = {"model": str(args.model), "onnx": str(args.onnx), "qdq": bool(args.qdq), "opset": m.opset_import[0].version,
            "nodes": len(m.graph.node), "input_scaling": m.doc_string}
    if args.json:
        cli._emit_json(info)
    else:
        print(f"wrote {args.onnx}: {info['nodes']} nodes, opset {info['opset']}"
              f"{', QDQ parameters' if args.qdq else ''}\n{m.doc_string}")
    return 0


cli.register("import", "import a PyTorch, ONNX or TFLite model into a tinytrain model (post-training "
             "quantization, with a per-layer error report)", _import_args, _import_run)
cli.register("export", "export a tinytrain model to ONNX (float graph of its parameters, or QDQ)",
             _export_args, _export_run)
