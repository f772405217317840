"""Conformance specs: data, registry, distributed, dispatch and value-check switches, kernels'
registry functions, the demo and the command line."""

from __future__ import annotations

import functools
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torchvision import tv_tensors

import visionblocks
from tests.conformance.framework import Arg, Spec
from visionblocks import distributed, kernels
from visionblocks import registry as reg
from visionblocks.cli import build_parser, main
from visionblocks.cli.demo import run_demo
from visionblocks.data import (
    CocoCheck,
    CocoInstances,
    CocoKeypoints,
    CocoSegmentation,
    DetectionBatch,
    DevicePrefetcher,
    GroupedBatchSampler,
    aspect_ratio_groups,
    check_coco,
    coco_evaluate,
    collate_detection,
    instance_fields,
    make_synthetic_coco,
    move_to_device,
    prefetch_to_device,
)
from visionblocks.data.coco import CocoBase
from visionblocks.weights import LoadError, LoadReport, load_partial, read_state_dict

_TEMP: list[tempfile.TemporaryDirectory] = []  # made at first use, removed by conftest.py


def _folder() -> str:
    """A fresh folder inside this module's temporary directory."""
    if not _TEMP:
        _TEMP.append(tempfile.TemporaryDirectory(prefix="vb-conformance-"))
    return tempfile.mkdtemp(dir=_TEMP[0].name)


@functools.cache
def _coco() -> tuple[Path, Path]:
    """A tiny synthetic COCO dataset, written once per test process."""
    folder = Path(_folder())
    ann = make_synthetic_coco(folder, num_images=3, image_size=(32, 40), seed=0)
    return folder / "images", Path(ann)


@functools.cache
def _coco_keypoints() -> tuple[Path, Path]:
    """A tiny synthetic COCO keypoint dataset, written once per test process."""
    folder = Path(_folder())
    ann = make_synthetic_coco(folder, num_images=2, image_size=(32, 40), seed=0, keypoints=True)
    return folder / "images", Path(ann)


def _dataset() -> CocoInstances:
    return CocoInstances(*_coco())


def _item() -> tuple[Any, Any]:
    return _dataset()[0]


def _bool(name: str) -> Arg:
    return Arg(name, "bool")


def _coco_args() -> list[Arg]:
    return [
        Arg("root", "path"),
        Arg("ann_file", "path"),
        Arg("transforms", "callable", optional=True),
        Arg("invalid", "choice"),
        # min_box_size=inf drops every box: legal (and absurd), so it is tolerated.
        Arg("min_box_size", "float"),
    ]


def _detection() -> tuple[Any, dict[str, Any]]:
    root, ann = _coco()
    return CocoInstances, {
        "root": root,
        "ann_file": ann,
        "transforms": None,
        "with_masks": False,
        "with_polygons": False,
        "remove_empty": False,
        "contiguous_labels": True,
        "crowd": "keep",
        "remove_crowd_only": False,
        "invalid": "drop",
        "min_box_size": 0.0,
    }


def _keypoints() -> tuple[Any, dict[str, Any]]:
    root, ann = _coco_keypoints()
    return CocoKeypoints, {
        "root": root,
        "ann_file": ann,
        "transforms": None,
        "with_masks": False,
        "with_polygons": False,
        "remove_empty": False,
        "contiguous_labels": True,
        "crowd": "keep",
        "remove_crowd_only": False,
        "other_categories": "drop",
        "flip_pairs": [(1, 2), (3, 4), (5, 6), (7, 8)],
        "invalid": "drop",
        "min_box_size": 0.0,
    }


def _segmentation() -> tuple[Any, dict[str, Any]]:
    root, ann = _coco()
    return CocoSegmentation, {
        "root": root,
        "ann_file": ann,
        "transforms": None,
        "remove_empty": False,
        "ignore_index": 255,
        "invalid": "drop",
        "min_box_size": 0.0,
    }


def _evaluate() -> tuple[Any, dict[str, Any]]:
    dataset = _dataset()
    _, target = dataset[0]
    n = len(target["labels"])
    outputs = {
        target["image_id"]: {
            "boxes": target["boxes"].as_subclass(torch.Tensor),
            "scores": torch.ones(n),
            "labels": target["labels"],
        }
    }
    return coco_evaluate, {
        "predictions": outputs,
        "coco_gt": dataset,
        "iou_type": "bbox",
        "backend": "pycocotools",
        "mask_threshold": 0.5,
    }


def _evaluate_keypoints() -> tuple[Any, dict[str, Any]]:
    gt = {
        "images": [{"id": 1, "height": 40, "width": 40}],
        "categories": [{"id": 1, "name": "arm", "keypoints": ["a", "b", "c"]}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "bbox": [5, 5, 20, 25],
             "area": 400.0, "keypoints": [10, 8, 2, 15, 20, 2, 22, 28, 1], "num_keypoints": 3}
        ],
    }  # fmt: skip
    points = torch.tensor([[[10.0, 8.0], [15.0, 20.0], [22.0, 28.0]]])
    outputs = {1: {"keypoints": points, "scores": torch.ones(1), "labels": torch.tensor([1])}}
    return coco_evaluate, {"predictions": outputs, "coco_gt": gt, "iou_type": "keypoints",
                           "sigmas": [0.05, 0.05, 0.05]}  # fmt: skip


def _collate() -> tuple[Any, dict[str, Any]]:
    dataset = _dataset()
    return collate_detection, {
        "batch": [dataset[0], dataset[1]],
        "size_divisible": 32,
        "pad_value": 0.0,
    }


def _grouped(**kwargs: Any) -> list[list[int]]:
    return list(GroupedBatchSampler(**kwargs))


def _synthetic(**kwargs: Any) -> Path:
    return make_synthetic_coco(_folder(), **kwargs)


def _prefetch(loader: Any, device: Any, non_blocking: bool) -> list[Any]:
    return list(prefetch_to_device(loader, device, non_blocking=non_blocking))


def _prefetcher(loader: Any, device: Any, non_blocking: bool) -> list[Any]:
    return list(DevicePrefetcher(loader, device, non_blocking=non_blocking))


def _batch() -> dict[str, Any]:
    boxes = tv_tensors.BoundingBoxes(torch.rand(2, 4) * 8, format="XYXY", canvas_size=(8, 8))
    return {"image": torch.zeros(3, 8, 8), "boxes": boxes, "labels": torch.tensor([1, 2])}


def _fields(inputs: Any) -> Any:
    return instance_fields(inputs)  # one positional tuple, as v2 transforms may pass


def _restoring(setter: Any, restore: Any) -> Any:
    def call(**kwargs: Any) -> Any:
        try:
            return setter(**kwargs)
        finally:
            restore()

    return call


def _enter(manager: Any) -> Any:
    def call(**kwargs: Any) -> Any:
        with manager(**kwargs):
            return True

    return call


def _quiet_demo(**kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_demo(**kwargs)


SPECS: list[Spec] = [
    Spec(
        CocoInstances,
        _detection,
        args=[
            *_coco_args(),
            _bool("with_masks"),
            _bool("with_polygons"),
            _bool("remove_empty"),
            _bool("contiguous_labels"),
            Arg("crowd", "choice"),
            _bool("remove_crowd_only"),
        ],
        errors=(FileNotFoundError,),
    ),
    Spec(
        CocoKeypoints,
        _keypoints,
        args=[
            *_coco_args(),
            _bool("with_masks"),
            _bool("with_polygons"),
            _bool("remove_empty"),
            _bool("contiguous_labels"),
            Arg("crowd", "choice"),
            _bool("remove_crowd_only"),
            Arg("other_categories", "choice"),
            # None: the pairs read from the names; "longer" repeats a pair (an index twice)
            Arg("flip_pairs", "sequence", optional=True),
        ],
        errors=(FileNotFoundError,),
    ),
    Spec(
        CocoSegmentation,
        _segmentation,
        args=[
            *_coco_args(),
            _bool("remove_empty"),
            # ignore_index: any int outside 0..K is legal, -1 included.
            Arg("ignore_index", "int", accept={"negative", "huge"}),
        ],
        errors=(FileNotFoundError,),
    ),
    Spec(
        check_coco,
        lambda: (
            check_coco,
            {
                "ann_file": _coco()[1],
                "images": _coco()[0],
                "masks": False,
                "min_box_size": 0.0,
                "keep_repairable": False,
                "keypoints": None,
                "progress": False,
            },
        ),
        args=[
            Arg("ann_file", "path"),
            Arg("images", "path", optional=True),
            _bool("masks"),
            Arg("min_box_size", "float"),
            _bool("keep_repairable"),
            Arg("keypoints", "bool", optional=True),  # None: when the file has key points
            Arg("progress", "bool", optional=True),
        ],
        errors=(FileNotFoundError,),
    ),
    Spec(
        coco_evaluate,
        _evaluate,
        args=[
            # a str is the path of a results file: a missing one is a FileNotFoundError
            Arg("predictions", "mapping"),
            Arg("coco_gt", "module"),
            Arg("iou_type", "choice"),
            Arg("backend", "choice"),
            Arg("mask_threshold", "float"),
        ],
        errors=(FileNotFoundError,),
    ),
    Spec(
        coco_evaluate,
        _evaluate_keypoints,
        args=[Arg("predictions", "mapping"), Arg("sigmas", "sequence", optional=True)],
        errors=(FileNotFoundError,),
        label="keypoints",
    ),
    Spec(
        collate_detection,
        _collate,
        args=[
            Arg("batch", "sequence", accept={"longer"}),  # one more item is one more image
            Arg("size_divisible", "int"),
            Arg("pad_value", "float"),
        ],
    ),
    Spec(
        GroupedBatchSampler,
        lambda: (
            _grouped,
            {
                "sampler": range(6),
                "group_ids": [0, 1, 0, 1, 0, 1],
                "batch_size": 2,
                "drop_last": False,
            },
        ),
        args=[
            Arg("sampler", "sequence", accept={"longer"}),  # repeats an index: a sampler may
            Arg("group_ids", "sequence", accept={"longer"}),  # ids of indices never sampled
            Arg("batch_size", "int", accept={"huge"}),  # one batch per group
            _bool("drop_last"),
        ],
    ),
    Spec(
        aspect_ratio_groups,
        lambda: (
            aspect_ratio_groups,
            {
                "dataset": _dataset(),
                "bins_per_octave": 0,
            },
        ),
        args=[Arg("dataset", "module"), Arg("bins_per_octave", "int")],
    ),
    Spec(
        make_synthetic_coco,
        lambda: (
            _synthetic,
            {
                "num_images": 2,
                "image_size": (16, 24),
                "num_classes": 2,
                "seed": 0,
                "keypoints": False,
            },
        ),
        args=[
            # huge counts are slow rather than wrong (writing 10**9 images is what was asked)
            Arg("num_images", "int", skip={"huge"}),
            Arg("image_size", "sequence"),
            Arg("num_classes", "int", skip={"huge"}),
            Arg("seed", "int"),
            _bool("keypoints"),
        ],
    ),
    Spec(
        move_to_device,
        lambda: (
            move_to_device,
            {
                "data": _batch(),
                "device": "cpu",
                "non_blocking": False,
            },
        ),
        args=[Arg("device", "choice"), _bool("non_blocking")],
    ),
    Spec(
        prefetch_to_device,
        lambda: (
            _prefetch,
            {
                "loader": [_batch(), _batch()],
                "device": "cpu",
                "non_blocking": True,
            },
        ),
        args=[Arg("loader", "module"), Arg("device", "choice"), _bool("non_blocking")],
    ),
    Spec(
        DevicePrefetcher,
        lambda: (
            _prefetcher,
            {
                "loader": [_batch()],
                "device": "cpu",
                "non_blocking": True,
            },
        ),
        args=[Arg("loader", "module"), Arg("device", "choice"), _bool("non_blocking")],
    ),
    Spec(
        instance_fields,
        lambda: (
            _fields,
            {
                "inputs": (
                    torch.zeros(3, 4, 4),
                    {"labels": torch.tensor([1]), "iscrowd": torch.tensor([0])},
                ),
            },
        ),
        args=[
            # transforms' inputs hold images, masks... beside the target: non-dicts are skipped
            Arg("inputs", "sequence", accept={"longer", "nan_item"}),
        ],
    ),
    Spec(
        distributed.reduce_mean,
        lambda: (
            distributed.reduce_mean,
            {
                "tensor": torch.tensor([1.0, 3.0]),
            },
        ),
        args=[
            # no process group: the mean over one rank is the tensor itself, whatever its shape
            # integer counts average to a float mean, as documented
            Arg("tensor", "tensor", accept={"rank_up", "rank_down", "meta", "dtype"}),
        ],
    ),
    Spec(
        reg.Registry,
        lambda: (
            reg.Registry,
            {
                "name": "conformance",
                "modules": (),
                "description": "a test registry",
            },
        ),
        args=[
            Arg("name", "choice", accept={"unknown"}),  # any name is a name
            Arg("modules", "sequence", skip={"longer", "nan_item"}),  # built from an empty tuple
            Arg("description", "choice", accept={"unknown"}),
        ],
    ),
    Spec(
        reg.get_registry,
        lambda: (reg.get_registry, {"name": "losses"}),
        args=[Arg("name", "choice", aliases=("registry",))],
        errors=(KeyError,),
    ),
    Spec(reg.load_plugins, lambda: (reg.load_plugins, {"force": False}), args=[_bool("force")]),
    Spec(
        visionblocks.set_impl,
        lambda: (
            _restoring(visionblocks.set_impl, lambda: visionblocks.set_impl(None)),
            {"name": "torch"},
        ),
        args=[Arg("name", "choice", optional=True, aliases=("impl",))],
    ),
    Spec(
        visionblocks.use_impl,
        lambda: (_enter(visionblocks.use_impl), {"name": "torch"}),
        args=[Arg("name", "choice", aliases=("impl",))],
    ),
    Spec(
        visionblocks.set_value_checks,
        lambda: (
            _restoring(visionblocks.set_value_checks, lambda: visionblocks.set_value_checks(True)),
            {"enabled": True},
        ),
        args=[Arg("enabled", "bool")],
    ),
    Spec(
        visionblocks.value_checks,
        lambda: (_enter(visionblocks.value_checks), {"enabled": False}),
        args=[Arg("enabled", "bool")],
    ),
    Spec(
        run_demo,
        lambda: (
            _quiet_demo,
            {
                "steps": 1,
                "out": _folder(),
                "device": "cpu",
                "distributed": False,
                "seed": 0,
                "amp": False,
                "detect_nonfinite": False,
            },
        ),
        args=[
            # an accepted mutation runs the whole demo: only the early rejections are generated
            Arg("steps", "int", skip={"zero", "huge"}),
            Arg("out", "path", skip={"missing"}),  # an output folder: created when missing
            Arg("device", "choice"),
            Arg("seed", "int", skip={"zero", "huge", "none"}),  # None: the tuned default
            Arg("amp", "bool", skip={"none"}),  # None: the device's default
            Arg("detect_nonfinite", "bool"),
        ],
    ),
]

EXEMPT: dict[object, str] = {
    CocoBase: "the shared base of CocoInstances and CocoSegmentation, not meant to be built "
    "on its own; its arguments are theirs (spec'd there)",
    CocoCheck: "the result object check_coco returns (a dataclass of findings), not built by "
    "users; check_coco is spec'd",
    DetectionBatch: "a NamedTuple of collate_detection's results; collate_detection is spec'd",
    distributed.all_gather_object: "takes any picklable object: there is no bad input",
    distributed.barrier: "takes no arguments",
    distributed.get_rank: "takes no arguments",
    distributed.get_world_size: "takes no arguments",
    distributed.is_dist_initialized: "takes no arguments",
    distributed.is_main_process: "takes no arguments",
    visionblocks.get_impl: "takes no arguments",
    visionblocks.value_checks_enabled: "takes no arguments",
    kernels.available: "takes no arguments",
    build_parser: "takes no arguments",
    reg.ConfigError: "the exception Registry.build raises for a config key; users do not build it",
    main: "argument errors are argparse's (usage and exit status 2), tested in tests/cli/test_cli.py",
}


def _kernel_entry_points() -> dict[object, str]:
    from visionblocks.kernels import (
        focal,
        iou,
        local_attention,
        local_filter,
        ms_deform_attn,
        rotated_roi_align,
    )

    why = (
        "a Triton kernel entry point, reached through the op's impl= dispatch, which validates "
        "every argument first (the op is spec'd); the launch guards are tested in tests/kernels"
    )
    return {
        fn: why
        for fn in (
            focal.sigmoid_focal_loss_triton,
            iou.generalized_box_iou_loss_triton,
            iou.distance_box_iou_loss_triton,
            iou.complete_box_iou_loss_triton,
            local_attention.local_attention2d_triton,
            local_filter.local_filter_triton,
            ms_deform_attn.ms_deform_attn_triton,
            rotated_roi_align.rotated_roi_align_triton,
        )
    }


EXEMPT.update(_kernel_entry_points())


# ------------------------------------------------------------------------------ weights
def _checkpoint() -> Path:
    path = Path(_folder()) / "model.pt"
    torch.save({"state_dict": _small_model().state_dict(), "epoch": 3}, path)
    return path


def _small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4, 2))


def _load() -> tuple[Any, dict[str, Any]]:
    return load_partial, {
        "model": _small_model(),
        "source": _checkpoint(),
        "key": None,
        "rename": None,
        "strip_prefixes": ("module.",),
        "skip_mismatched": True,
        "adapt_input_channels": True,
        "strict": False,
        "dry_run": False,
        "require": None,
        "min_loaded": None,
        "auto_prefix": True,
        "match": "names",
    }


SPECS += [
    Spec(
        read_state_dict,
        lambda: (
            read_state_dict,
            {
                "path": _checkpoint(),
                "map_location": "cpu",
                "key": None,
            },
        ),
        args=[
            Arg("path", "path", aliases=("checkpoint",)),
            Arg("map_location", "choice", optional=True),  # None: torch's own default
            Arg("key", "choice", optional=True),
        ],
        errors=(FileNotFoundError, KeyError),
    ),
    Spec(
        load_partial,
        _load,
        args=[
            Arg("model", "module"),
            Arg("source", "path", aliases=("checkpoint",)),
            Arg("key", "choice", optional=True),
            Arg(
                "rename", "sequence", optional=True, skip={"longer", "nan_item"}
            ),  # built from None
            # one more prefix to try; a str is one prefix
            Arg("strip_prefixes", "sequence", accept={"longer", "str"}),
            Arg("skip_mismatched", "bool"),
            Arg("adapt_input_channels", "bool"),
            Arg("strict", "bool"),
            Arg("dry_run", "bool"),
            Arg(
                "require", "sequence", optional=True, skip={"longer", "nan_item"}
            ),  # built from None
            Arg("min_loaded", "float", optional=True, skip={"inf"}),
            Arg("auto_prefix", "bool"),
            Arg("match", "choice"),
        ],
        errors=(FileNotFoundError, KeyError),
    ),
]

EXEMPT.update(
    {
        LoadReport: "the result object load_partial returns (a dataclass), not built by users",
        LoadError: "the exception load_partial raises, with its report",
    }
)
