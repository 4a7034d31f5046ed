"""The aggregator's training monitor: a live web dashboard, a read-only JSON API and Prometheus metrics.

Peers already publish signed :class:`~protocol.records.PeerProgress` records (about once a second
while computing a round, once more at its end) and signed announcements in the DHT. The monitor reads
them (:mod:`.swarm_reader`, re-verifying every signature), keeps per-round aggregates
(:mod:`.collector`), evaluates new checkpoints on the validation set (:mod:`.evaluation`), reads the
contribution ledger (:mod:`.ledger_view`) and serves all of it over HTTP (:mod:`.app`, :mod:`.server`,
:mod:`.metrics`, ``static/``). :class:`~aggregator.monitor.service.Monitor` ties the parts together
for :class:`aggregator.bootstrap.BootstrapAggregator`.

Nothing here changes state: the HTTP side answers GET (and HEAD) only, and the ledger is opened
read-only.
"""
