"""What grows when something is kept per registration: entries reachable from a service's core."""

from __future__ import annotations


def held(root: object) -> int:
    """Entries of every dict, list, set and tuple reachable from ``root`` through attributes (not classes,
    functions or modules): what grows if something is kept per registration."""
    seen: set[int] = set()
    stack, total = [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, str, bytes, int, float, bool)) or callable(obj) \
                and not hasattr(obj, "__dict__"):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            total += len(obj)
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, set, frozenset, tuple)):
            total += len(obj)
            stack.extend(obj)
        elif type(obj).__module__.startswith(("services", "cbgp")):  # (the project's objects: their attributes)
            stack.extend(vars(obj).values() if hasattr(obj, "__dict__") else ())
            stack.extend(getattr(obj, name) for cls in type(obj).__mro__
                         for name in getattr(cls, "__slots__", ()) if hasattr(obj, name))
    return total
