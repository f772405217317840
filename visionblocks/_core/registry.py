"""The registry core: `Registry` (documented in `visionblocks.registry`).

Its config-key checks (`ConfigError`, `config_key`) live in `visionblocks._core.config_keys`.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from visionblocks._core.config_keys import ConfigScope, check_keys, pending_path
from visionblocks._core.plugins import load_plugins

T = TypeVar("T")

__all__ = ["Registry"]


class _Namespace(NamedTuple):
    resolve: Callable[[str], Any]
    suggest: Callable[[str], Sequence[str]] | None


class Registry:
    """A named mapping from strings to builders, usable as a decorator or a call; it may
    resolve a whole family of names by prefix (`add_namespace`).

    Args:
        name: What the registry holds, used in messages (``"losses"``).
        modules: visionblocks modules whose import fills this registry; imported on the first
            miss, listing or iteration.
        description: One line saying what a builder must return (shown by ``visionblocks list``).

    Examples:
        >>> MODELS = Registry("models")
        >>> @MODELS.register(aliases=("tiny",))
        ... def tiny_net(width=8):
        ...     return {"width": width}
        >>> MODELS.build({"type": "tiny", "width": 4})
        {'width': 4}
        >>> MODELS.list("tiny*")
        ['tiny_net']
    """

    def __init__(self, name: str, *, modules: Iterable[str] = (), description: str = "") -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Registry name must be a non-empty str, got {name!r}")
        if not isinstance(description, str):
            raise TypeError(f"description must be a str, got {type(description).__name__}")
        if isinstance(modules, (str, bytes)) or not isinstance(modules, Iterable):
            raise TypeError(
                "modules must be an iterable of module names (a list or tuple of str), got "
                f"{type(modules).__name__} ({modules!r})"
            )
        self._modules = tuple(modules)
        if not all(isinstance(m, str) for m in self._modules):
            raise TypeError(f"modules must hold module names (str), got {self._modules!r}")
        self.name = name
        self.description = description
        self._modules_loaded = False
        self._entries: dict[str, Any] = {}
        self._aliases: dict[str, str] = {}
        self._namespaces: dict[str, _Namespace] = {}

    # ------------------------------------------------------------------ registration
    def register(
        self,
        obj: T | None = None,
        *,
        name: str | None = None,
        aliases: Iterable[str] = (),
        force: bool = False,
    ) -> Any:
        """Register ``obj`` under ``name`` (default ``obj.__name__``) and ``aliases``: as
        ``@REG.register``, ``@REG.register(name=..., aliases=...)`` or ``REG.register(obj)``.

        Args:
            obj: The builder. When omitted, a decorator is returned.
            name: Registered name; defaults to ``obj.__name__``.
            aliases: Other names that resolve to the same builder.
            force: Replace existing entries with the same names instead of raising.

        Returns:
            The object itself, or a decorator when ``obj`` is omitted.

        Raises:
            KeyError: If a name or alias is taken and ``force`` is False.
            TypeError: If a name is not a non-empty string or ``obj`` is not callable.
        """
        aliases = (aliases,) if isinstance(aliases, str) else tuple(aliases)

        def _do_register(target: T) -> T:
            self._add(target, name, aliases, force)
            return target

        if obj is None:
            return _do_register
        return _do_register(obj)

    def _add(self, obj: Any, name: str | None, aliases: tuple[str, ...], force: bool) -> None:
        if not callable(obj):
            raise TypeError(
                f"only callables can be registered in the {self.name} registry, "
                f"got {type(obj).__name__}"
            )
        key = name if name is not None else getattr(obj, "__name__", None)
        names = (key, *aliases)
        for n in names:
            if not isinstance(n, str) or not n:
                raise TypeError(f"registry names must be non-empty strings, got {n!r}")
        if len(set(names)) != len(names):
            raise KeyError(f"duplicate names in one registration: {names}")
        if not force:
            for n in names:
                if n in self._entries or n in self._aliases:
                    owner = self._aliases.get(n, n)
                    raise KeyError(
                        f"{n!r} is already registered in the {self.name} registry "
                        f"(by {self._describe(self._entries[owner])}); "
                        "pass force=True to replace it"
                    )
        for n in names:
            self._remove(n)
        self._entries[key] = obj
        for alias in aliases:
            self._aliases[alias] = key

    def _remove(self, n: str) -> None:
        if n in self._aliases:
            del self._aliases[n]
        if n in self._entries:
            del self._entries[n]
            for alias in [a for a, target in self._aliases.items() if target == n]:
                del self._aliases[alias]

    def add_namespace(
        self,
        prefix: str,
        resolve: Callable[[str], Any],
        *,
        suggest: Callable[[str], Sequence[str]] | None = None,
        force: bool = False,
    ) -> None:
        """Resolve every name that starts with ``prefix`` with ``resolve`` (a family of names).

        An unregistered name starting with ``prefix`` is ``resolve(name[len(prefix):])``
        (``KeyError``: unknown, ``ValueError``: malformed); ``get``, ``build`` and ``in`` accept
        such names, ``list`` and iteration show only registered names.

        Args:
            prefix: The names' common start, e.g. ``"timm/"``.
            resolve: ``resolve(rest)`` returns the builder for ``prefix + rest``.
            suggest: ``suggest(name)`` returns names of the namespace (with the prefix) close
                to a missing ``name``, for the "Did you mean" of a ``KeyError``.
            force: Replace a namespace with the same prefix instead of raising.

        Raises:
            KeyError: ``prefix`` is taken and ``force`` is False.
            TypeError: ``prefix`` is not a non-empty string, or ``resolve``/``suggest`` is not
                callable.

        Examples:
            >>> SIZES = Registry("sizes")
            >>> def pixels(rest):
            ...     if not rest.isdigit():
            ...         raise KeyError(f"'px/{rest}' is not a number of pixels")
            ...     return lambda: int(rest)
            >>> SIZES.add_namespace("px/", pixels)
            >>> SIZES.build("px/32"), "px/32" in SIZES, "px/big" in SIZES, SIZES.list()
            (32, True, False, [])
        """
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"namespace prefix must be a non-empty str, got {prefix!r}")
        if not callable(resolve):
            raise TypeError(f"resolve must be callable, got {type(resolve).__name__}")
        if suggest is not None and not callable(suggest):
            raise TypeError(f"suggest must be callable or None, got {type(suggest).__name__}")
        if prefix in self._namespaces and not force:
            raise KeyError(
                f"namespace {prefix!r} is already in the {self.name} registry; "
                "pass force=True to replace it"
            )
        self._namespaces[prefix] = _Namespace(resolve, suggest)

    def _namespace(self, name: str) -> tuple[_Namespace, str] | None:
        """The namespace ``name`` falls in (longest prefix) and the rest of the name."""
        prefixes = [p for p in self._namespaces if name.startswith(p)]
        if not prefixes:
            return None
        prefix = max(prefixes, key=len)
        return self._namespaces[prefix], name[len(prefix) :]

    @staticmethod
    def _describe(obj: Any) -> str:
        module = getattr(obj, "__module__", "?")
        qualname = getattr(obj, "__qualname__", type(obj).__name__)
        return f"{module}.{qualname}"

    # ------------------------------------------------------------------ lookup
    def _ensure_loaded(self) -> None:
        if not self._modules_loaded:
            self._modules_loaded = True
            for module in self._modules:
                importlib.import_module(module)
        load_plugins()

    def _resolve(self, name: str) -> str | None:
        if name in self._entries:
            return name
        return self._aliases.get(name)

    def get(self, name: str) -> Any:
        """Return the builder registered as ``name`` (or an alias, or a namespace's name).

        Raises:
            TypeError: If ``name`` is not a string.
            KeyError: If the name is unknown; the message lists the closest matches.
            ValueError: A namespace's resolver rejects a malformed name.
        """
        if not isinstance(name, str):
            raise TypeError(
                f"{self.name} registry keys are strings, got {type(name).__name__} ({name!r})"
            )
        builder = self._lookup(name)
        if builder is None:
            raise KeyError(self._missing_message(name))
        return builder

    def _lookup(self, name: str) -> Any:
        """The builder of ``name`` (registered, else from its namespace), or None."""
        key = self._resolve(name)
        if key is None:
            self._ensure_loaded()
            key = self._resolve(name)
        if key is not None:
            return self._entries[key]
        found = self._namespace(name)
        return None if found is None else found[0].resolve(found[1])

    def _missing_message(self, name: str) -> str:
        candidates = [*self._entries, *self._aliases]
        lowered = {c.lower(): c for c in candidates}
        close = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.6)
        close = [lowered[c] for c in close]
        # Namespaced names: an exact one ("timm/convnext_atto" for "convnext_atto") first.
        spaced = [s for ns in self._namespaces.values() if ns.suggest for s in ns.suggest(name)]
        exact = [s for s in spaced if any(s == prefix + name for prefix in self._namespaces)]
        close = list(dict.fromkeys([*exact, *close, *spaced]))[:4]
        hint = f" Did you mean: {', '.join(repr(c) for c in close)}?" if close else ""
        names = sorted(self._entries)
        if len(names) <= 12:
            known = f"registered: {', '.join(names) or 'nothing yet'}"
        else:
            known = f"{len(names)} names registered; see .list() or `visionblocks list`"
        if self._namespaces:
            prefixes = " or ".join(repr(p) for p in sorted(self._namespaces))
            known += f"; plus the names starting with {prefixes}"
        return f"{name!r} is not in the {self.name} registry.{hint} ({known})"

    def build(self, name_or_cfg: str | Mapping[str, Any], /, *args: Any, **kwargs: Any) -> Any:
        """Build an object from a name or a config dict.

        Args:
            name_or_cfg: A registered name, or a dict with a ``"type"`` key (a registered name
                or a callable) plus keyword arguments for the builder.
            *args: Positional arguments for the builder.
            **kwargs: Keyword arguments; they override entries of the config dict.

        The keys are checked against the builder's signature before the call; inside
        `config_key`, errors name keys by their path from the top-level config.

        Returns:
            Whatever the builder returns.

        Raises:
            KeyError: Unknown name (``"backbone.type: ..."`` inside `config_key`), or a config
                dict without ``"type"``.
            ConfigError: A ``TypeError``: a key the builder does not take (the message lists
                the accepted keys and a close one), or a required key missing.
            TypeError: ``name_or_cfg`` is neither a string nor a mapping.
        """
        where = pending_path()
        if isinstance(name_or_cfg, str):
            kind, params = name_or_cfg, {}
        elif isinstance(name_or_cfg, Mapping):
            params = dict(name_or_cfg)
            if "type" not in params:
                raise KeyError(
                    f"a {self.name} config needs a 'type' key naming the builder, "
                    f"got keys {sorted(params)}"
                )
            kind = params.pop("type")
        else:
            raise TypeError(
                f"build() takes a registered name or a config dict, "
                f"got {type(name_or_cfg).__name__}"
            )
        if isinstance(kind, str):
            try:
                builder = self.get(kind)
            except (KeyError, ValueError) as error:
                if where and error.args and isinstance(error.args[0], str):
                    error.args = (f"{'.'.join((*where, 'type'))}: {error.args[0]}",)
                    error.config_path = ".".join(where)
                raise
        elif callable(kind):
            builder = kind
        else:
            raise TypeError(f"config 'type' must be a registered name or a callable, got {kind!r}")
        params.update(kwargs)
        what = f"{self.name} {getattr(kind, '__name__', kind)!r} ({self._describe(builder)})"
        check_keys(builder, args, params, where, what)
        with ConfigScope(where, what):
            return builder(*args, **params)

    def list(self, pattern: str = "*") -> list[str]:
        """Sorted registered names (not aliases, not namespaces) matching an fnmatch ``pattern``."""
        self._ensure_loaded()
        return sorted(n for n in self._entries if fnmatch.fnmatchcase(n, pattern))

    def namespaces(self) -> list[str]:
        """Sorted prefixes of the name families resolved by `add_namespace` (``["timm/"]``)."""
        self._ensure_loaded()
        return sorted(self._namespaces)

    def aliases(self, name: str) -> list[str]:
        """Sorted aliases of the registered name ``name``."""
        key = self._resolve(name)
        return sorted(a for a, target in self._aliases.items() if target == key)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            return self._lookup(name) is not None
        except (KeyError, ValueError):
            return False

    def __len__(self) -> int:
        self._ensure_loaded()
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.list())

    def __repr__(self) -> str:
        return f"Registry(name={self.name!r}, entries={len(self._entries)})"
