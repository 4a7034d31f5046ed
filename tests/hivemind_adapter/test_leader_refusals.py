"""A peer refused as "not a leader" while it followed is asked again once it leads: four real
averagers on loopback DHT nodes with MANTA's validator, their leader leaving while it gathers."""

from __future__ import annotations

import logging
import threading

import torch
from hivemind.utils import get_dht_time

import hivemind_adapter.allreduce as allreduce_module
from hivemind_adapter.allreduce import VerifiedAverager, cancel_step
from hivemind_adapter.dht import speaker, start_dht, visible_maddrs
from hivemind_adapter.group_keys import DeclarationSigner
from protocol.dht_schema import MantaRecordValidator
from protocol.identity import Identity
from tests.helpers import wait_until
from tests.hivemind_adapter.averager_pair import LOOPBACK, PAIR_SETTINGS

TASK = "refusal-test"
GATHER = 9.0  # each step's wait for its group, from its start
STEP_TIMEOUT = 16.0
WAIT = 10.0  # the bound on each stage of the scene


class _Refusals(logging.Handler):
    """hivemind's matchmaking lines "<peer> - requested <leader> ... rejected with <code>"."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "rejected with" in message:
            self.lines.append(message)

    def refused(self, peer: str, leader: str, code: str) -> bool:
        return any(m.startswith(f"{peer} - requested {leader} ") and code in m for m in list(self.lines))


def _leader_leaves_while_gathering() -> tuple[list[object], set[str]]:
    """Four averagers, the group sought is four. The leader L admits a roster without F. R joins
    L; F asks L (refused: not in its roster) and R (refused: NOT_A_LEADER); then L's step is
    cancelled while it gathers, R leads, and S, starting after that, joins R. Returns the steps'
    outcomes of R, F and S (gathered metadata, or the exception) and their peer ids."""
    validators = [MantaRecordValidator(TASK)]
    dhts = [start_dht(host_maddrs=LOOPBACK, validators=validators)]
    for _ in range(3):
        dhts.append(
            start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(dhts[0]), validators=validators)
        )
    identities = [Identity.generate() for _ in dhts]
    settings = {**PAIR_SETTINGS, "target_group_size": 4, "min_group_size": 2}
    averagers: list[VerifiedAverager] = []
    matchmaking_log = logging.getLogger("hivemind.averaging.matchmaking")
    level, refusals = matchmaking_log.level, _Refusals()
    matchmaking_log.setLevel(logging.DEBUG)
    matchmaking_log.addHandler(refusals)
    try:
        for dht, identity in zip(dhts, identities):
            signer = DeclarationSigner(TASK, speaker(dht, identity))
            averagers.append(
                VerifiedAverager(
                    [torch.ones(64)], dht, prefix=f"{TASK}_cross", declarations=signer, **settings
                )
            )
        leader, follower, refused, late = averagers
        ids = [a.peer_id.to_base58() for a in averagers]
        leader.set_admitted({ids[i]: identities[i].public_key_hex for i in (0, 1, 3)})  # not F's
        outcomes: dict[int, object] = {}

        def step(i: int, gather: float) -> None:
            try:
                outcomes[i] = averagers[i].step(
                    timeout=STEP_TIMEOUT, allow_retries=False, scheduled_time=get_dht_time() + gather
                )
            except Exception as e:  # the outcome under test
                outcomes[i] = e

        control = leader.step(
            timeout=STEP_TIMEOUT, allow_retries=False, wait=False, scheduled_time=get_dht_time() + GATHER - 2
        )
        threads = [threading.Thread(target=step, args=(1, GATHER))]
        threads[0].start()
        wait_until(lambda: follower._matchmaking.current_leader == leader.peer_id, WAIT, "R to follow L")
        threads.append(threading.Thread(target=step, args=(2, GATHER)))
        threads[1].start()
        wait_until(lambda: refusals.refused(ids[2], ids[1], "NOT_A_LEADER"), WAIT, "R to refuse F")
        assert refusals.refused(ids[2], ids[0], "PROTOCOL_VIOLATION"), refusals.lines  # F asked L first
        cancel_step(control)  # L leaves while it gathers
        wait_until(lambda: follower._matchmaking.current_leader is None, WAIT, "R to see L leave")
        threads.append(threading.Thread(target=step, args=(3, GATHER)))
        threads[2].start()
        for thread in threads:
            thread.join(timeout=STEP_TIMEOUT + WAIT)
        assert not any(t.is_alive() for t in threads), "a step did not end within its bounds"
        return [outcomes[i] for i in (1, 2, 3)], set(ids[1:])
    finally:
        matchmaking_log.removeHandler(refusals)
        matchmaking_log.setLevel(level)
        for averager in averagers:
            averager.shutdown()
        for dht in reversed(dhts):
            dht.shutdown()


def test_a_peer_refused_as_not_a_leader_is_asked_again_once_it_leads(monkeypatch):
    """Without asking again, F never returns to R (hivemind asks each leader once per expiration,
    and R's did not change): R's group begins without F, and F's step fails alone."""
    outcomes, members = _leader_leaves_while_gathering()
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    assert all({str(p) for p in o} == members for o in outcomes), outcomes
    monkeypatch.setattr(allreduce_module, "reask_peers_that_were_following", lambda matchmaking: None)
    plain = _leader_leaves_while_gathering()[0]
    assert isinstance(plain[1], Exception), plain  # the split is real: F is left out
    assert len(plain[0]) == 2 and len(plain[2]) == 2, plain
