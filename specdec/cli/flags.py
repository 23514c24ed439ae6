"""Settings dataclasses as command-line flags: the one place argparse meets the typed settings.

A frozen settings dataclass (``EngineArgs``, ``ThroughputSettings``, ...) lists its fields once,
with help text in each field's metadata; ``add_flags`` turns field ``foo_bar`` into ``--foo-bar``
(type, default, choices and group from the field), and ``settings_from`` builds the dataclass back
from the parsed namespace. Metadata keys: ``help``, ``group``, ``choices``, ``metavar``, ``type``
(when the annotation is not a plain type), ``flag`` / ``action`` / ``const`` / ``nargs`` (flags
that differ from the plain form), ``cli=False`` (no flag).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

from specdec.attention import available_backends
from specdec.engine.args import EngineArgs

T = TypeVar("T")
_PLAIN = (int, float, str)


def _value_type(hint: Any) -> type:
    """int / float / str behind ``X`` or ``X | None``."""
    if hint in _PLAIN:
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if (typing.get_origin(hint) in (typing.Union, types.UnionType)) and len(args) == 1 and args[0] in _PLAIN:
        return args[0]
    raise TypeError(f"no flag type for {hint!r}: give metadata type=...")


def flag_fields(cls: type, only: set[str] | None = None) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli", True) and (only is None or f.name in only)]


def add_flags(parser: argparse.ArgumentParser, cls: type, *, only: set[str] | None = None,
              defaults: dict[str, Any] | None = None, help_format: dict[str, str] | None = None) -> None:
    """Add one flag per field of the settings dataclass ``cls`` (``only``: these fields; ``defaults``
    overrides the fields' defaults)."""
    hints = typing.get_type_hints(cls)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in flag_fields(cls, only):
        meta = dict(f.metadata)
        target = parser
        if "group" in meta:
            title = meta.pop("group")
            target = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        name = meta.pop("flag", "--" + f.name.replace("_", "-"))
        fmt = {"backends": ", ".join(available_backends()), **(help_format or {})}
        kw: dict[str, Any] = {"dest": f.name, "help": meta.pop("help").format(**fmt)}
        for key in ("choices", "metavar", "action", "const", "nargs"):
            if key in meta:
                kw[key] = meta[key]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required:
            kw["required"] = True
        else:
            kw["default"] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if defaults and f.name in defaults:
            kw["default"] = defaults[f.name]
        if hints[f.name] is bool and "action" not in kw:
            kw["action"] = "store_true"
        elif kw.get("action") not in ("store_const", "store_true", "store_false"):
            kw["type"] = meta.get("type") or _value_type(hints[f.name])
        target.add_argument(name, **kw)


def settings_from(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """The settings dataclass from parsed flags (fields without a flag keep their defaults)."""
    values = {f.name: getattr(args, f.name) for f in flag_fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **overrides})


def settings_argv(settings: Any) -> list[str]:
    """The flags that give ``settings`` back (``settings_from``'s inverse): one per field whose
    value differs from its default, so a child process (a ``--dp-size`` replica) gets the same."""
    argv: list[str] = []
    for f in flag_fields(type(settings)):
        value = getattr(settings, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        name, action = f.metadata.get("flag", "--" + f.name.replace("_", "-")), f.metadata.get("action")
        if isinstance(value, bool) or action == "store_const":
            argv += [name] if value == f.metadata.get("const", True) else []
        elif isinstance(value, (tuple, list)):
            argv += [name, *map(str, value)]
        elif value is not None:
            argv += [name, str(value).removeprefix("torch.")]  # a torch.dtype as its flag value
    return argv


# ----------------------------------------------------------------------------- engine flags
def add_engine_args(parser: argparse.ArgumentParser, *, default_model: str | None = None) -> None:
    """SGLang's engine flags (``EngineArgs``); ``default_model`` is ``--model-path``'s default."""
    add_flags(parser, EngineArgs, defaults={"model_path": default_model})
    if default_model is not None:
        model = next(a for a in parser._actions if a.dest == "model_path")
        model.help += " (default: the embedded stories260K)" if "stories260K" in default_model else ""


def engine_args_from(args: argparse.Namespace, **overrides: Any) -> EngineArgs:
    """``EngineArgs`` from parsed flags; the speculative settings apply only with an algorithm."""
    engine_args = settings_from(EngineArgs, args, **overrides)
    return engine_args if engine_args.speculative else engine_args.without_speculation()
