"""Checkpoints in the layouts that other frameworks write, built here (no downloads).

Each ``write_*`` function saves the state dict of a model the way that framework's training
code does, with the same containers, keys and kinds of objects, into ``folder`` and returns
the file's path. Classes of frameworks that are not installed (mmengine's
``HistoryBuffer``, Lightning's ``AttributeDict``) come from `fake_module`: a tiny package
written under ``folder`` with the real import path, imported only while pickling and removed
from ``sys.modules`` and ``sys.path`` afterwards, so a reader truly cannot import it.

`FIXTURES` lists, per layout, the writer and what reading the file must report.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pickle
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import ModuleType

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

__all__ = ["FIXTURES", "Fixture", "TinyNet", "fake_module", "trained"]


class TinyNet(nn.Module):
    """A small classifier with a conv, a BatchNorm (buffers) and a linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn1(self.conv1(x)).relu().mean((2, 3)))


def trained(seed: int = 0) -> tuple[TinyNet, torch.optim.Optimizer, object]:
    """A `TinyNet` after one SGD step (so the optimizer has state) and its LR scheduler."""
    torch.manual_seed(seed)
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=8)
    model(torch.rand(2, 3, 8, 8)).logsumexp(1).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


@contextlib.contextmanager
def fake_module(folder: Path, dotted: str, source: str) -> Iterator[ModuleType]:
    """Import a module ``dotted`` (e.g. ``mmengine.logging.history_buffer``) whose code is
    ``source``, from a package tree written under ``folder``; remove every trace after."""
    parts = dotted.split(".")
    root = folder / "fake_site_packages"
    package = root
    for part in parts[:-1]:
        package = package / part
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
    (package / f"{parts[-1]}.py").write_text(source)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield importlib.import_module(dotted)
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == parts[0] or m.startswith(parts[0] + ".")]:
            del sys.modules[name]


_HISTORY_BUFFER = """
import numpy as np

class HistoryBuffer:
    def __init__(self, log_history=(), count_history=(), max_length=1000000):
        self.max_length = max_length
        self._log_history = np.asarray(log_history, dtype=np.float64)
        self._count_history = np.asarray(count_history, dtype=np.int64)
"""

_ATTRIBUTE_DICT = """
class AttributeDict(dict):
    def __getattr__(self, key):
        return self[key]
"""


def write_torchvision(folder: Path) -> Path:
    """torchvision's ``references/classification/train.py`` checkpoint."""
    model, optimizer, scheduler = trained()
    path = folder / "checkpoint.pth"
    args = argparse.Namespace(model="tinynet", lr=0.1, epochs=12, output_dir=PurePosixPath(folder))
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
         "lr_scheduler": scheduler.state_dict(), "epoch": 3, "args": args},
        path,
    )  # fmt: skip
    return path


def write_mmengine(folder: Path) -> Path:
    """An mmengine / mmdet ``epoch_12.pth`` (``runner.save_checkpoint``)."""
    model, optimizer, scheduler = trained()
    path = folder / "epoch_12.pth"
    with fake_module(folder, "mmengine.logging.history_buffer", _HISTORY_BUFFER) as module:
        buffer = module.HistoryBuffer
        meta = {
            "epoch": 12, "iter": 1000, "mmengine_version": "0.10.4", "seed": np.int64(0),
            "experiment_name": "tinynet_1x", "time": "20240601_120000",
            "hook_msgs": {"last_ckpt": str(path), "best_score": np.float64(0.375)},
            "dataset_meta": {"classes": ("cat", "dog"), "palette": np.array([[220, 20, 60]])},
        }  # fmt: skip
        hub = {
            "log_scalars": {"train/loss": buffer([1.2, 0.9], [1, 1]), "train/lr": buffer([0.1])},
            "runtime_info": {"epoch": 12, "iter": 1000, "max_iters": 1000},
            "resumed_keys": {"epoch": False, "iter": False},
        }
        torch.save(
            {"meta": meta, "state_dict": model.state_dict(), "message_hub": hub,
             "optimizer": optimizer.state_dict(), "param_schedulers": [scheduler.state_dict()]},
            path,
        )  # fmt: skip
    return path


def write_detectron2(folder: Path, protocol: int = pickle.DEFAULT_PROTOCOL) -> Path:
    """A detectron2 model-zoo ``model_final.pkl``: NumPy arrays in a plain pickle."""
    model, _, _ = trained()
    path = folder / f"model_final_p{protocol}.pkl"
    weights = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    with open(path, "wb") as f:
        pickle.dump(
            {"model": weights, "__author__": "Detectron2 Model Zoo", "matching_heuristics": True},
            f,
            protocol=protocol,
        )
    return path


def write_lightning(folder: Path) -> Path:
    """A Lightning ``.ckpt``: the LightningModule held the network as ``self.model``."""
    model, optimizer, scheduler = trained()
    path = folder / "epoch=4-step=500.ckpt"
    with fake_module(folder, "lightning.fabric.utilities.data", _ATTRIBUTE_DICT) as module:
        hparams = module.AttributeDict(lr=0.1, backbone="tinynet", args=argparse.Namespace(x=1))
        state = OrderedDict((f"model.{k}", v) for k, v in model.state_dict().items())
        torch.save(
            {"epoch": 4, "global_step": 500, "pytorch-lightning_version": "2.4.0",
             "state_dict": state, "hyper_parameters": hparams, "hparams_name": "kwargs",
             "optimizer_states": [optimizer.state_dict()],
             "lr_schedulers": [scheduler.state_dict()],
             "callbacks": {"ModelCheckpoint{'monitor': 'val_loss'}": {
                 "best_model_score": torch.tensor(0.25), "best_model_path": str(path)}},
             "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"current": {}}}}},
            path,
        )  # fmt: skip
    return path


def write_timm(folder: Path) -> Path:
    """timm's ``train.py`` checkpoint with EMA weights (``state_dict_ema``)."""
    model, optimizer, _ = trained()
    ema = {k: v + 1 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    path = folder / "model_best.pth.tar"
    args = argparse.Namespace(model="tinynet", model_ema=True, lr=0.1)
    torch.save(
        {"epoch": 5, "arch": "tinynet", "state_dict": model.state_dict(),
         "optimizer": optimizer.state_dict(), "version": 2, "args": args,
         "state_dict_ema": ema, "metric": 71.5},
        path,
    )  # fmt: skip
    return path


def write_ddp(folder: Path) -> Path:
    """A state dict saved from a ``DistributedDataParallel`` model (``module.`` keys)."""
    model, _, _ = trained()
    path = folder / "ddp.pt"
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, path)
    return path


def write_safetensors(folder: Path) -> Path:
    """A ``.safetensors`` file (Hugging Face)."""
    model, _, _ = trained()
    path = folder / "model.safetensors"
    save_file(model.state_dict(), str(path))
    return path


@dataclass(frozen=True)
class Fixture:
    """A checkpoint writer and what reading its file must report."""

    write: Callable[[Path], Path]
    format: str
    layout: str
    containers: tuple[str, ...] = ()
    placeholders: dict[str, int] = field(default_factory=dict)
    prefix: tuple[str, str] | None = None  # what load_partial removes or adds by itself


_SAFE_ZIP = "torch (zip, mmap, safe unpickler)"
_PURE_POSIX_PATH = f"{PurePosixPath.__module__}.{PurePosixPath.__qualname__}"
FIXTURES: dict[str, Fixture] = {
    "torchvision": Fixture(write_torchvision, _SAFE_ZIP, "torchvision references", ("model",),
                           {"argparse.Namespace": 1, _PURE_POSIX_PATH: 1}),
    "mmengine": Fixture(write_mmengine, _SAFE_ZIP, "mmengine checkpoint", ("state_dict",),
                        {"mmengine.logging.history_buffer.HistoryBuffer": 2}),
    "detectron2": Fixture(write_detectron2, "pickle (safe unpickler)", "detectron2 model zoo",
                          ("model",)),
    "lightning": Fixture(write_lightning, _SAFE_ZIP, "Lightning checkpoint", ("state_dict",),
                         {"lightning.fabric.utilities.data.AttributeDict": 1,
                          "argparse.Namespace": 1}, prefix=("model.", "")),
    "timm": Fixture(write_timm, _SAFE_ZIP, "timm checkpoint", ("state_dict",),
                    {"argparse.Namespace": 1}),
    "ddp": Fixture(write_ddp, "torch (zip, mmap)", "DataParallel/DDP state dict"),
    "safetensors": Fixture(write_safetensors, "safetensors", "state dict"),
}  # fmt: skip
