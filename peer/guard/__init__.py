"""What a peer does about dishonest partners: whom its matchmaking admits (:mod:`.admission`), whom it
names, bars, excuses and convicts (:mod:`.peer_guard`), the confirmations groups of three exchange
(:mod:`.partner_checks`), and convictions found late and shared (:mod:`.conviction_watch`). The
averager hands its evidence here; it decides nothing about honesty itself."""
