"""Do both sides of a case compute the same thing? The ``check`` hooks of `BenchCase`.

A speed-up means nothing if ours computes something else, so every case with a peer carries a
``check(ours_out, peer_out)`` that raises ``AssertionError`` when the two sides' results of
one call disagree; ``tests/bench/test_case_outputs.py`` runs it for every registered CPU case.
`same_outputs` builds the usual hook from a tolerance; `assert_same` is the comparison it
makes, usable in hand-written hooks; `verify_outputs` runs a case's check.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.harness.timing import num_threads

if TYPE_CHECKING:
    from benchmarks.harness.case import BenchCase

__all__ = ["assert_same", "same_outputs", "verify_outputs"]


def _compare_tensors(
    ours: torch.Tensor, peer: torch.Tensor, rtol: float, atol: float, where: str
) -> None:
    if ours.shape != peer.shape:
        raise AssertionError(
            f"{where}: shapes differ: ours {tuple(ours.shape)}, peer {tuple(peer.shape)}"
        )
    ours, peer = ours.detach(), peer.detach()
    if not (ours.is_floating_point() or peer.is_floating_point()):
        if not torch.equal(ours.cpu(), peer.cpu().to(ours.dtype)):
            mismatched = int((ours.cpu() != peer.cpu().to(ours.dtype)).sum())
            raise AssertionError(f"{where}: {mismatched} of {ours.numel()} elements differ")
        return
    ours, peer = ours.double().cpu(), peer.double().cpu()
    excess = (ours - peer).abs() - (atol + rtol * peer.abs())
    bad = ~(excess <= 0)  # NaN in either side counts as a mismatch
    if bool(bad.any()):
        worst = int(torch.nan_to_num(excess, nan=math.inf).flatten().argmax())
        raise AssertionError(
            f"{where}: {int(bad.sum())} of {ours.numel()} elements differ beyond rtol={rtol:g}, "
            f"atol={atol:g}; worst at flat index {worst}: ours {ours.flatten()[worst].item():.9g}, "
            f"peer {peer.flatten()[worst].item():.9g}"
        )


def assert_same(
    ours: Any, peer: Any, *, rtol: float = 1e-5, atol: float = 1e-6, where: str = "output"
) -> None:
    """Raise ``AssertionError`` naming the first place where ``ours`` and ``peer`` differ.

    Tensors (any device; compared in float64 as ``|ours - peer| <= atol + rtol * |peer|``,
    exactly when both are integral or boolean), numbers (the same rule), and dicts, lists and
    tuples of them (the same keys or lengths, compared item by item). Anything else must be
    ``==``.

    Args:
        ours: Our side's result.
        peer: The peer's result.
        rtol: Relative tolerance.
        atol: Absolute tolerance.
        where: Name of the compared value in the message (items add ``[key]``).

    Raises:
        AssertionError: The first difference found, with the worst element of a tensor.

    Examples:
        >>> import torch
        >>> assert_same({"loss": torch.tensor(1.0)}, {"loss": torch.tensor(1.0 + 1e-7)})
        >>> assert_same([torch.zeros(2)], [torch.ones(2)])
        Traceback (most recent call last):
        ...
        AssertionError: output[0]: 2 of 2 elements differ beyond rtol=1e-05, atol=1e-06; worst at flat index 0: ours 0, peer 1
    """
    if isinstance(ours, torch.Tensor) and isinstance(peer, torch.Tensor):
        _compare_tensors(ours, peer, rtol, atol, where)
    elif isinstance(ours, Mapping) and isinstance(peer, Mapping):
        if set(ours) != set(peer):
            raise AssertionError(
                f"{where}: keys differ: only ours {sorted(map(str, set(ours) - set(peer)))}, "
                f"only peer {sorted(map(str, set(peer) - set(ours)))}"
            )
        for key in ours:
            assert_same(ours[key], peer[key], rtol=rtol, atol=atol, where=f"{where}[{key!r}]")
    elif isinstance(ours, Sequence) and isinstance(peer, Sequence) and not isinstance(ours, str):
        if len(ours) != len(peer):
            raise AssertionError(f"{where}: lengths differ: ours {len(ours)}, peer {len(peer)}")
        for i, (a, b) in enumerate(zip(ours, peer)):
            assert_same(a, b, rtol=rtol, atol=atol, where=f"{where}[{i}]")
    elif isinstance(ours, (int, float)) and isinstance(peer, (int, float)):
        if not abs(ours - peer) <= atol + rtol * abs(peer):
            raise AssertionError(f"{where}: ours {ours!r}, peer {peer!r}")
    elif ours != peer:
        raise AssertionError(f"{where}: ours {ours!r}, peer {peer!r}")


def same_outputs(*, rtol: float = 1e-5, atol: float = 1e-6) -> Callable[[Any, Any], None]:
    """A `BenchCase` ``check`` hook: `assert_same` with these tolerances.

    Examples:
        >>> import torch
        >>> check = same_outputs(rtol=1e-3)
        >>> check(torch.tensor([1000.0]), torch.tensor([1000.5]))
        >>> check(torch.tensor([1000.0]), torch.tensor([1002.0]))
        Traceback (most recent call last):
        ...
        AssertionError: output: 1 of 1 elements differ beyond rtol=0.001, atol=1e-06; worst at flat index 0: ours 1000, peer 1002
    """

    def check(ours_out: Any, peer_out: Any) -> None:
        assert_same(ours_out, peer_out, rtol=rtol, atol=atol)

    check.__qualname__ = f"same_outputs(rtol={rtol:g}, atol={atol:g})"
    return check


def verify_outputs(case: BenchCase) -> None:
    """Check that ``case``'s two sides compute the same result.

    Builds the inputs with ``small_setup`` (else ``setup``) under ``case.threads`` threads,
    gets ``(ours_out, peer_out)`` from ``outputs(state)`` (else one call of each side) and
    passes them to ``check``.

    Raises:
        ValueError: If the case has no peer.
        AssertionError: If it has no ``check`` hook, or the outputs differ.

    Examples:
        >>> import torch
        >>> from benchmarks.harness import BenchCase
        >>> case = BenchCase("doc_neg", setup=lambda: torch.ones(3), ours=torch.neg,
        ...                  peer=lambda s: 0 - s, check=same_outputs())
        >>> verify_outputs(case)
    """
    if case.peer is None:
        raise ValueError(f"benchmark case {case.name!r} has no peer to compare with")
    if case.check is None:
        raise AssertionError(
            f"benchmark case {case.name!r} has no check hook: give it "
            "check=same_outputs(rtol=..., atol=...) (benchmarks.harness.check), or a function "
            "raising AssertionError, so its two sides are compared"
        )
    with num_threads(case.threads):
        state = (case.small_setup or case.setup)()
        if case.outputs is not None:
            ours_out, peer_out = case.outputs(state)
        else:
            ours_out, peer_out = case.ours(state), case.peer(state)
    case.check(ours_out, peer_out)
