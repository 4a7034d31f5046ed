"""The one place that knows hivemind's internals.

- :mod:`.dht`: start a node, store, and read signed records with bounded waits;
- :mod:`.p2p`: :class:`~hivemind_adapter.p2p.Endpoint`, byte-in/byte-out calls between nodes;
- :mod:`.paged_blobs`, :mod:`.state_archive`: blobs and committed states served in pages, by digest;
- :mod:`.allreduce`: the exact, all-or-nothing all-reduce the averaging hierarchy is built on;
- :mod:`.event_loop`, :mod:`.runtime`, :mod:`.reaper`: the background loop, process set-up and the
  reaper that takes hivemind's child processes down with their parent.

Everything else in MANTA imports hivemind only through here (tests/test_layout.py).
"""
