"""The user's own code that params name as `package.module:attribute` (reward functions, tools, environments)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Callable


def load_named(name: str, built_in: dict[str, Callable], key: str, kind: str) -> Callable:
    """`built_in[name]`, or `package.module:attribute` imported from the project; a ValueError naming the params `key` otherwise.

    >>> load_named("nope", {"len": len}, "rewards.functions", "reward")
    Traceback (most recent call last):
    ...
    ValueError: rewards.functions: unknown reward 'nope'; built in: ['len'], or use 'module:function'
    """
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        if os.getcwd() not in sys.path:  # user code lives in the project, as `python -m` in its root would see it
            sys.path.append(os.getcwd())
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"{key}: cannot load {name!r}: {error}") from None
        except Exception as error:  # the user's module fails while importing (SyntaxError, a raise at top level, ...)
            raise ValueError(f"{key}: cannot load {name!r}: {type(error).__name__}: {error}") from None
    elif name in built_in:
        found = built_in[name]
    else:
        shape = "module:Class" if kind == "environment" else "module:function"
        raise ValueError(f"{key}: unknown {kind} {name!r}; built in: {sorted(built_in)}, or use '{shape}'")
    if not callable(found):
        raise ValueError(f"{key}: {name!r} is not callable")
    return found
