"""An emulated internet on one machine: network namespaces for sites, TAP-device links whose delay,
jitter and loss a relay process adds (no ``netem`` here) and whose rate ``tbf`` shapes, NAT by
iptables, a self-check of every link, and the kernel's own counters of what crossed them.

:mod:`~testbed.wan.scenario` (what to build), :mod:`~testbed.wan.topology` (building and removing it),
:mod:`~testbed.wan.relay` (the wire), :mod:`~testbed.wan.linkcheck` and :mod:`~testbed.wan.probe`
(measuring it), :mod:`~testbed.wan.netns` (the kernel tools), :mod:`~testbed.wan.rates` (tc's units).
"""
