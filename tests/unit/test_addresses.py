"""Which address workers advertise (issue 15 item 1): --ifname, and GLOO_SOCKET_IFNAME honoured."""

import pytest

from taiji.comm.addresses import gloo_device, interface_address
from taiji.errors import ConfigError
from taiji.launch.arguments import parse_run
from taiji.launch.parser import build_parser


def test_an_interface_resolves_to_its_ipv4_address():
    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(ConfigError, match="no network interface 'nope0'.*interfaces: \\[.*'lo'"):
        interface_address("nope0")


def test_gloo_socket_ifname_wins_over_the_advertised_host(monkeypatch):
    """gloo ignores GLOO_SOCKET_IFNAME on the constructor path taiji uses: taiji must read it."""
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with pytest.raises(RuntimeError, match="10.255.255.1"):
        gloo_device("10.255.255.1")  # not an address of this host
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert gloo_device("10.255.255.1") is not None


def test_run_takes_host_or_ifname_not_both(capsys):
    parser = build_parser()
    assert (
        parse_run(parser.parse_args(["run", "-np", "1", "--ifname", "lo", "python", "-c", "pass"])).host
        == "127.0.0.1"
    )
    assert parse_run(parser.parse_args(["run", "-np", "1", "python", "-c", "pass"])).host == "127.0.0.1"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "-np", "1", "--host", "127.0.0.1", "--ifname", "lo", "python"])
    assert "not allowed with argument" in capsys.readouterr().err
