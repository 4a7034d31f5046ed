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


def test_a_lone_reporter_among_a_larger_swarm_does_not_stand():
    assert corroborated_max([("liar", 10**9)], lone_stands=False) == -1
    assert corroborated_max([("liar", 10**9), ("liar", 10**9 + 1)], default=5, lone_stands=False) == 5
    assert corroborated_max([("a", 7), ("liar", 10**9)], lone_stands=False) == 7  # two reporters: as before
