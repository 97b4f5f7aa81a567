"""Network facts decided without the network."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """A loopback address or `localhost`, decided without a DNS lookup (which is network)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
