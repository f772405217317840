"""Config-key checks for `Registry.build`: errors that name a key by its path from the
top-level config (``head.num_classes``). Builders say which entry they build with
`config_key`; `pending_path` and `ConfigScope` carry that path through `Registry.build`."""

from __future__ import annotations

import contextlib
import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any

__all__ = ["ConfigError", "ConfigScope", "check_keys", "config_key", "pending_path"]

# The key path of the config that the next `Registry.build` builds (None: a top-level build,
# set by `config_key`), and the key path of the config whose builder is running.
_PENDING: ContextVar[tuple[str, ...] | None] = ContextVar("vb_config_pending", default=None)
_CURRENT: ContextVar[tuple[str, ...]] = ContextVar("vb_config_current", default=())
_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class ConfigError(TypeError):
    """A config key that its builder does not take, or a required key missing (`Registry.build`).

    Raised before the builder is called, chained to the ``TypeError`` the call would have
    raised; the message names each key by its path (``head.loss_cls.gama``), suggests a
    close accepted key and lists the accepted keys.

    Attributes:
        config_path: The path of the config whose keys are wrong (``"head.loss_cls"``; ``""``
            for the top-level config).

    Examples:
        >>> from visionblocks.registry import LOSSES, ConfigError
        >>> try:
        ...     LOSSES.build({"type": "focal", "gama": 2})
        ... except ConfigError as error:
        ...     print(error)
        ...     print(repr(error.config_path), isinstance(error, TypeError))
        unexpected config key 'gama' (did you mean 'gamma'?) for losses 'focal' (...). Accepted keys: ...
        '' True
    """

    config_path = ""


@contextlib.contextmanager
def config_key(*keys: str) -> Iterator[None]:
    """`Registry.build` calls inside build the config entry ``keys`` (below the config being
    built, if any): their errors name the entry's path. Builders wrap their sub-builds in it."""
    token = _PENDING.set((*_CURRENT.get(), *keys))
    try:
        yield
    finally:
        _PENDING.reset(token)


def pending_path() -> tuple[str, ...]:
    """The key path (``("head", "loss_cls")``; ``()`` at the top) of the config that the
    `Registry.build` now starting builds, as `config_key` set it."""
    pending = _PENDING.get()
    return () if pending is None else pending


class ConfigScope:
    """The scope of one builder's call in `Registry.build`: inside it, `config_key` paths
    start from ``where`` (the config's path); an ``Exception`` leaving it gets a note naming
    the config key and ``what`` (the builder), and ``config_path``, unless an inner build
    already labelled it."""

    __slots__ = ("_tokens", "what", "where")

    def __init__(self, where: tuple[str, ...], what: str) -> None:
        self.where = where
        self.what = what
        self._tokens: tuple[Token[tuple[str, ...]], Token[tuple[str, ...] | None]] | None = None

    def __enter__(self) -> ConfigScope:
        self._tokens = _CURRENT.set(self.where), _PENDING.set(None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # The innermost build notes where the error comes from; the builds around it do not.
        where = self.where
        if (
            isinstance(error, Exception)
            and where
            and getattr(error, "config_path", None) is None
            and hasattr(error, "add_note")
        ):
            error.add_note(f"while building config key {'.'.join(where)!r} with {self.what}")
            with contextlib.suppress(AttributeError):
                error.config_path = ".".join(where)  # type: ignore[attr-defined]
        if self._tokens is not None:
            _CURRENT.reset(self._tokens[0])
            _PENDING.reset(self._tokens[1])
            self._tokens = None


def check_keys(
    builder: Callable[..., Any],
    args: tuple[Any, ...],
    params: Mapping[str, Any],
    where: tuple[str, ...],
    what: str,
) -> None:
    """Raise `ConfigError` (chained to the call's ``TypeError``) unless ``builder(*args,
    **params)`` binds: keys it does not take and required keys missing, named by their path
    below ``where``, for ``what``. Positional clashes and builders without a signature are
    left to the call."""
    try:
        signature = inspect.signature(builder)
    except (TypeError, ValueError):  # no signature (some builtins): the call says what is wrong
        return
    try:
        signature.bind(*args, **params)
        return
    except TypeError as error:
        original = error
    named = [p for p in signature.parameters.values() if p.kind in _KEYWORD]
    accepted = [p.name for p in named]
    any_key = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    problems = []
    for key in [] if any_key else [k for k in params if k not in accepted]:
        close = difflib.get_close_matches(key, [a for a in accepted if a not in params], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"unexpected config key {'.'.join((*where, key))!r}{hint}")
    try:
        bound = signature.bind_partial(*args, **{k: v for k, v in params.items() if k in accepted})
    except TypeError:  # positional arguments that clash: not a config key's fault
        return
    missing = [p.name for p in named if p.default is p.empty and p.name not in bound.arguments]
    problems += [f"missing required config key {'.'.join((*where, k))!r}" for k in missing]
    if problems:
        error = ConfigError(
            f"{'; '.join(problems)} for {what}. Accepted keys: {', '.join(accepted)}"
        )
        error.config_path = ".".join(where)
        raise error from original
