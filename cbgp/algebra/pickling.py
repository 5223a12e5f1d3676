"""Operator trees pickle into checkpoints: rdflib's expression nodes do not on their own.

A FILTER, BIND or aggregate keeps rdflib's parsed expression (``CompValue``, and ``Expr`` with its evaluation
function bound to itself).  Pickle rebuilds a dict subclass by calling it with no arguments, which
``CompValue(name, **values)`` refuses, and an ``Expr``'s bound evaluation function does not pickle at all.  The
reducer registered here (``copyreg``, so every pickle of the process uses it) stores the node's name, its
evaluation function (a module function of rdflib, pickled by reference; rdflib's ``TrueFilter`` constant, whose
function is a lambda, by reference to the constant), its items and any other attribute, and rebuilds the node
from them."""

from __future__ import annotations

import copyreg
from collections import OrderedDict
from types import MethodType
from typing import Any, Callable

from rdflib.plugins.sparql.operators import Builtin_REGEX, Builtin_REPLACE, TrueFilter
from rdflib.plugins.sparql.parserutils import CompValue, Expr

from cbgp.algebra.regex import regex, replace

__all__ = ["register"]


def _reduce(node: CompValue) -> tuple:
    if node is TrueFilter:  # (the one node whose evaluation function is a lambda: pickled as a reference)
        return _true_filter, ()
    evalfn = getattr(node, "_evalfn", None)
    extra = {k: v for k, v in vars(node).items() if k not in ("name", "_evalfn")}
    return _rebuild, (type(node), node.name, evalfn.__func__ if evalfn is not None else None, list(node.items()),
                      extra)


def _rebuild(cls: type, name: str, evalfn: Callable | None, items: list[tuple[str, Any]],
             extra: dict[str, Any]) -> CompValue:
    evalfn = _LINEAR.get(evalfn, evalfn)  # type: ignore[arg-type]
    node = cls.__new__(cls)
    OrderedDict.__init__(node)
    node.name = name
    node.update(items)
    if cls is Expr or issubclass(cls, Expr):
        node._evalfn = MethodType(evalfn, node) if evalfn is not None else None
    node.__dict__.update(extra)
    return node


# rdflib's REGEX and REPLACE backtrack (``cbgp.algebra.regex``): a checkpoint that holds them gets the linear ones
_LINEAR: dict[Callable, Callable] = {Builtin_REGEX: regex, Builtin_REPLACE: replace}


def _true_filter() -> Expr:
    return TrueFilter


def register() -> None:
    """Make every pickle of the process use the reducer for rdflib's expression nodes (idempotent)."""
    copyreg.pickle(CompValue, _reduce)
    copyreg.pickle(Expr, _reduce)
