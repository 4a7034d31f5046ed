"""How one averaging attempt's result becomes the swarm's: every participant posts a
:class:`~peer.commit.report.CommitReport` on a board (:mod:`.boards`), and a result commits once the
peers that posted it are a strict majority of the roster (:mod:`.quorum`). :mod:`.waits` waits for
that on the board; :class:`~peer.commit.committer.RoundCommitter` owns a peer's side of it: what it
posts, its waits, settling after a failed attempt, late commits and the attempt counter."""
