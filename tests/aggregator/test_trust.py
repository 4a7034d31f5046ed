"""BOINC-style adaptive audits: a new key is audited on every receipt until it has passed a few,
then at the base rate; a failure excludes it and says from where its credit is revoked."""

from __future__ import annotations

from aggregator.trust import TRUSTED_AFTER, TrustBook


def test_new_keys_are_audited_always_until_they_passed_enough_audits():
    book = TrustBook(base_rate=0.1)
    assert book.audit_rate("a") == 1.0
    for i in range(TRUSTED_AFTER):
        assert book.audit_rate("a") == 1.0
        book.passed("a", index=10 * i, rate=50.0 + i)
    assert book.audit_rate("a") == 0.1
    assert book.audit_rate("b") == 1.0  # another key starts over
    assert book.measured_rates() == {"a": 50.0 + TRUSTED_AFTER - 1}  # the largest confirmed rate


def test_a_failed_audit_excludes_the_key_and_revokes_since_its_last_passed_audit():
    book = TrustBook(base_rate=0.1)
    assert book.failed("never-passed") == -1  # all of its credit
    book.passed("k", index=7, rate=None)
    book.passed("k", index=3, rate=None)  # verdicts may arrive out of order: the newest index counts
    assert book.failed("k") == 7
    assert book.is_excluded("k") and book.excluded() == {"never-passed", "k"}
    assert "k" not in book.measured_rates()  # a pass without a measured window gives no rate


def test_a_key_named_an_outlier_is_audited_on_every_receipt_again():
    book = TrustBook(base_rate=0.1)
    for i in range(TRUSTED_AFTER):
        book.passed("k", index=i, rate=10.0)
    assert book.audit_rate("k") == 0.1
    book.suspect("k")
    assert book.audit_rate("k") == 1.0 and book.measured_rates() == {"k": 10.0}


def test_a_conviction_excludes_once_and_revokes_since_the_last_passed_audit():
    book = TrustBook(base_rate=0.1)
    book.passed("k", index=4, rate=None)
    assert book.convict("k") == 4 and book.is_excluded("k")
    assert book.convict("k") is None  # the same evidence read again convicts nobody twice
    assert book.convict("never-passed") == -1


def test_an_audit_without_its_start_state_keeps_the_credit_and_audits_the_key_until_one_passes():
    book = TrustBook(base_rate=0.1)
    for i in range(TRUSTED_AFTER):
        book.passed("k", index=i, rate=None)
    assert book.audit_rate("k") == 0.1
    book.owe("k")  # its start state could not be had: no revocation, and no dodging either
    assert book.audit_rate("k") == 1.0 and not book.is_excluded("k")
    book.passed("k", index=9, rate=None)
    assert book.audit_rate("k") == 0.1


def test_a_second_marginal_audit_before_a_pass_excludes_and_revokes_since_the_last_pass():
    book = TrustBook(base_rate=0.1)
    for i in range(TRUSTED_AFTER):
        book.passed("k", index=i, rate=None)
    assert book.marginal("k") is None  # the first: credit kept, every receipt audited again
    assert book.audit_rate("k") == 1.0 and not book.is_excluded("k")
    book.passed("k", index=8, rate=None)  # a pass in between forgives it
    assert book.audit_rate("k") == 0.1
    assert book.marginal("k") is None
    assert book.marginal("k") == 8 and book.is_excluded("k")  # the second since that pass
    assert book.marginal("k") is None  # excluded once
