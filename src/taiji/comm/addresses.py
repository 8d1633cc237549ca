"""Which address a worker advertises and listens on (docs/design.md#data-plane,
docs/reference/many-hosts-notes.md#addresses).

gloo's default device resolves the machine's hostname, which is often 127.0.0.1 or 127.0.1.1:
peers on other hosts are then refused. taiji therefore always names the device: by the
interface in ``GLOO_SOCKET_IFNAME`` when it is set (gloo honours that variable only in a
constructor taiji does not use, so it is read here), else by the IP the worker advertises.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from typing import Any

from .. import env
from ..errors import ConfigError

_SIOCGIFADDR = 0x8915  # Linux: the interface's IPv4 address


def interface_address(ifname: str) -> str:
    """The IPv4 address of network interface ``ifname`` (``taiji run --ifname``)."""
    names = [name for _, name in socket.if_nameindex()]
    if ifname not in names:
        raise ConfigError(f"no network interface {ifname!r} on this host (interfaces: {names})")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
        except OSError as exc:
            raise ConfigError(f"network interface {ifname!r} has no IPv4 address: {exc}") from None
    return socket.inet_ntoa(packed[20:24])


def gloo_device(host: str) -> Any:
    """The gloo device a worker's groups use: ``GLOO_SOCKET_IFNAME``'s interface, else ``host``."""
    import torch.distributed as dist  # here: `taiji run --ifname` resolves addresses without torch

    ifname = env.GLOO_SOCKET_IFNAME.get()
    if ifname:
        return dist.ProcessGroupGloo.create_device(interface=ifname)
    return dist.ProcessGroupGloo.create_device(hostname=host)
