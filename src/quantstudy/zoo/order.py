"""The order a zoo run starts its studies in: longest expected first.

With N studies at a time (`--jobs`, and every GPU), a long study started last runs alone at the
end while the other slots idle, and a device call stopped at its limit loses the studies it
holds (`tools/device/README.md`): starting the longest first (longest-processing-time
scheduling) ends the slots together and leaves the short studies for a call's end. A study's
expected seconds are those its model's committed row took (`--rows`; a stale row's too: the
code changed, not the model's size), else the median of the known ones; ties keep the list's
order. Only the start order changes: the leaderboard lists the models as the list does.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from quantstudy.sweep.events import Job
from quantstudy.zoo.board import ZooRow


def expected_s(row: ZooRow | None) -> float | None:
    """What `row`'s study took, start to end of its process (its own total where that is all
    it has); None: no row, or a row of a study that did not run."""
    if row is None:
        return None
    return row.wall_s if row.wall_s is not None else row.study_s


def longest_first(todo: Sequence[Job], rows: Mapping[str, ZooRow]) -> list[Job]:
    """`todo` ordered by their models' expected seconds, longest first (module docstring)."""
    known = {j.folder: s for j in todo if (s := expected_s(rows.get(j.point.config.model)))}
    median = statistics.median(known.values()) if known else 0.0
    return sorted(todo, key=lambda j: -known.get(j.folder, median))
