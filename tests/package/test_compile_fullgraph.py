"""Every public op, loss and layer compiles without a graph break and equals eager.

``torch.compile(fullgraph=True, dynamic=True, backend="aot_eager")``: ``fullgraph`` turns a
graph break (a host read, a data-dependent branch, an untraceable call) into an error;
``dynamic`` keeps sizes symbolic, so nothing is specialised on one input's shape;
``aot_eager`` traces forward and backward with AOTAutograd but needs no C++ compiler.

One case per public name (`tests.package.public_api_cases`), small inputs. Compiling dominates the
time, so each package's cases are compiled together, as one function (one graph), and the
losses' backward as one more; only when a group fails is each of its names compiled alone,
to report exactly which names break and why.
"""

from __future__ import annotations

import pytest
import torch

import visionblocks

from .public_api_cases import CASES, LOSS_NAMES, NOT_TENSOR_OPS, missing_cases

CPU = torch.device("cpu")
GROUPS = {
    package: sorted(n for n in CASES if n.startswith(f"{package}."))
    for package in ("ops", "losses", "nn", "transforms", "metrics")
}


def _compiled(fn):
    # Every `run` shares one code object, whose dynamo cache would fill up (and then run
    # eagerly): a fresh cache for each compiled group or name.
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")


def _close(got, want):
    if want is None:  # no gradient (an input the op does not differentiate, e.g. RoIs)
        assert got is None
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _close(g, w)


def _build(names):
    """``run(*flat_inputs)`` calling every case of ``names``, and its inputs."""
    with CPU:
        built = [CASES[name](CPU) for name in names]

    def run(*flat):
        out, start = [], 0
        for fn, inputs in built:
            out.append(fn(*flat[start : start + len(inputs)]))
            start += len(inputs)
        return out

    return run, [t for _, inputs in built for t in inputs]


def _forward_failure(name):
    run, inputs = _build([name])
    try:
        with torch.no_grad():
            _close(_compiled(run)(*inputs), run(*inputs))
    except Exception as exc:  # the report names the error, in one line
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return None


def _backward(names, compile_it):
    run, inputs = _build(names)
    floating = [t.is_floating_point() and t.dim() > 0 for t in inputs]
    leaves = [t.detach().clone().requires_grad_(f) for t, f in zip(inputs, floating, strict=True)]
    losses = (_compiled(run) if compile_it else run)(*leaves)
    sum(loss.sum() for loss in losses).backward()
    return [loss.detach() for loss in losses], [t.grad for t in leaves if t.requires_grad]


def _backward_failure(name):
    try:
        _close(_backward([name], True), _backward([name], False))
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return None


def test_every_public_name_has_a_case():
    assert missing_cases() == []
    assert not set(CASES) & set(NOT_TENSOR_OPS)


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_compiles_fullgraph_and_equals_eager(group):
    run, inputs = _build(GROUPS[group])
    with visionblocks.value_checks(True), torch.no_grad():
        want = run(*inputs)
        try:
            _close(_compiled(run)(*inputs), want)
            return
        except Exception:
            failures = {name: _forward_failure(name) for name in GROUPS[group]}
    failures = {name: why for name, why in failures.items() if why}
    assert failures, "the group fails but none of its names alone"
    pytest.fail("\n".join(f"{name}: {why}" for name, why in sorted(failures.items())))


@pytest.mark.slow
def test_loss_backward_compiles_fullgraph_and_equals_eager():
    names = sorted(LOSS_NAMES)
    with visionblocks.value_checks(True):
        try:
            _close(_backward(names, True), _backward(names, False))
            return
        except Exception:
            failures = {name: _backward_failure(name) for name in names}
    failures = {name: why for name, why in failures.items() if why}
    assert failures, "the group fails but none of its names alone"
    pytest.fail("\n".join(f"{name}: {why}" for name, why in sorted(failures.items())))
