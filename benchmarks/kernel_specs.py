"""Every kernel specialisation the library can launch, found by launching them.

`launched_specializations` runs each op with a fused kernel through the product of its
options that reach the launchers (dtypes of every input, target kinds, weights, ignore and
alpha, reductions, which inputs need gradients, window geometries, channel counts per group
and per head), forward and backward, on tiny CPU tensors, and collects the `Spec` of every
launch (`record_launches`, as a dry run: launches are checked and recorded, not executed;
the kernel tests run them). The signatures therefore come from the launchers themselves,
not from a hand-kept list: `benchmarks.compile_kernels` compiles exactly these for real GPU
targets. `record_launches` also checks every tensor a launcher passes (one device, strided,
a supported dtype, 16-byte aligned), so the kernel tests catch a launcher that breaks the
kernels' calling convention.

Run as ``python -m benchmarks.kernel_specs`` from a clone (it sets ``TRITON_INTERPRET=1``
before triton is imported) to print the specialisations as JSON.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import pkgutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Spec", "launched_specializations", "main", "record_launches", "specialization"]

ROOT = Path(__file__).resolve().parent.parent


class Spec(NamedTuple):
    """One compiled specialisation of a kernel, as triton's JIT would key it.

    Attributes:
        kernel: ``"module:function"`` of the ``@triton.jit`` function.
        signature: ``(parameter, type)`` pairs in order: ``"*fp16"`` for a tensor,
            ``"i32"``/``"i64"``/``"fp32"`` for a scalar, ``"constexpr"`` for a constexpr.
        constexprs: ``(parameter, value)`` pairs; dtypes are written ``"tl.float32"``.
        num_warps: Warps per program (triton's default is 4).
    """

    kernel: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int = 4

    def describe(self) -> str:
        """A short label: the kernel's name, the pointer dtypes and the constexpr values."""
        ptrs = ",".join(t[1:] for _, t in self.signature if t.startswith("*"))
        consts = ",".join(f"{k}={str(v).removeprefix('tl.')}" for k, v in self.constexprs)
        return f"{self.kernel.rpartition(':')[2]}[{ptrs}|{consts}|w{self.num_warps}]"


_TL_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}


def _pointer_types():
    import torch

    return {
        torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
        torch.float64: "fp64", torch.int64: "i64", torch.int32: "i32", torch.uint8: "u8",
    }  # fmt: skip


def _encode(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    name = getattr(value, "name", None)  # a triton dtype
    if isinstance(name, str):
        return f"tl.{_TL_NAMES.get(name, name)}"
    raise TypeError(f"unsupported constexpr value {value!r}")


def specialization(kernel: Any, args: Mapping[str, Any], num_warps: int = 4) -> Spec:
    """The `Spec` a launch of ``kernel`` with ``args`` compiles to; checks the arguments.

    Raises:
        ValueError: A tensor on another device, with a non-strided layout, an unsupported
            dtype or a misaligned start; a missing or unexpected argument.
        TypeError: A tensor parameter given something else.
    """
    import torch

    from visionblocks.kernels._launch import ALIGNMENT, parameters

    params = parameters(kernel.fn)
    name = f"{kernel.fn.__module__}:{kernel.fn.__name__}"
    unknown = set(args) - {p for p, _ in params}
    if unknown:
        raise ValueError(f"{name}: unexpected arguments {sorted(unknown)}")
    pointers = _pointer_types()
    signature, constexprs, device = [], [], None
    for param, kind in params:
        if param not in args:
            raise ValueError(f"{name}: missing argument {param!r}")
        value = args[param]
        if kind is None:
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name}: {param} must be a tensor, got {type(value).__name__}")
            if value.layout != torch.strided:
                raise ValueError(f"{name}: {param} must be a strided tensor, got {value.layout}")
            if value.dtype not in pointers:
                raise ValueError(f"{name}: {param} has unsupported dtype {value.dtype}")
            device = value.device if device is None else device
            if value.device != device:
                raise ValueError(
                    f"{name}: {param} is on {value.device}, the other tensors on {device}"
                )
            if value.data_ptr() % ALIGNMENT:
                raise ValueError(f"{name}: {param} must start {ALIGNMENT}-byte aligned (prepare)")
            signature.append((param, "*" + pointers[value.dtype]))
        elif kind == "constexpr":
            signature.append((param, "constexpr"))
            constexprs.append((param, _encode(value)))
        else:
            signature.append((param, kind))
    return Spec(name, tuple(signature), tuple(constexprs), num_warps)


def kernel_modules() -> list[Any]:
    """Every kernel module of `visionblocks.kernels` (imports triton)."""
    import visionblocks.kernels as package

    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name[0] != "_")
    return [importlib.import_module(f"visionblocks.kernels.{name}") for name in names]


@contextmanager
def record_launches(execute: bool = True) -> Iterator[set[Spec]]:
    """Collect the `Spec` of every launch in the block (also launches that then fail).

    Replaces ``launch`` in every kernel module by a recorder for the block's duration.

    Args:
        execute: False for a dry run: launches are checked and recorded but not run (their
            outputs hold garbage), which enumerates the whole op matrix in seconds.
    """
    from visionblocks.kernels import _launch

    specs: set[Spec] = set()

    def recorder(op: str, kernel: Any, grid: Any, num_warps: int = 4, **args: Any) -> None:
        _launch.check_grid(op, grid)
        specs.add(specialization(kernel, args, num_warps))
        if execute:
            _launch.launch(op, kernel, grid, num_warps, **args)

    modules = [m for m in kernel_modules() if getattr(m, "launch", None) is _launch.launch]
    for module in modules:
        module.launch = recorder
    try:
        yield specs
    finally:
        for module in modules:
            module.launch = _launch.launch


FLOATS = ("float16", "bfloat16", "float32", "float64")


def _cases_focal(torch) -> Iterator[Callable[[], None]]:
    from visionblocks.losses.focal import sigmoid_focal_loss

    targets = ("index64", "index32", "bool", "float_same", "float_other")
    weights = (None, "per_class", "full_half")
    for dtype, target, weight, ignore, alpha, reduction, normalizer in itertools.product(
        FLOATS, targets, weights, (False, True), (None, 0.25), ("none", "sum", "mean"), (None, 4.0)
    ):
        dt = getattr(torch, dtype)

        def case(dt=dt, target=target, weight=weight, ignore=ignore, alpha=alpha,
                 reduction=reduction, normalizer=normalizer):  # fmt: skip
            x = torch.randn(3, 4, dtype=dt, requires_grad=True)
            if target.startswith("index"):
                t = torch.tensor(
                    [0, 3, -1], dtype=torch.int64 if target == "index64" else torch.int32
                )
                ign = -1 if ignore else None
            else:
                t = torch.rand(3, 4) > 0.5
                if target != "bool":
                    other = torch.float16 if dt in (torch.float32, torch.float64) else torch.float32
                    t = t.to(dt if target == "float_same" else other)
                    if ignore:
                        t[0, 0] = -1
                ign = -1.0 if ignore and target != "bool" else None
            w = {
                None: None,
                "per_class": torch.rand(4, dtype=dt),
                "full_half": torch.rand(3, 4).half(),
            }[weight]
            loss = sigmoid_focal_loss(
                x, t, alpha=-1 if alpha is None else alpha, weight=w, ignore_index=ign,
                reduction=reduction, normalizer=normalizer, impl="triton",
            )  # fmt: skip
            loss.backward(torch.ones_like(loss))

        yield case


def _cases_iou(torch) -> Iterator[Callable[[], None]]:
    from visionblocks.losses import iou as iou_loss

    ops = (
        iou_loss.generalized_box_iou_loss,
        iou_loss.distance_box_iou_loss,
        iou_loss.complete_box_iou_loss,
    )
    grads = ((True, False), (False, True), (True, True))
    for op, dtype, other, (gp, gg), reduction in itertools.product(
        ops, FLOATS, (False, True), grads, ("none", "mean")
    ):
        dt = getattr(torch, dtype)

        def case(op=op, dt=dt, other=other, gp=gp, gg=gg, reduction=reduction):
            base = torch.rand(5, 2) * 10
            pred = torch.cat([base, base + 1 + torch.rand(5, 2)], 1).to(dt).requires_grad_(gp)
            tdt = torch.float32 if other else dt
            target = (torch.cat([base, base + 2], 1) + 0.5).to(tdt).requires_grad_(gg)
            loss = op(pred, target, reduction=reduction, impl="triton")
            loss.backward(torch.ones_like(loss))

        yield case


def _cases_local_filter(torch) -> Iterator[Callable[[], None]]:
    from visionblocks.ops.local import local_filter2d

    geometries = ((1, 1, 1), (3, 1, 1), (3, 2, 2), (5, 1, 2))  # (k, dilation, stride)
    groups = ((4, 4), (3, 1), (8, 2), (20, 1))  # (channels, groups): 1, 3, 4, 20 per group
    grads = ((True, False), (False, True), (True, True))
    for dtype, (k, d, s), (c, g), (gx, gk) in itertools.product(FLOATS, geometries, groups, grads):
        dt = getattr(torch, dtype)

        def case(dt=dt, k=k, d=d, s=s, c=c, g=g, gx=gx, gk=gk):
            x = torch.randn(1, c, 4, 5, dtype=dt, requires_grad=gx)
            ker = torch.randn(1, g * k * k, -(-4 // s), -(-5 // s), dtype=dt, requires_grad=gk)
            local_filter2d(x, ker, k, d, stride=s, impl="triton").sum().backward()

        yield case


def _cases_local_attention(torch) -> Iterator[Callable[[], None]]:
    from visionblocks.ops.local_attention import local_attention2d

    heads = ((2, 2), (16, 1), (48, 2), (64, 2), (64, 1), (80, 1))  # (channels, heads)
    grads = ((True, False, False), (False, True, True), (True, True, True))
    for dtype, (c, n), k, grad in itertools.product(FLOATS, heads, (1, 3), grads):
        dt = getattr(torch, dtype)

        def case(dt=dt, c=c, n=n, k=k, grad=grad):
            q, kk, v = (torch.randn(1, c, 2, 3, dtype=dt).requires_grad_(r) for r in grad)
            local_attention2d(q, kk, v, k, 1, n, impl="triton").sum().backward()

        yield case


def _cases_assign(torch) -> Iterator[Callable[[], None]]:
    from visionblocks.ops.assign import match_anchors

    for adtype, bdtype in itertools.product(FLOATS, ("float32", "float64")):

        def case(adtype=adtype, bdtype=bdtype):
            base = torch.rand(70, 2) * 50
            anchors = torch.cat([base, base + 8], 1).to(getattr(torch, adtype))
            boxes = torch.cat([base[:5], base[:5] + 12], 1).to(getattr(torch, bdtype))
            match_anchors(
                anchors,
                boxes=boxes,
                high_threshold=0.5,
                low_threshold=0.4,
                allow_low_quality_matches=True,
                impl="triton",
            )

        yield case


def _cases_rotated_iou(torch) -> Iterator[Callable[[], None]]:
    from visionblocks.ops.rotated import rotated_box_iou

    for dt in FLOATS:

        def case(dt=dt):
            boxes = torch.rand(6, 5, dtype=getattr(torch, dt)) * 4
            rotated_box_iou(boxes, boxes[:3], impl="triton")

        yield case


def _cases_ms_deform_attn(torch) -> Iterator[Callable[[], None]]:
    from visionblocks.ops.ms_deform_attn import ms_deform_attn

    shapes = torch.tensor([[3, 4], [1, 2]])
    grads = ((True, False, False), (False, True, True), (True, True, True))
    for dtype, c, grad in itertools.product(FLOATS, (3, 16, 32, 64, 100), grads):
        dt = getattr(torch, dtype)

        def case(dt=dt, c=c, grad=grad):
            value = torch.randn(1, 14, 2, c, dtype=dt).requires_grad_(grad[0])
            loc = torch.rand(1, 5, 2, 2, 3, 2, dtype=dt).requires_grad_(grad[1])
            weights = torch.rand(1, 5, 2, 2, 3, dtype=dt).requires_grad_(grad[2])
            ms_deform_attn(value, shapes, loc, weights, impl="triton").sum().backward()

        yield case


def _cases_roi_pool(torch) -> Iterator[Callable[[], None]]:
    import visionblocks.ops as R

    rois = torch.tensor([[0.0, 0.5, 0.5, 3.0, 2.5], [0.0, 1.0, 0.0, 4.0, 3.0]])
    calls = (
        lambda x, r: R.roi_align(x, r, 2, 1.0, -1, False, impl="triton"),
        lambda x, r: R.roi_align(x, r, 2, 1.0, 2, True, impl="triton"),
        lambda x, r: R.ps_roi_align(x, r, 2, impl="triton"),
        lambda x, r: R.roi_pool(x, r, 2, impl="triton"),
        lambda x, r: R.ps_roi_pool(x, r, 2, impl="triton"),
    )
    for dtype, c, call in itertools.product(("float32", "float64"), (4, 64), calls):

        def case(dtype=dtype, c=c, call=call):
            dt = getattr(torch, dtype)
            x = torch.randn(1, c, 4, 5, dtype=dt, requires_grad=True)
            call(x, rois.to(dt)).sum().backward()

        yield case


def _cases_rotated_roi_align(torch) -> Iterator[Callable[[], None]]:
    from visionblocks.ops.rotated_roi_align import rotated_roi_align

    rois = torch.tensor([[0.0, 2.0, 2.5, 3.0, 2.0, 30.0], [0.0, 3.0, 1.0, 4.0, 3.0, -60.0]])
    sizes = ((2, 2), (5, 6), (7, 7))  # BLOCK_B 16, 32, 64
    for dtype, c, size in itertools.product(FLOATS, (4, 64), sizes):
        dt = getattr(torch, dtype)

        def case(dt=dt, c=c, size=size):
            x = torch.randn(1, c, 4, 5, dtype=dt, requires_grad=True)
            rotated_roi_align(x, rois.to(dt), size, impl="triton").sum().backward()

        yield case


CASES = {
    "sigmoid_focal_loss": _cases_focal,
    "box_iou_losses": _cases_iou,
    "local_filter": _cases_local_filter,
    "local_attention2d": _cases_local_attention,
    "assign": _cases_assign,
    "rotated_box_iou": _cases_rotated_iou,
    "roi_pool": _cases_roi_pool,
    "ms_deform_attn": _cases_ms_deform_attn,
    "rotated_roi_align": _cases_rotated_roi_align,
}


def _record() -> list[dict]:
    """Run every case in this process (under the interpreter); the specs as JSON rows."""
    import torch

    torch.manual_seed(0)
    with record_launches(execute=False) as specs:
        for make in CASES.values():
            for case in make(torch):
                case()
    return [spec._asdict() for spec in sorted(specs)]


def launched_specializations(python: str | None = None) -> list[dict]:
    """Run the op matrix in a fresh interpreter-mode process; its specialisations.

    Args:
        python: The interpreter to run (default: this one).

    Returns:
        list[dict]: One row per specialisation: ``kernel``, ``signature``, ``constexprs``
        (lists of ``[name, value]``) and ``num_warps``.

    Raises:
        RuntimeError: If the process fails (its output is in the message).
    """
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("VISIONBLOCKS_DISABLE_TRITON", None)
    env.pop("VISIONBLOCKS_IMPL", None)
    proc = subprocess.run(
        [python or sys.executable, "-m", "benchmarks.kernel_specs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"collecting kernel specialisations failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    """Print the launched specialisations as JSON (run under ``TRITON_INTERPRET=1``)."""
    os.environ["TRITON_INTERPRET"] = "1"
    json.dump(_record(), sys.stdout)


if __name__ == "__main__":
    main()
