"""Ordering a repository's files so that each comes after the files it depends on, as far as the
dependency cycles allow."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def strongly_connected_components(deps: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Component number of every node of the graph ``node → dependencies`` (iterative Tarjan).

    Dependencies that are not keys of ``deps`` are ignored. Numbers are assigned in a deterministic
    order (nodes visited by sorted name).
    """
    graph = {node: sorted(d for d in set(targets) if d in deps) for node, targets in deps.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    component: dict[str, int] = {}
    counter = 0
    n_components = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, child_i = work.pop()
            if child_i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = graph[node]
            if child_i < len(children):
                work.append((node, child_i + 1))
                child = children[child_i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = n_components
                    if member == node:
                        break
                n_components += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return component


def order_files(deps: Mapping[str, Iterable[str]], key: Callable[[str], Any] | None = None) -> list[str]:
    """All keys of ``deps`` (file → files it depends on), each after its dependencies where possible.

    Kahn's algorithm on the edges dependency → dependent: of the files whose dependencies have all been
    emitted, the smallest by ``key`` (default: the path) comes next. When none is ready, the graph has a
    cycle; then, among the files of the dependency cycles that nothing outside them still blocks, the
    file with the fewest unemitted dependencies comes next, ties broken by ``key``. Restricting the choice
    to those cycles means an edge between two files that are not in one cycle is always respected.
    Self-dependencies and dependencies that are not keys are ignored. The result is deterministic: it
    depends only on ``deps`` and ``key``, not on iteration order.
    """
    sort_key: Callable[[str], Any] = key or (lambda path: path)
    nodes = sorted(deps, key=lambda n: (sort_key(n), n))
    rank = {node: i for i, node in enumerate(nodes)}  # key order, with the path as the final tie-break
    dependencies = {node: {d for d in deps[node] if d in deps and d != node} for node in nodes}
    dependents: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        for dep in dependencies[node]:
            dependents[dep].append(node)
    pending = {node: len(dependencies[node]) for node in nodes}
    component = strongly_connected_components(dependencies)
    # Unemitted dependencies from outside the component, per component: a component is free at zero.
    blocked: dict[int, int] = defaultdict(int)
    members: dict[int, list[str]] = defaultdict(list)
    for node in nodes:
        members[component[node]].append(node)
        blocked[component[node]] += sum(1 for d in dependencies[node] if component[d] != component[node])

    ready = [rank[n] for n in nodes if pending[n] == 0]
    heapq.heapify(ready)
    # (pending, rank) of the nodes of free cycles; an entry is stale once the node's pending count drops.
    # Acyclic nodes never need breaking: a free one has no pending dependency and is ready.
    cyclic = {comp for comp, group in members.items() if len(group) > 1}
    breakable = [(pending[n], rank[n]) for c in cyclic if blocked[c] == 0 for n in members[c]]
    heapq.heapify(breakable)

    emitted: set[str] = set()
    order: list[str] = []
    while len(order) < len(nodes):
        if ready:
            node = nodes[heapq.heappop(ready)]
            if node in emitted:
                continue
        else:
            count, r = heapq.heappop(breakable)
            node = nodes[r]
            if node in emitted or count != pending[node]:
                continue
        emitted.add(node)
        order.append(node)
        for dependent in dependents[node]:
            pending[dependent] -= 1
            comp = component[dependent]
            if pending[dependent] == 0:
                heapq.heappush(ready, rank[dependent])
            if comp != component[node]:
                blocked[comp] -= 1
                if blocked[comp] == 0 and comp in cyclic:
                    for member in members[comp]:
                        heapq.heappush(breakable, (pending[member], rank[member]))
            elif blocked[comp] == 0 and comp in cyclic:
                heapq.heappush(breakable, (pending[dependent], rank[dependent]))
    return order
