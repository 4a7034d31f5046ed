"""The operator side: bootstrap node, task publication, contribution checks, ledger store, rewards,
monitoring.

Never imports ``peer``: operators and volunteers talk only through the DHT and the records in
``protocol``.
"""
