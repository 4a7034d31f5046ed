"""One peer's record alone cannot set the swarm's round; two peers' can."""

from protocol.corroboration import corroborated_max


def test_a_lone_far_off_value_is_ignored_and_a_corroborated_one_counts():
    honest = [("a", 7), ("b", 7), ("c", 6)]
    assert corroborated_max(honest) == 7
    assert corroborated_max([*honest, ("liar", 10**9)]) == 7
    assert corroborated_max([*honest, ("liar", 10**9), ("liar", 10**9 + 1)]) == 7  # one peer counts once
    assert corroborated_max([*honest, ("d", 8)]) == 7  # a peer alone ahead: seen once a second gets there
    assert corroborated_max([*honest, ("d", 8), ("e", 8)]) == 8
    assert corroborated_max([("only", 3)]) == 3 and corroborated_max([]) == -1
