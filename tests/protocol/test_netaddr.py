"""Initial peers' multiaddrs are checked part by part: real forms pass, nonsense is one line."""

from __future__ import annotations

import pytest

from protocol.netaddr import AddressError, check_peer_multiaddr

QM = "QmSBUfPjhdbT5M2uQ6xHzpfukzPy4zLikVL22vxNhiqVzx"
ED = "12D3KooWD3bfmNbuuuVCYwkjnFt3ukm3qaB3hDED3peHHXawvRAi"


@pytest.mark.parametrize(
    "maddr",
    [
        f"/ip4/203.0.113.7/tcp/31337/p2p/{QM}",
        f"/ip6/2001:db8::1/tcp/31337/p2p/{ED}",
        f"/dns4/bootstrap.example.org/tcp/31337/p2p/{QM}",
        f"/dns/example.org/tcp/443/p2p/{ED}",
        f"/ip4/198.51.100.2/udp/4001/quic-v1/p2p/{ED}",
    ],
)
def test_real_multiaddrs_pass(maddr):
    assert check_peer_multiaddr(f"  {maddr} ") == maddr


@pytest.mark.parametrize(
    "maddr, says",
    [
        (f"/ip4/999.1.1.1/tcp/1/p2p/{QM}", "is not a valid address"),
        (f"/ip4/2001:db8::1/tcp/1/p2p/{QM}", "is not a valid address"),
        (f"/dns4/-bad-.org/tcp/1/p2p/{QM}", "is not a valid address"),
        (f"/foo/1.2.3.4/tcp/1/p2p/{QM}", "is not a valid address"),
        (f"/ip4/1.2.3.4/tcp/0/p2p/{QM}", "port 1..65535"),
        (f"/ip4/1.2.3.4/tcp/http/p2p/{QM}", "port 1..65535"),
        (f"/ip4/1.2.3.4/udp/1/p2p/{QM}", "needs /quic-v1"),
        ("/ip4/1.2.3.4/tcp/1/p2p/not-a-peer-id", "must end in /p2p/PEER_ID"),
        (f"/ip4/1.2.3.4/tcp/1/ipfs/{QM}", "must end in /p2p/PEER_ID"),
        (f"/ip4/1.2.3.4/tcp/1/p2p/{QM}/extra", "must end in /p2p/PEER_ID"),
        ("1.2.3.4:31337", "must look like"),
    ],
)
def test_nonsense_is_one_line(maddr, says):
    with pytest.raises(AddressError, match=says) as err:
        check_peer_multiaddr(maddr)
    assert "\n" not in str(err.value)
