"""Relations of var-var patterns (``?x p ?y``), stored once and shared by every query that reads them.

How it works: docs/design/internals.md, cbgp.engine.edge_tables.
"""

from __future__ import annotations

from cbgp.engine.part_state import nb_add, nb_has, nb_iter, nb_remove, nb_same, table_bytes


class EdgeTable:
    __slots__ = ("key", "role", "owner", "forward", "backward", "pairs", "users", "fresh", "attempts")

    def __init__(self, key: tuple[int, int, int], owner: object = None) -> None:
        self.key = key  # (graph id, predicate id, role)
        self.role = key[2]
        self.owner = owner  # None: shared (in Engine._shared); else the query owner that alone reads it
        self.forward: dict | None = None
        self.backward: dict | None = None
        self.pairs = 0
        self.users = 0  # queries reading a shared table
        self.fresh = False  # modified by the change being dispatched
        self.attempts = 0  # failed adoptions of a private table

    def need(self, forward: bool, backward: bool) -> None:
        """Keep (build if missing) the directions a reader's join plans use."""
        if forward and self.forward is None:
            self.forward = {}
            if self.backward is not None:
                for o, subjects in self.backward.items():
                    for s in nb_iter(subjects):
                        nb_add(self.forward, s, o)
        if backward and self.backward is None:
            self.backward = {}
            if self.forward is not None:
                for s, objects in self.forward.items():
                    for o in nb_iter(objects):
                        nb_add(self.backward, o, s)

    def add(self, s: int, o: int) -> bool:
        forward, backward = self.forward, self.backward
        if forward is not None:
            if not nb_add(forward, s, o):
                return False
            if backward is not None:
                nb_add(backward, o, s)
        elif not nb_add(backward, o, s):  # type: ignore[arg-type]
            return False
        self.pairs += 1
        return True

    def has(self, s: int, o: int) -> bool:
        if self.forward is not None:
            return nb_has(self.forward, s, o)
        return nb_has(self.backward, o, s)  # type: ignore[arg-type]

    def remove(self, s: int, o: int) -> None:
        """Remove a present pair."""
        if self.forward is not None:
            nb_remove(self.forward, s, o)
        if self.backward is not None:
            nb_remove(self.backward, o, s)
        self.pairs -= 1

    def same_pairs(self, other: EdgeTable) -> bool:
        if self.pairs != other.pairs:
            return False
        if self.forward is not None and other.forward is not None:
            mine, theirs = self.forward, other.forward
        elif self.backward is not None and other.backward is not None:
            mine, theirs = self.backward, other.backward
        else:
            other.need(self.forward is not None, self.backward is not None)
            return self.same_pairs(other)
        if len(mine) != len(theirs):
            return False
        for key, values in mine.items():
            found = theirs.get(key)
            if found is None or not nb_same(values, found):
                return False
        return True

    def copy(self, owner: object) -> EdgeTable:
        twin = EdgeTable(self.key, owner)
        for name in ("forward", "backward"):
            table = getattr(self, name)
            if table is not None:
                setattr(twin, name, {k: (set(v) if type(v) is set else v) for k, v in table.items()})
        twin.pairs = self.pairs
        return twin

    def entries(self) -> int:
        return (len(self.forward) if self.forward is not None else 0) + (
            len(self.backward) if self.backward is not None else 0)

    def approx_bytes(self) -> int:
        return table_bytes(self.forward) + table_bytes(self.backward)
