#!/usr/bin/env bash
# The system tools the emulated-internet tests use beyond a stock Debian image: iptables (NAT and
# traffic accounting in the testbed's namespaces). Installed only as root and only when missing;
# without root the testbed's tests skip themselves (they need root for network namespaces anyway).
set -euo pipefail
command -v iptables >/dev/null && exit 0
if [[ $(id -u) != 0 ]]; then
  echo "manta: iptables is missing and this is not root; the emulated-internet tests will be skipped"
  exit 0
fi
echo "manta: installing iptables (apt-get) for the emulated-internet tests"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q iptables >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q iptables >/dev/null; }
