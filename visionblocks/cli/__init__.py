"""The ``visionblocks`` command (also ``python -m visionblocks``).

Subcommands:

- ``visionblocks demo [--task detection|segmentation] [--steps N] [--out DIR] [--device
  auto|cpu|cuda] [--distributed] [--seed S] [--amp | --no-amp] [--detect-nonfinite]``: train
  the reference detector (or segmenter) on synthetic COCO and evaluate it.
- ``visionblocks list [REGISTRY|kernels]``: registered names per registry, or the fast-path
  report.
- ``visionblocks inspect CHECKPOINT [--model NAME]``: what a checkpoint holds, and how it
  would load into a registered backbone (by names, and by structure when names do not fit).
- ``visionblocks check-coco ANN_FILE [--images DIR] [--fix OUT.json] [--[no-]keypoints]``:
  list every problem of a COCO annotation file (its key points too, for a keypoint file);
  exit status 0 when there is none (or all were fixed), else 1.
- ``visionblocks bench [PATTERN ...] [--load quiet|busy|both]``: run the benchmark cases
  (on a quiet machine, beside busy neighbour processes, or both) and print the tables. The
  suite is in the repository, not the wheel: see `visionblocks.cli._bench`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from visionblocks._core.namespace import public_dir
from visionblocks._core.version import __version__
from visionblocks.registry import REGISTRIES, get_registry

__all__ = ["build_parser", "main"]
__dir__ = public_dir(__name__, __all__)


def _cmd_list(args: argparse.Namespace) -> int:
    if args.registry == "kernels":
        from visionblocks.kernels import available

        report = available()
        triton = report["triton"] or f"unavailable ({report['reason']})"
        print(f"triton:        {triton}")
        print(f"interpreter:   {'on (TRITON_INTERPRET=1)' if report['interpret'] else 'off'}")
        print(f"cuda device:   {report['cuda'] or 'none'}")
        print(f"default impl:  {report['default_impl']}")
        print(f"kernels:       {', '.join(report['kernels'])}")
        return 0
    if args.registry is not None:
        try:
            registries = [get_registry(args.registry)]
        except KeyError as exc:
            print(f"visionblocks list: {exc.args[0]} (or 'kernels')", file=sys.stderr)
            return 2
    else:
        registries = [REGISTRIES[name] for name in sorted(REGISTRIES)]
    for registry in registries:
        names = registry.list()
        print(f"{registry.name} ({len(names)}): {registry.description}")
        for name in names:
            aliases = registry.aliases(name)
            suffix = f"  (aliases: {', '.join(aliases)})" if aliases else ""
            print(f"  {name}{suffix}")
        for prefix in registry.namespaces():
            print(f"  {prefix}<name>  (a family of names, resolved on lookup, not listed)")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from visionblocks.cli._inspect import run_inspect

    return run_inspect(args.checkpoint, args.model, key=args.key)


def _cmd_check_coco(args: argparse.Namespace) -> int:
    from visionblocks.data.check import check_coco

    try:
        report = check_coco(
            args.ann_file,
            images=args.images,
            masks=args.masks,
            min_box_size=args.min_box_size,
            keep_repairable=args.keep_repairable,
            keypoints=args.keypoints,
        )
    except (FileNotFoundError, ValueError, TypeError) as exc:
        print(f"visionblocks check-coco: {exc}", file=sys.stderr)
        return 1
    print(report)
    if args.fix is None:
        return 0 if report.ok else 1
    try:
        out = report.write_fixed(args.fix)
    except (ValueError, OSError) as exc:
        print(f"visionblocks check-coco: {exc}", file=sys.stderr)
        return 1
    print(f"wrote a cleaned copy to '{out}' (the checked file is unchanged)")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from visionblocks.cli.demo import DEFAULT_STEPS, run_demo

    try:
        if args.task == "segmentation":
            from visionblocks.cli._demo_seg import DEFAULT_STEPS as SEG_STEPS
            from visionblocks.cli._demo_seg import run_segmentation_demo

            for flag, given in (("--distributed", args.distributed),
                                ("--detect-nonfinite", args.detect_nonfinite)):  # fmt: skip
                if given:
                    raise ValueError(f"{flag} is for --task detection")
            run_segmentation_demo(
                steps=SEG_STEPS if args.steps is None else args.steps,
                out="demo-seg-out" if args.out is None else args.out, device=args.device,
                seed=args.seed, amp=args.amp,
            )  # fmt: skip
            return 0
        run_demo(
            steps=DEFAULT_STEPS if args.steps is None else args.steps,
            out="demo-out" if args.out is None else args.out, device=args.device,
            distributed=args.distributed, seed=args.seed, amp=args.amp,
            detect_nonfinite=args.detect_nonfinite, export=args.export,
        )  # fmt: skip
    except (RuntimeError, ValueError, OSError, FloatingPointError) as exc:
        print(f"visionblocks demo: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    import torch

    from visionblocks.deploy import (
        ExportError,
        export_kwargs,
        export_model,
        load_for_export,
        max_stride,
    )

    try:
        model = load_for_export(args.source, args.weights)
        channels = len(getattr(model, "pixel_mean", (0, 0, 0)))
        h, w = args.image_size
        example = torch.rand(args.batch, channels, h, w) * 255
        result = export_model(
            model, example, args.out, args.format, dynamic_hw=not args.static,
            stride=max_stride(model), kwargs=export_kwargs(model),
        )  # fmt: skip
    except (ExportError, ImportError, RuntimeError, ValueError, TypeError, OSError) as exc:
        print(f"visionblocks export: {exc}", file=sys.stderr)
        return 1
    dynamic = "batch" if args.static else "batch, height and width"
    print(f"wrote {result.path} ({result.format}, {result.size_bytes / 2**20:.2f} MiB; "
          f"dynamic {dynamic})")  # fmt: skip
    print(f"checked against eager on a {args.batch}x{channels}x{h}x{w} input: "
          f"{result.outputs} output tensors, max abs difference {result.max_abs_diff:.3g}")  # fmt: skip
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``visionblocks`` command."""
    parser = argparse.ArgumentParser(
        prog="visionblocks",
        description="PyTorch building blocks for detection and segmentation.",
    )
    parser.add_argument("--version", action="version", version=f"visionblocks {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    from visionblocks.cli._demo_seg import DEFAULT_STEPS as SEG_STEPS
    from visionblocks.cli.demo import DEFAULT_STEPS

    p_demo = sub.add_parser(
        "demo", help="train and evaluate the reference detector on synthetic COCO"
    )
    p_demo.add_argument("--task", choices=("detection", "segmentation"), default="detection",
                        help="detection (default): an FCOS detector scored by COCO AP; "
                        "segmentation: a semantic FPN segmenter trained with CE + Dice, "
                        "scored by mIoU")  # fmt: skip
    p_demo.add_argument("--steps", type=int, default=None, metavar="N",
                        help=f"training steps of 16 images (default {DEFAULT_STEPS}; "
                        f"{SEG_STEPS} for segmentation)")  # fmt: skip
    p_demo.add_argument("--out", default=None, metavar="DIR",
                        help="output folder: metrics.json, model.pt, model.onnx, predictions.png, "
                        "loss.png and the synthetic data (default demo-out); for segmentation "
                        "metrics.json, predictions.png and the data (default demo-seg-out)")  # fmt: skip
    p_demo.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: CUDA when available (default)")  # fmt: skip
    p_demo.add_argument("--distributed", action="store_true",
                        help="train with DDP under torchrun (gloo on CPU, nccl on CUDA)")  # fmt: skip
    p_demo.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="S",
        help="a repeatable run: seed everything, deterministic algorithms, a "
        "fixed CPU thread count (default: seed 0, threads tuned for speed)",
    )
    p_demo.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mixed precision (default: on for CUDA, off on the CPU; --amp "
        "trains in bf16 on the CPU too)",
    )
    p_demo.add_argument(
        "--detect-nonfinite",
        action="store_true",
        help="stop at the first NaN or inf, naming the module and tensor (slower)",
    )
    p_demo.add_argument("--no-export", dest="export", action="store_false",
                        help="do not write model.onnx (by default it is written and checked "
                        "in onnxruntime when onnx, onnxscript and onnxruntime are installed)")  # fmt: skip
    p_demo.set_defaults(func=_cmd_demo)

    p_list = sub.add_parser("list", help="list registered names, or the triton kernel report")
    p_list.add_argument(
        "registry",
        nargs="?",
        default=None,
        help=f"one of: {', '.join(sorted(REGISTRIES))}, kernels (default: all registries)",
    )
    p_list.set_defaults(func=_cmd_list)

    p_inspect = sub.add_parser(
        "inspect",
        help="summarise a checkpoint file, or how it would load into a model",
        description="Summarise a checkpoint file: its format, tensors, dtypes and key prefixes. "
        "With --model NAME, also load it into that backbone as build_backbone does and print "
        "the report, e.g. `visionblocks inspect resnet18.pth --model resnet18`; when the names "
        "do not load it, also every pairing that load_partial(..., match='structure') proposes "
        "(by module-tree order and shape), or why it refuses.",
    )
    p_inspect.add_argument(
        "checkpoint",
        help="a .pt/.pth/.bin/.ckpt/.tar/.pkl or .safetensors file (read without running code "
        "from it: foreign objects become inert placeholders); a backbone name goes after "
        "--model",
    )
    p_inspect.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        help="a backbone name (see `visionblocks list backbones`, or timm/<model>): "
        "load the file into it as build_backbone does and print the report (and, when the "
        "names do not fit, the pairing matched by structure)",
    )
    p_inspect.add_argument(
        "--key",
        default=None,
        metavar="ENTRY",
        help="read the weights under this top-level entry of the file instead of guessing, "
        "as read_state_dict(path, key=...) does: e.g. ema for the EMA model of a YOLOv5 or "
        "ultralytics file, state_dict_ema for timm's",
    )
    p_inspect.set_defaults(func=_cmd_inspect)

    p_check = sub.add_parser(
        "check-coco",
        help="list every problem of a COCO annotation file; --fix writes a cleaned copy",
        description="Check a COCO annotation file as visionblocks.data.CocoInstances does "
        "(CocoKeypoints for a keypoint file), listing every problem with counts and example ids. Exit status: 0 when the dataset "
        "loads every annotation (or --fix wrote a cleaned copy), 1 otherwise.",
    )
    p_check.add_argument("ann_file", help="the COCO annotation JSON")
    p_check.add_argument("--images", metavar="DIR", default=None,
                         help="the images folder: check that every image exists, can be read "
                         "and has the file's height and width")  # fmt: skip
    p_check.add_argument("--fix", metavar="OUT.json", default=None,
                         help="write a cleaned copy: invalid annotations (and, with --images, "
                         "images with missing or mismatched files) left out, boxes clipped, "
                         "area/iscrowd filled; the checked file is never modified")  # fmt: skip
    p_check.add_argument("--masks", action="store_true",
                         help="check as CocoInstances(with_masks=True): an annotation without "
                         "a segmentation is invalid")  # fmt: skip
    p_check.add_argument("--min-box-size", type=float, default=0.0, metavar="S",
                         help="as the dataset's min_box_size (default 0)")  # fmt: skip
    p_check.add_argument("--keep-repairable", action="store_true",
                         help="with --fix, keep annotations whose only problem is their "
                         "segmentation, area or key points, without it (as invalid='keep')")  # fmt: skip
    p_check.add_argument("--keypoints", action=argparse.BooleanOptionalAction, default=None,
                         help="check the key points as CocoKeypoints does (default: when the "
                         "file has a category with 'keypoints'); --no-keypoints checks as "
                         "CocoInstances, which ignores them")  # fmt: skip
    p_check.set_defaults(func=_cmd_check_coco)

    p_export = sub.add_parser(
        "export",
        help="export a model to ONNX or a torch.export program and check it against eager",
        description="Build the model of a JSON config (a MODELS.build config, or "
        '{"model": config, "weights": path}) or of a checkpoint holding its config, load the '
        "weights with load_partial, export it (dynamic batch, height and width) and run the "
        "written file once against the eager model.",
    )
    p_export.add_argument("source", metavar="CONFIG_OR_CHECKPOINT",
                          help="a .json config, or a torch.save checkpoint with 'config' and "
                          "'model' entries")  # fmt: skip
    p_export.add_argument("--format", choices=["onnx", "pt2"], default="onnx",
                          help="onnx (checked with onnxruntime) or pt2 (torch.export.save); "
                          "default: onnx")  # fmt: skip
    p_export.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    p_export.add_argument("--image-size", nargs=2, type=int, default=(256, 256),
                          metavar=("H", "W"),
                          help="size of the example input, multiples of the model's largest "
                          "stride (default: 256 256)")  # fmt: skip
    p_export.add_argument("--batch", type=int, default=2,
                          help="batch of the example input (default: 2)")  # fmt: skip
    p_export.add_argument("--weights", metavar="FILE", default=None,
                          help="a checkpoint to load instead of the one the source names")  # fmt: skip
    p_export.add_argument("--static", action="store_true",
                          help="fixed height and width (only the batch size stays dynamic)")  # fmt: skip
    p_export.set_defaults(func=_cmd_export)

    from visionblocks.cli._bench import add_bench_parser

    add_bench_parser(sub)  # the suite's options when it is found (from a clone)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
