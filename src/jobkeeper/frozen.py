"""Fast constructors of frozen, slotted dataclasses (internal): the claim and
the bulk enqueue build a Job or NewJob per row.

Leaf module: imports nothing of jobkeeper's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def frozen_builder(cls: type[T], given: tuple[str, ...]) -> Callable[..., T]:
    """A fast constructor of the frozen, slotted dataclass ``cls`` (internal),
    taking the fields named in ``given`` positionally, in that order; every
    other field takes its default.

    A frozen dataclass's ``__init__`` binds keywords and sets each field
    through ``object.__setattr__``: 2.5 us for a Job. This fills an instance
    of a plain class with the same slots (a slot store is one bytecode) and
    then gives it ``cls`` as its class, which CPython allows between classes
    of one layout: 0.4 us. Where that assignment is refused (another
    interpreter), each slot is set through its descriptor instead (1.6 us).
    The code is generated out of ``dataclasses.fields(cls)`` as dataclasses
    generates ``__init__``, so a field added later is set too. No
    ``__post_init__`` runs (none of the classes it serves has one).

    Raises:
        TypeError: a field without a default is not in ``given``, or a
            name in ``given`` is not a field (at import, where it is used).
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    unknown = set(given) - {field.name for field in fields}
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    draft = type(f"_{cls.__name__}Draft", (), {"__slots__": cls.__slots__})  # type: ignore[attr-defined]
    env: dict[str, Any] = {"new_object": object.__new__, "cls": cls, "draft": draft}
    values = []
    for field in fields:
        name = field.name
        env[f"set_{name}"] = getattr(cls, name).__set__
        if name in given:
            value = name
        elif field.default_factory is list:
            value = "[]"  # a list display: 20 ns, where calling list() took 35
        elif field.default_factory is not dataclasses.MISSING:
            env[f"make_{name}"] = field.default_factory
            value = f"make_{name}()"
        elif field.default is not dataclasses.MISSING:
            env[f"default_{name}"] = field.default
            value = f"default_{name}"
        else:
            raise TypeError(f"{cls.__name__}.{name} has no default: pass it in given")
        values.append((name, value))
    params = ", ".join(given)
    source = (
        f"def build({params}):\n    obj = new_object(draft)\n"
        + "".join(f"    obj.{name} = {value}\n" for name, value in values)
        + "    obj.__class__ = cls\n    return obj\n"
        + f"def build_by_descriptors({params}):\n    obj = new_object(cls)\n"
        + "".join(f"    set_{name}(obj, {value})\n" for name, value in values)
        + "    return obj\n"
    )
    exec(source, env)  # the source is made above from the class's own fields
    build: Callable[..., T] = env["build"]
    try:
        sample = build(*[None] * len(given))
    except TypeError:  # the class assignment refused
        return env["build_by_descriptors"]  # type: ignore[no-any-return]
    return build if type(sample) is cls else env["build_by_descriptors"]
