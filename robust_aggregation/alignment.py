"""Which senders keep pointing against the swarm: a record, kept across all-reduces, of how each
sender's parts align with the centre of the others' parts, and the senders it has evidence against.

CenteredClip bounds what one sender can do to a part's average, but a sender that sends its honest
gradient with the sign flipped stays within the honest spread whenever batch noise is larger than
the gradient's signal: it is clipped, never far enough out to be named, and it pulls every average
it joins back toward where the model came from. What gives it away is its direction: an honest
sender's part is, in expectation, positively aligned with the mean of the others (they estimate the
same gradient), a flipped one negatively, by as much. One all-reduce says little, so:

* a reducer notes one cosine per sender and all-reduce, over its whole share
  (:attr:`hivemind_adapter.robust_reduce.RobustPartReducer.alignments`), not one per part: the parts
  of one all-reduce come from one batch and are not independent evidence;
* the record keeps each sender's last :data:`WINDOW` cosines and names it only when their mean lies
  ``z_score`` standard errors below zero, *below* an honest sender's expectation (a sender is named
  in a commit, and loses that round's credit, only when two reducers name it);
* the standard error is not the sender's own (a few values give a poor estimate): it is the spread
  of every sender's cosine around its part's median cosine, pooled over the last :data:`POOLED` of
  them, as a median absolute deviation, which the minority it is meant to catch cannot inflate;
* nobody is named unless the swarm's own alignment is measurable: the median sender's window, among
  those seen in the last :data:`WINDOW` parts, must lie ``swarm_z`` standard errors *above* zero
  (late in training gradients are mostly batch noise, and honest windows stray below zero). That
  median stands for the swarm only among at least :data:`MIN_SWARM_SENDERS` senders; a record of
  fewer (a cohort of three, a pair of heads) keeps the rule without it. A flipped gradient cancels
  only what the others agree on, so where their agreement is not measurable it costs little;
* a sender named here is left out of the centres of the parts this record's reducer averages, and
  keeps being measured: it is named while its window says so.

What the rule costs and catches: benchmarks/RESULTS.md, "Robust averaging: accuracy under attack".

Pure Python: the cosines come from :func:`robust_aggregation.centered_clip.centered_clip`.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# A sender's last this many cosines are its evidence: one per all-reduce this reducer took part in
# (its whole share), so a flipped sender is caught after min_cosines of them and one that stops
# attacking is no longer named within a few.
WINDOW = 16
# Cosines pooled, over all senders, to estimate the spread of one cosine.
POOLED = 96
# Parts of fewer values give no cosine: their direction is mostly noise (a known group's
# confirmation is a few values).
MIN_VALUES = 1024
# The fewest recent senders whose median score can stand for the swarm's agreement. In a group of
# three a flipped sender is half of each honest sender's "others", whose centre is then the
# difference of two gradients (the signal cancels): every honest score sits near zero and the
# median with it.
MIN_SWARM_SENDERS = 5


@dataclass(frozen=True)
class Alignment:
    """How a sender's part lies against the centre of the others': their dot product and both
    squared lengths. Sums of these over a reducer's parts of one all-reduce give the cosine of the
    sender's whole share there (:attr:`~hivemind_adapter.robust_reduce.RobustPartReducer.alignments`),
    which is what an :class:`AlignmentRecord` keeps."""

    dot: float
    own: float  # |x|^2
    others: float  # |centre of the others|^2

    def __add__(self, other: Alignment) -> Alignment:
        return Alignment(self.dot + other.dot, self.own + other.own, self.others + other.others)

    @property
    def cosine(self) -> float | None:
        norms = math.sqrt(self.own) * math.sqrt(self.others)
        return self.dot / norms if norms > 0 else None


@dataclass(frozen=True)
class AlignmentConfig:
    """``z_score``: how many standard errors below zero a sender's window mean must be to name it.
    ``swarm_z``: how many above zero the median recent sender's must be before anyone is named.
    ``min_cosines``: the fewest cosines a sender needs before it can be named (and the fewest pooled
    ones before anyone can)."""

    z_score: float = 3.0
    swarm_z: float = 2.0
    min_cosines: int = 4

    def __post_init__(self) -> None:
        if not (math.isfinite(self.z_score) and self.z_score > 0):
            raise ValueError(f"z_score must be a positive number, not {self.z_score}")
        if not (math.isfinite(self.swarm_z) and self.swarm_z >= 0):
            raise ValueError(f"swarm_z must be a number of at least 0, not {self.swarm_z}")
        if not 1 <= self.min_cosines <= WINDOW:
            raise ValueError(f"min_cosines must be between 1 and {WINDOW}, not {self.min_cosines}")


class AlignmentRecord:
    """Per sender (any hashable name: a peer id), its last :data:`WINDOW` cosines with the others'
    centre; :meth:`suspects` names those pointing against it. Not thread-safe: one reducer's event
    loop writes it."""

    def __init__(self, config: AlignmentConfig | None = None):
        self.config = config or AlignmentConfig()
        self._cosines: dict[str, deque[float]] = {}
        self._deviations: deque[float] = deque(maxlen=POOLED)  # |cosine - its part's median cosine|
        self._parts = 0  # parts noted so far
        self._last_part: dict[str, int] = {}  # per sender, the part it was last noted in

    def note_part(self, cosines: Mapping[str, float]) -> None:
        """Record the cosines of one part's senders (a sender's part against the centre of the others').
        A part with fewer than two senders says nothing about anyone."""
        finite = {name: c for name, c in cosines.items() if math.isfinite(c)}
        if len(finite) < 2:
            return
        median = statistics.median(finite.values())
        self._parts += 1
        for name, cosine in finite.items():
            self._cosines.setdefault(name, deque(maxlen=WINDOW)).append(cosine)
            self._deviations.append(abs(cosine - median))
            self._last_part[name] = self._parts

    def spread(self) -> float | None:
        """The estimated standard deviation of one cosine, or None before enough were pooled."""
        if len(self._deviations) < self.config.min_cosines * 2:
            return None
        return 1.4826 * statistics.median(self._deviations)

    def score(self, name: str) -> float | None:
        """``name``'s window mean in standard errors (negative: pointing against the others), or None
        without enough evidence."""
        cosines, spread = self._cosines.get(name), self.spread()
        if cosines is None or len(cosines) < self.config.min_cosines or not spread:
            return None
        return statistics.fmean(cosines) * math.sqrt(len(cosines)) / spread

    def swarm_score(self) -> float | None:
        """The median score of the senders noted in the last :data:`WINDOW` parts (a minority
        cannot move it), or None without enough evidence or with fewer than
        :data:`MIN_SWARM_SENDERS` of them."""
        recent = [
            score
            for name, last in self._last_part.items()
            if self._parts - last < WINDOW and (score := self.score(name)) is not None
        ]
        return statistics.median(recent) if len(recent) >= MIN_SWARM_SENDERS else None

    def suspects(self, among: Iterable[str] | None = None) -> set[str]:
        """The senders (of ``among``, default all) whose score is below ``-z_score``, while the
        swarm's own score is at least ``swarm_z`` (where it can be measured); else nobody."""
        swarm = self.swarm_score()
        if swarm is not None and swarm < self.config.swarm_z:
            return set()
        names = self._cosines if among is None else among
        return {
            name for name in names if (score := self.score(name)) is not None and score < -self.config.z_score
        }
