"""Parameter grids that hold every pair of settings instead of every combination (all-pairs covering arrays, built
by in-parameter-order growth: Lei & Tai, "In-parameter-order: a test generation strategy for pairwise testing", 1998).
The loss's branches are chosen one factor at a time (selector fields, policy loss, aggregation, KL), so a bug of one
setting, or of two settings together, shows in a row that holds them; 10 × 6 × 3 × 3 settings need 60 rows, not 540."""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def uncovered_pairs(rows: Sequence[tuple], factors: Sequence[Sequence]) -> set[tuple]:
    """The (factor i, value, factor j, value) pairs, i < j, that no row holds."""
    wanted = {
        (i, a, j, b) for i, j in itertools.combinations(range(len(factors)), 2) for a in factors[i] for b in factors[j]
    }
    held = {(i, row[i], j, row[j]) for row in rows for i, j in itertools.combinations(range(len(factors)), 2)}
    return wanted - held


def all_pairs(*factors: Sequence) -> list[tuple]:
    """Rows (one value per factor, in the factors' order) that hold every pair of values of any two factors; the
    first two factors' full product is kept, so with the two largest first the rows are as few as possible."""
    rows = [list(pair) for pair in itertools.product(factors[0], factors[1])]
    for f in range(2, len(factors)):
        missing = {(i, a, b) for i in range(f) for a in factors[i] for b in factors[f]}
        for row in rows:  # horizontal growth: the value that covers the most new pairs with this row's values
            best = max(factors[f], key=lambda b: sum((i, row[i], b) in missing for i in range(f)))
            row.append(best)
            missing -= {(i, row[i], best) for i in range(f)}
        for i, a, b in sorted(missing, key=repr):  # vertical growth: a row for each pair still missing
            if (i, a, b) in missing:
                row = [a if k == i else factors[k][0] for k in range(f)] + [b]
                rows.append(row)
                missing -= {(k, row[k], b) for k in range(f)}
    return [tuple(row) for row in rows]
