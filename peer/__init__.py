"""The volunteer client: CLI, device discovery, workers, round engine, averaging.

Never imports ``aggregator``: peers and operators talk only through the DHT and the records in
``protocol``.
"""
