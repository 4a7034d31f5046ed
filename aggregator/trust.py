"""How much the aggregator trusts each key: how often it audits it, and whom it has excluded.

BOINC's adaptive replication, applied to spot audits. A key starts untrusted and every receipt of it
is audited until it has passed :data:`TRUSTED_AFTER` audits; after that receipts are audited at the
operator's base rate. A failed audit revokes every credit the key earned since its last passed
audit (all of it, if it never passed one) and excludes it from the task: later receipts are refused.
The rate a key's receipts claimed in its passed audits (samples per second of its compute window) is
its *measured* throughput, which bounds what it may claim later (:mod:`aggregator.contribution_checks`):
a claim above that bound is audited (refused where the desk cannot audit), and a key without a
measured rate is audited anyway. An audit that cannot get its start state revokes nothing: the key
owes one, and each of its receipts is audited until one passes. So does a *marginal* audit (a distance
float32 rounding reaches only rarely, :mod:`aggregator.audits`); a second marginal one before a pass
counts as a failure: an honest key's chance of that is about the square of one's, a cheat's is 1.

Why cheating does not pay, at the defaults (``p`` the base audit rate, 0.1): a cheat that inflates
a receipt's credit by a factor ``k`` gains ``(k - 1) c`` on it if unaudited and loses everything
since its last passed audit if audited. A key that earned honest credit ``C`` since that audit and
cheats on one receipt expects ``(1 - p)(k - 1) c - p (C + c)``; the first ``TRUSTED_AFTER`` receipts
are always audited, so a cheat there is caught with certainty. The numbers are worked in
docs/security.md, "Why cheating does not pay".

The book is in memory, rebuilt on start from the ledger's revocations (exclusions are in the log,
with the reason :data:`EXCLUSION_REASON`); passed audits are not logged, so after a restart every key
is audited as a new one until it has passed again — costlier for the aggregator, never cheaper to cheat.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

TRUSTED_AFTER = 3  # passed audits before a key is audited at the base rate only
EXCLUSION_REASON = "audit_failed"  # the revocation reason prefix that excluded a key
CONVICTION_REASON = "equivocated"  # the prefix of a key's revocations for a posted conviction
EXCLUDING_REASONS = (EXCLUSION_REASON, CONVICTION_REASON)  # revocations that exclude their key


@dataclass
class KeyTrust:
    passed: int = 0  # audits passed
    last_passed_index: int = -1  # ledger index of its newest receipt that passed an audit
    measured_rate: float | None = None  # samples/s, the largest rate a passed audit confirmed
    excluded: bool = False
    owed: bool = False  # an audit of it found no start state: audited until one gives a verdict
    marginal: bool = False  # its newest verdict was marginal: a second one before a pass excludes it


class TrustBook:
    def __init__(self, base_rate: float, trusted_after: int = TRUSTED_AFTER):
        self.base_rate, self.trusted_after = base_rate, trusted_after
        self._keys: dict[str, KeyTrust] = {}
        self._lock = threading.Lock()  # guards _keys (the writer thread and the audit thread)

    def _of(self, key: str) -> KeyTrust:
        return self._keys.setdefault(key, KeyTrust())

    def audit_rate(self, key: str) -> float:
        """The probability that a receipt of ``key`` is audited."""
        with self._lock:
            trust = self._of(key)
            return 1.0 if trust.passed < self.trusted_after or trust.owed else self.base_rate

    def measured_rates(self) -> dict[str, float]:
        with self._lock:
            return {k: t.measured_rate for k, t in self._keys.items() if t.measured_rate is not None}

    def is_excluded(self, key: str) -> bool:
        with self._lock:
            return key in self._keys and self._keys[key].excluded

    def excluded(self) -> set[str]:
        with self._lock:
            return {k for k, t in self._keys.items() if t.excluded}

    def passed(self, key: str, index: int, rate: float | None) -> None:
        """A receipt of ``key`` at ledger ``index`` passed its audit; ``rate`` the samples/s it claimed."""
        with self._lock:
            trust = self._of(key)
            trust.passed += 1
            trust.owed = trust.marginal = False
            trust.last_passed_index = max(trust.last_passed_index, index)
            if rate is not None and rate > 0:
                trust.measured_rate = max(trust.measured_rate or 0.0, rate)

    def failed(self, key: str) -> int:
        """A receipt of ``key`` failed its audit: exclude the key. Returns the ledger index after which
        its credit is revoked (its last passed audit's, or -1)."""
        with self._lock:
            trust = self._of(key)
            trust.excluded = True
            return trust.last_passed_index

    def convict(self, key: str) -> int | None:
        """Peers posted evidence that ``key`` equivocated as a reducer: exclude it as after a failed
        audit. Returns the ledger index after which its credit is revoked, or None if it was excluded
        already (evidence read twice, or by two threads, convicts once)."""
        with self._lock:
            trust = self._of(key)
            if trust.excluded:
                return None
            trust.excluded = True
            return trust.last_passed_index

    def owe(self, key: str) -> None:
        """An audit of ``key`` could not get its start state: its receipt stays credited, and every
        later receipt of the key is audited until one passes (an unavailable state dodges nothing)."""
        with self._lock:
            self._of(key).owed = True

    def marginal(self, key: str) -> int | None:
        """An audit of ``key`` was marginal. The first since its last pass keeps the credit and audits
        every later receipt of it until one passes (returns None); a second excludes the key as a failed
        audit does (returns the ledger index after which its credit is revoked)."""
        with self._lock:
            trust = self._of(key)
            if trust.excluded:
                return None
            if trust.marginal:
                trust.excluded = True
                return trust.last_passed_index
            trust.marginal = trust.owed = True
            return None

    def suspect(self, key: str) -> None:
        """Other peers named the key's values outliers: audit every receipt of it again until it has
        passed ``trusted_after`` more audits (its measured rate stands)."""
        with self._lock:
            self._of(key).passed = 0

    def exclude(self, key: str) -> None:
        """Rebuilding from the ledger: ``key`` was excluded before."""
        with self._lock:
            self._of(key).excluded = True
