"""Query decomposition (Gergatsoulis & Damigos, Defs. 9-13, Prop. 5), as data.

How it works: docs/design/internals.md, cbgp.query.plan.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from cbgp.query.sparql import ParsedQuery, TriplePattern, is_var


@dataclass(frozen=True)
class GroundPart:
    patterns: tuple[int, ...]  # indices into ParsedQuery.patterns
    subject: str = ""  # the subject of every one of them

    kind = "ground"

    @property
    def variables(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class StarPart:
    variable: str
    patterns: tuple[int, ...]
    simple: bool  # False when the star contains a self-loop ?x p ?x

    kind = "star"

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.variable,)


@dataclass(frozen=True)
class ComponentPart:
    variables: tuple[str, ...]
    patterns: tuple[int, ...]
    stars: tuple[tuple[str, tuple[int, ...]], ...]  # (centre variable, patterns of its star)
    overlaps: tuple[tuple[str, str, tuple[int, ...]], ...]  # (star X, star Y, shared var-var patterns)
    join_orders: tuple[tuple[int, tuple[str, ...]], ...]  # (pattern, order of star centres)

    kind = "component"

    def join_order(self, pattern: int) -> tuple[str, ...]:
        return dict(self.join_orders)[pattern]

    @property
    def centre(self) -> str | None:
        """The variable every pattern contains, if there is one (a *single-centre* component: a star with
        attribute variables, a 2-hop path, a 2-cycle), else None.  Every triple of an embedding then has that
        variable's value at its subject or object, so routing by subject and by object brings all of them to
        the partition of that value: the component is evaluated there, per centre value, with no hop."""
        everything = set(self.patterns)
        for variable, patterns in self.stars:
            if set(patterns) == everything:
                return variable
        return None


Part = GroundPart | StarPart | ComponentPart

SUBJECT_END = 0
OBJECT_END = 1


@dataclass(frozen=True)
class Step:
    """One step of a probe's join plan (``cbgp.distributed.evaluator``): match pattern ``pattern`` at the partition of
    variable ``at``'s value, where its triples are stored by their ``end`` (SUBJECT_END or OBJECT_END), and
    bind variable ``binds`` from it, or with ``binds == -1`` check it."""

    pattern: int
    at: int
    end: int
    binds: int


def stored_ends(subject_var: int, object_var: int) -> tuple[int, ...]:
    """The ends of a pattern whose value is a variable (-1: a constant): where its triples are stored.  A
    self-loop's one variable is its subject."""
    if subject_var >= 0 and subject_var == object_var:
        return (SUBJECT_END,)
    return tuple(end for end, var in ((SUBJECT_END, subject_var), (OBJECT_END, object_var)) if var >= 0)


def probe_join_plan(pairs: list[tuple[int, int]], j: int) -> tuple[Step, ...]:
    """The order in which an update to pattern ``j`` matches the others (``pairs``: each pattern's subject and
    object variable numbers, -1 for a constant), hopping as little as possible: at the partition where the
    probe is (first the start end's value), checks, then lookups; then checks anywhere; then a lookup from
    the most recently bound variable (a hop)."""
    def var_at(i: int, end: int) -> int:
        return pairs[i][0] if end == SUBJECT_END else pairs[i][1]

    bound = [v for v in pairs[j] if v >= 0]
    bound = list(dict.fromkeys(bound))
    here = var_at(j, stored_ends(*pairs[j])[0])
    remaining = [i for i in range(len(pairs)) if i != j]
    steps: list[Step] = []

    def is_check(i: int) -> bool:
        return all(v in bound for v in pairs[i] if v >= 0)

    while remaining:
        choice = None
        for want_check, at_here in ((True, True), (False, True), (True, False), (False, False)):
            for i in remaining:
                if is_check(i) != want_check:
                    continue
                usable = [(end, var_at(i, end)) for end in stored_ends(*pairs[i])
                          if var_at(i, end) in bound and (not at_here or var_at(i, end) == here)]
                if usable:
                    end, at = max(usable, key=lambda ev: bound.index(ev[1]))
                    choice = (i, end, at)
                    break
            if choice:
                break
        assert choice is not None, "a component is connected"
        i, end, at = choice
        binds = -1
        if not is_check(i):
            binds = var_at(i, OBJECT_END if end == SUBJECT_END else SUBJECT_END)
            bound.append(binds)
        steps.append(Step(i, at, end, binds))
        here = at
        remaining.remove(i)
    return tuple(steps)

BY_CENTRE = "by-centre"
SINGLE_OWNER = "single-owner"


@dataclass(frozen=True)
class Plan:
    query: ParsedQuery
    grounds: tuple[GroundPart, ...]  # the ground patterns, one part per subject
    stars: tuple[StarPart, ...]
    components: tuple[ComponentPart, ...]

    @property
    def parts(self) -> tuple[Part, ...]:
        return self.grounds + self.stars + self.components

    @property
    def placement(self) -> str:
        """Where the fleet keeps the query's state: ``by-centre`` (keyed by centre value over the routed
        partitions: one star, one single-centre component evaluated where its centre lives, or one
        multi-centre component whose stars live at their centres' partitions, joined by probes) or
        ``single-owner`` (one worker evaluates the whole query on the total order: a ``GRAPH ?g`` query with
        ``?g`` also a subject or object, whose graphs' instances differ in shape).  A ground part (the ground
        patterns of one subject) is kept at that subject's partition, where all its triples are routed; a
        product's multi-centre parts are joined by probes like a multi-centre query.  A ``GRAPH ?g`` query is
        placed the same way, each named graph apart: every quad is routed by its subject and object whatever
        its graph, a multi-centre component's stores are keyed by (centre value, graph), and a product's
        parts carry ?g, on which the answers service joins them (``cbgp.engine.assembly.GraphAssembler``)."""
        parts = self.parts
        graph_vars = {p.g for p in self.query.patterns if p.g is not None and is_var(p.g)}
        if graph_vars:
            # (each graph's instance must have the same shape: ?g nowhere but in graph position)
            alone = not any(g in p.variables() for g in graph_vars for p in self.query.patterns)
            return BY_CENTRE if parts and alone else SINGLE_OWNER
        # Each part evaluated where its centre (a ground part: its subject) lives; a product assembled in seq
        # order by the answers service.
        return BY_CENTRE if parts else SINGLE_OWNER

    @property
    def product_by_centre(self) -> bool:
        """A product of parts placed by centre: each part's deltas are released in seq order and the answers
        service multiplies them (``cbgp.engine.assembly.Assembler``)."""
        return self.placement == BY_CENTRE and len(self.parts) > 1

    @property
    def probed_parts(self) -> tuple[int, ...]:
        """The parts of a by-centre product that are multi-centre components (joined by probes), by index."""
        if not self.product_by_centre:
            return ()
        return tuple(i for i, p in enumerate(self.parts) if isinstance(p, ComponentPart) and p.centre is None)

    @property
    def probed(self) -> bool:
        """A multi-centre component placed by centre: its stars are joined by probes between partitions."""
        parts = self.parts
        return (self.placement == BY_CENTRE and len(parts) == 1 and isinstance(parts[0], ComponentPart)
                and parts[0].centre is None)

    def probe_routes(self) -> dict[int, list[str]]:
        """Per pattern of a probed query, the route of an update's probes (``cbgp.distributed.evaluator``): where it
        starts, then each step's pattern, the variable whose value's partition it runs at, and what it does."""
        part = self.parts[0]
        names = part.variables
        local = {v: i for i, v in enumerate(names)}
        patterns = [self.query.patterns[i] for i in part.patterns]
        pairs = [(local.get(t.s, -1), local.get(t.o, -1)) for t in patterns]
        by_pattern = {}
        for j, pattern in enumerate(part.patterns):
            start_end, steps = probe_route(pairs, j)  # the route the workers run (cbgp.distributed.program)
            hops = [f"t{pattern} at {names[pairs[j][start_end]]}"]
            for step in steps:
                action = f"binds {names[step.binds]}" if step.binds >= 0 else "checks"
                hops.append(f"t{part.patterns[step.pattern]} at {names[step.at]} ({action})")
            by_pattern[pattern] = hops
        return by_pattern

    @property
    def query_class(self) -> str:
        """The paper's class of the whole query (Defs. 6-8, 11, 12)."""
        if not self.stars and not self.components:
            return "ground"
        if not self.components:
            if len(self.stars) == 1 and not self.grounds:
                return "simple var-centric star" if self.stars[0].simple else "var-centric star (self-loop)"
            return "loosely-connected"
        if len(self.components) == 1 and not self.stars and not self.grounds:
            return "var-connected"
        return "general (product of parts)"

    def to_json(self) -> dict:
        patterns = [str(p) for p in self.query.patterns]
        parts = []
        for part in self.parts:
            entry: dict = {"kind": part.kind, "patterns": list(part.patterns), "variables": list(part.variables),
                           "placement": self.placement}
            if isinstance(part, GroundPart):
                entry["keyed_by"] = part.subject  # the partition of that term's id
            if isinstance(part, StarPart):
                entry["centre"] = part.variable
                entry["simple"] = part.simple
            if isinstance(part, ComponentPart):
                entry["centre"] = part.centre
                entry["stars"] = [{"centre": v, "keyed_by": v, "patterns": list(ps)} for v, ps in part.stars]
                if self.probed:
                    entry["probe_routes"] = {str(p): route for p, route in self.probe_routes().items()}
                entry["overlaps"] = [{"stars": [a, b], "shared_patterns": list(ps)} for a, b, ps in part.overlaps]
                entry["join_orders"] = {str(p): list(order) for p, order in part.join_orders}
            parts.append(entry)
        return {
            "class": self.query_class,
            "patterns": patterns,
            "projected": list(self.query.projected),
            "distinct": self.query.distinct,
            "placement": self.placement,
            "parts": parts,
        }

    def explain(self) -> str:
        """A person-readable account of the decomposition."""
        q = self.query
        lines = [f"query class: {self.query_class}"]
        graph_vars = sorted({p.g for p in q.patterns if p.g is not None and is_var(p.g)})
        if graph_vars:
            lines.append(f"evaluated once per named graph, with {graph_vars[0]} bound to its name")
        proj = ", ".join("?" + v for v in q.projected) or "(none: boolean)"
        lines.append(f"projection: {proj}{'  (DISTINCT)' if q.distinct else ''}")
        lines.append("triple patterns:")
        for index, pattern in enumerate(q.patterns):
            lines.append(f"  t{index}: {pattern}")
        lines.append("connected-variable decomposition D_CV:")
        for number, part in enumerate(self.parts, 1):
            pats = " ".join(f"t{i}" for i in part.patterns)
            if isinstance(part, GroundPart):
                where = f", kept at the partition of {part.subject}" if self.placement == BY_CENTRE else ""
                lines.append(f"  part {number}: ground part [{pats}] -> match bitmap of {len(part.patterns)} "
                             f"bit{'s' if len(part.patterns) > 1 else ''}"
                             + where)
            elif isinstance(part, StarPart):
                note = "" if part.simple else " (contains a self-loop)"
                lines.append(
                    f"  part {number}: var-centric star on {part.variable} [{pats}]{note} -> "
                    f"state keyed by the value of {part.variable}"
                )
            else:
                names = ", ".join(part.variables)
                lines.append(f"  part {number}: var-connected component {{{names}}} [{pats}]")
                lines.append("    star decomposition (state keyed by each centre's value):")
                for centre, pats_of_star in part.stars:
                    lines.append(f"      star {centre}: " + " ".join(f"t{i}" for i in pats_of_star))
                lines.append("    overlapping-subqueries graph:")
                for a, b, shared in part.overlaps:
                    lines.append(f"      {a} -- {b} (share " + " ".join(f"t{i}" for i in shared) + ")")
                lines.append("    join order per pattern (findOrderedArray):")
                for pattern, order in part.join_orders:
                    lines.append(f"      t{pattern}: " + " -> ".join(order))
        if len(self.parts) > 1:
            per_graph = " per named graph (the parts join on the graph)" if graph_vars else ""
            lines.append(f"answers: cartesian product of the parts' answers{per_graph} (delta rule per update)")
        lines.append(f"placement in the fleet: {self.placement}")
        if self.probed:
            lines.append("  every star keyed by its centre's value: a triple is stored on the updates.routed "
                         "partitions of its subject and of its object;")
            lines.append("  an update's probes carry the partial binding from one centre value's partition to "
                         "the next (versioned reads as of the update, acks to the update's partition):")
            for pattern, route in self.probe_routes().items():
                lines.append(f"    t{pattern}: " + " -> ".join(route))
            lines.append("  (the default routes; each partition switches a pattern's updates to another order "
                         "when the fan-outs it counts make that one send fewer probes)")
            lines.append("  the answers service releases the partitions' deltas in seq order"
                         + (" and applies DISTINCT" if q.distinct else ""))
        elif self.product_by_centre:
            probed = self.probed_parts
            lines.append("  every part keyed by its centre's value on the updates.routed partitions ("
                         + (("part " if len(probed) == 1 else "parts ") + ", ".join(str(i + 1) for i in probed)
                            + ": stars joined by probes between partitions);" if probed else "no hop);"))
            lines.append("  the answers service releases the parts' deltas in seq order and multiplies them "
                         "(delta rule per update" + (", DISTINCT by presence)" if q.distinct else ")"))
        elif self.placement == BY_CENTRE and isinstance(self.parts[0], GroundPart):
            lines.append(f"  kept on the updates.routed partition of {self.parts[0].subject}, the subject of every "
                         "pattern (its triples are routed there)")
        elif self.placement == BY_CENTRE:
            part = self.parts[0]
            centre = part.variable if isinstance(part, StarPart) else part.centre
            lines.append(f"  state keyed by the value of {centre} on the updates.routed partition of that value "
                         "(every pattern contains it: triples routed by subject and object meet there, no hop);")
            lines.append("  the answers service releases the partitions' deltas in seq order"
                         + (" and applies DISTINCT" if q.distinct else ""))
        else:
            lines.append("  one worker (the owner of the query's partition) evaluates it on the total order "
                         "of updates.encoded")
        return "\n".join(lines)


def decompose(query: ParsedQuery) -> Plan:
    patterns = query.patterns
    # A GRAPH ?g variable only in graph position joins nothing: each named graph is evaluated alone.
    variables = [v for v in query.variables if any(v in p.variables() for p in patterns)]
    parent = {v: v for v in variables}

    def find(v: str) -> str:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for pattern in patterns:
        pvars = pattern.variables()
        if len(pvars) == 2:
            a, b = find(pvars[0]), find(pvars[1])
            if a != b:
                parent[b] = a

    blocks: dict[str, list[str]] = {}
    for v in variables:
        blocks.setdefault(find(v), []).append(v)

    by_subject: dict[str, list[int]] = {}  # first-seen order: deterministic
    for i, p in enumerate(patterns):
        if not p.variables():
            by_subject.setdefault(p.s, []).append(i)
    grounds = tuple(GroundPart(tuple(indices), subject) for subject, indices in by_subject.items())
    stars: list[StarPart] = []
    components: list[ComponentPart] = []
    for block in blocks.values():  # first-seen order of variables: deterministic
        member = tuple(i for i, p in enumerate(patterns) if set(p.variables()) & set(block))
        if len(block) == 1:
            v = block[0]
            simple = all(not (patterns[i].s == v and patterns[i].o == v) for i in member)
            stars.append(StarPart(v, member, simple))
        else:
            components.append(_component(patterns, tuple(block), member))
    return Plan(query, grounds, tuple(stars), tuple(components))


def _component(patterns: tuple[TriplePattern, ...], block: tuple[str, ...], member: tuple[int, ...]) -> ComponentPart:
    star_of = {v: tuple(i for i in member if v in patterns[i].variables()) for v in block}
    overlaps: dict[tuple[str, str], list[int]] = {}
    neighbours: dict[str, list[str]] = {v: [] for v in block}
    for i in member:
        pvars = patterns[i].variables()
        if len(pvars) == 2:
            a, b = sorted(pvars, key=block.index)
            overlaps.setdefault((a, b), []).append(i)
            if b not in neighbours[a]:
                neighbours[a].append(b)
                neighbours[b].append(a)
    orders = []
    for i in member:
        order = list(patterns[i].variables())
        queue = deque(order)
        while queue:
            current = queue.popleft()
            for nxt in neighbours[current]:
                if nxt not in order:
                    order.append(nxt)
                    queue.append(nxt)
        orders.append((i, tuple(order)))
    return ComponentPart(
        variables=block,
        patterns=member,
        stars=tuple((v, star_of[v]) for v in block),
        overlaps=tuple((a, b, tuple(ps)) for (a, b), ps in overlaps.items()),
        join_orders=tuple(orders),
    )


__all__ = ["CHECK_KEEPS", "ComponentPart", "FAN_IN", "FAN_OUT", "GroundPart", "OBJECT_END", "Part", "Plan",
           "SUBJECT_END", "StarPart", "Step", "decompose", "probe_join_plan", "probe_route", "route_cost",
           "route_variants", "stored_ends"]


# The route model without statistics (the default route, from the query alone; partitions then choose by the
# fan-outs they count, cbgp.distributed.evaluator): a lookup from a subject finds FAN_OUT objects on average, one from an
# object FAN_IN subjects (an attribute or a type has one value per subject but many subjects per value), a check
# keeps CHECK_KEEPS of the bindings.
FAN_OUT, FAN_IN, CHECK_KEEPS = 2.0, 8.0, 0.5
MAX_SEARCHED = 6  # components of more patterns keep probe_join_plan's route (the search grows as n!)
MAX_VARIANTS = 64  # routes a partition may choose among per pattern (cbgp.distributed.evaluator, by its own counts)


def route_cost(pairs: list[tuple[int, int]], j: int, start: int, steps: tuple[Step, ...],
               fan: Callable[[int, int], float] | None = None) -> tuple[float, float]:
    """(probes sent, lookups made) per update of pattern ``j`` starting at ``start`` along ``steps``, by the
    route model: a lookup in pattern i's triples stored by ``end`` finds ``fan(i, end)`` values (default:
    FAN_OUT from a subject, FAN_IN from an object), a check keeps CHECK_KEEPS of the bindings, and a hop costs
    the bindings that travel."""
    def var_at(i: int, end: int) -> int:
        return pairs[i][0] if end == SUBJECT_END else pairs[i][1]

    here, bindings, hops, work = var_at(j, start), 1.0, 0.0, 0.0
    for step in steps:
        # (a check is made where the probe is when one of its ends' values lives there)
        if step.binds >= 0 or here not in pairs[step.pattern]:
            if step.at != here:
                hops += bindings
            here = step.at
        work += bindings
        if step.binds >= 0:
            if fan is None:
                bindings *= FAN_OUT if step.end == SUBJECT_END else FAN_IN
            else:
                bindings *= fan(step.pattern, step.end)
        else:
            bindings *= CHECK_KEEPS
    return hops, work


def _routes(pairs: list[tuple[int, int]], bound: set[int], remaining: list[int], steps: list[Step],
            found: Callable[[tuple[Step, ...]], bool]) -> None:
    """Every well-formed order of ``remaining`` (each step at a bound value's partition) to ``found``, which
    returns False to prune the routes that extend ``steps``."""
    if not remaining:
        found(tuple(steps))
        return
    if not found(tuple(steps)):
        return
    for i in remaining:
        check = all(v in bound for v in pairs[i] if v >= 0)
        for end in stored_ends(*pairs[i]):
            at = pairs[i][0] if end == SUBJECT_END else pairs[i][1]
            if at not in bound:
                continue
            binds = -1 if check else (pairs[i][1] if end == SUBJECT_END else pairs[i][0])
            steps.append(Step(i, at, end, binds))
            _routes(pairs, bound | {binds} if binds >= 0 else bound, [r for r in remaining if r != i], steps, found)
            steps.pop()


def probe_route(pairs: list[tuple[int, int]], j: int) -> tuple[int, tuple[Step, ...]]:
    """Where an update to pattern ``j`` starts (its triple is routed to the partitions of both its ends) and
    the order in which it matches the others (``pairs``: each pattern's subject and object variable numbers,
    -1 for a constant): of every start end and order, the one sending the fewest probes by the route model
    (:func:`route_cost`), then doing the fewest lookups; probe_join_plan's route (from the subject end) when
    the model finds nothing cheaper.  On a 3-hop path ``?a knows ?b . ?b like ?post . ?post browser ?x``, an
    update of the middle pattern then starts at ``?post`` (one browser, then one hop to ``?b``) instead of at
    ``?b`` (every friend of ``?b`` hopping to ``?post``)."""
    default = (stored_ends(*pairs[j])[0], probe_join_plan(pairs, j))
    if len(pairs) > MAX_SEARCHED:
        return default
    best = [route_cost(pairs, j, *default), default]

    for start in stored_ends(*pairs[j]):
        def found(steps: tuple[Step, ...], start: int = start) -> bool:
            cost = route_cost(pairs, j, start, steps)
            if cost >= best[0]:
                return False  # costs only grow along a route
            if len(steps) == len(pairs) - 1:
                best[0], best[1] = cost, (start, steps)
            return True

        _routes(pairs, {v for v in pairs[j] if v >= 0}, [i for i in range(len(pairs)) if i != j], [], found)
    return best[1]


def route_variants(pairs: list[tuple[int, int]], j: int) -> tuple[int, tuple[tuple[Step, ...], ...]]:
    """The start end of pattern ``j``'s updates (:func:`probe_route`'s) and the routes a partition may send
    them along: first :func:`probe_route`'s, then every other well-formed order (at most MAX_VARIANTS, the
    cheapest by the default model), in an order fixed by the query alone, so that a probe names its route by
    index on every partition.  A route whose first step is at the other end's value starts with one hop."""
    start, first = probe_route(pairs, j)
    if len(pairs) > MAX_SEARCHED:
        return start, (first,)
    others: list[tuple[Step, ...]] = []

    def found(steps: tuple[Step, ...]) -> bool:
        if len(steps) == len(pairs) - 1 and steps != first:
            others.append(steps)
        return True

    _routes(pairs, {v for v in pairs[j] if v >= 0}, [i for i in range(len(pairs)) if i != j], [], found)
    ranked = sorted(range(len(others)), key=lambda k: (route_cost(pairs, j, start, others[k]), k))
    return start, (first,) + tuple(others[k] for k in sorted(ranked[:MAX_VARIANTS - 1]))
