"""Which hosts are this machine: the server refuses to listen elsewhere without an API key, and the
load test refuses to aim anywhere else."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
