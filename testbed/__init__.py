"""Developer tooling: local swarms (``manta-swarm``) and the emulated internet they can run on.

- :mod:`testbed.local_swarm` starts an aggregator and peers as the real console scripts;
  :mod:`testbed.runner` runs one swarm from start to summary; :mod:`testbed.churn` kills and starts
  peers on a schedule; :mod:`testbed.summary` and :mod:`testbed.figures` say what the run did.
- :mod:`testbed.wan` builds an emulated internet of sites behind shaped, delayed, lossy links and NAT.

Nothing in ``peer/`` or ``aggregator/`` imports this package: it drives them from outside, as a user.
"""
