"""Join requests of a peer that only follows (client mode, or a broadcast's receiver), made
acceptable to any leader whose gathering ends before the follower's own search does.

A hivemind leader refuses a join request whose expiration (when the follower wants its all-reduce
to begin) comes before its own: among peers that may lead, the one whose wait ends first leads, and
no cycle of waits forms. A follower sends the end of its own gathering wait, so one that started
its step before the only leader is refused by it, and hivemind asks each (leader, expiration) only
once: the follower stays out of the group until the leader's wait ends (seen: a client peer left
out of a top group of three). A peer that never leads can begin whenever its search lasts, so that
is the expiration it sends.
"""

from __future__ import annotations

from math import isfinite


def followers_ask_until_their_search_ends(matchmaking) -> None:
    """Make ``matchmaking`` (hivemind's, on the averager's loop) send, while it only follows, the
    end of its search as its join requests' expiration; as a peer that may lead, hivemind's own."""
    plain = matchmaking.get_request_expiration_time

    def request_expiration_time() -> float:
        search_end = matchmaking.potential_leaders.search_end_time
        if matchmaking.client_mode and isfinite(search_end):
            return search_end
        return plain()

    matchmaking.get_request_expiration_time = request_expiration_time
