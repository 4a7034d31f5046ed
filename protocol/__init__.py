"""MANTA's shared, dependency-light foundation.

Wire records, identities and signatures, canonical encoding, the Merkle log math, signed notes and
the DHT schema. Nothing in this package imports torch or hivemind (tests/test_layout.py), so
auditors and tests can use it without the training stack.
"""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "manta-swarm"  # the name MANTA is installed under ("manta" on PyPI is another project)

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
