"""Once-for-all elastic supernets, sub-network configs, export, FLOPs and latency, search.

No networking here: everything in this package runs the same in a test, a peer or a search job.
"""
