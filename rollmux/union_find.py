"""Union-find over hashable items in a dict (``parent[x]`` is ``x``'s parent; an item not yet in
the dict is its own root). Shared by the code that groups things linked by what they share:
members linked by shared nodes (:func:`rollmux.steady_state._rr_steady`,
:func:`rollmux.admission.order.steady_lower_bounds`) and the exchanges between two partitions
(``rollmux.admission.global_plan._exchanges``)."""

from __future__ import annotations

from typing import Hashable, MutableMapping, TypeVar

T = TypeVar("T", bound=Hashable)

__all__ = ["find_root"]


def find_root(parent: MutableMapping[T, T], x: T) -> T:
    """The root of ``x``'s set in the forest ``parent`` (``x`` is added as its own root when
    absent), halving the path on the way. Linking is the caller's: ``parent[find_root(parent, a)]
    = find_root(parent, b)`` (or any rule that keeps roots deterministic)."""
    while parent.setdefault(x, x) != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x
