"""`--metrics-port`: serve a process's metric families (metrics/prometheus.py) over HTTP with the
official ``prometheus_client``, bound to the address given (loopback by default).

The client is the optional extra ``taiji[metrics]``: imported only when a port is asked for. Each
scrape calls ``collect()`` on the client's server thread; what it reads (the driver's snapshot,
a tally) is replaced whole by its owner, never mutated in place.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cluster import controller as ctl
from ..errors import ConfigError, LaunchError
from ..metrics.prometheus import COUNTER, Family, Tally, job_families

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricsConfig:
    port: int
    host: str = "127.0.0.1"


def _client() -> Any:
    try:
        import prometheus_client
        from prometheus_client import core, registry
    except ImportError:
        raise ConfigError(
            "--metrics-port needs the prometheus_client package: pip install 'taiji[metrics]'"
        ) from None
    return prometheus_client, core, registry


class MetricsServer:
    """An HTTP server answering ``/metrics`` with ``collect()``'s families."""

    def __init__(self, cfg: MetricsConfig, collect: Callable[[], list[Family]]):
        client, core, registry = _client()
        self.cfg, self._collect, self._core = cfg, collect, core
        self.registry = registry.CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        try:
            self._server, self._thread = client.start_http_server(
                cfg.port, addr=cfg.host, registry=self.registry
            )
        except OSError as exc:
            raise LaunchError(
                f"--metrics-port {cfg.port}: cannot listen on {cfg.host}:{cfg.port} ({exc.strerror or exc}); "
                "choose a free port"
            ) from None
        self.port = self._server.server_address[1]
        log.info("serving Prometheus metrics on http://%s:%d/metrics", cfg.host, self.port)

    def collect(self):  # the client's Collector protocol
        for fam in self._collect():
            if fam.kind == COUNTER:
                metric = self._core.CounterMetricFamily(fam.name, fam.help, labels=_label_names(fam))
            else:
                metric = self._core.GaugeMetricFamily(fam.name, fam.help, labels=_label_names(fam))
            for labels, value in fam.samples:
                metric.add_metric([v for _, v in labels], value)
            yield metric

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(2.0)


def _label_names(fam: Family) -> list[str]:
    return [k for k, _ in fam.samples[0][0]] if fam.samples else []


class JobExporter:
    """A launcher's metrics: the driver's snapshot plus a tally of its controller's actions."""

    def __init__(self, snapshot: Callable[[], dict]):
        self._snapshot = snapshot
        self._tally = Tally()
        self._lock = threading.Lock()

    def on_actions(self, actions: list[ctl.Action]) -> None:
        """The driver's hook: called with each ``decide``'s actions, on the driver's thread."""
        tally = self._tally
        for action in actions:
            if isinstance(action, ctl.Publish):
                tally = tally.published(action.reason)
            elif isinstance(action, ctl.Kill):
                tally = tally.killed(action.id, action.reason)
        with self._lock:
            self._tally = tally

    def families(self) -> list[Family]:
        with self._lock:
            tally = self._tally
        return job_families(self._snapshot(), tally)


def add_flags(parser: Any) -> None:
    """``--metrics-port`` / ``--metrics-host`` on a command that serves metrics."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on this port (needs taiji[metrics]; 0: a free port)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="the address the metrics port listens on (default: %(default)s)",
    )


def config_of(args: Any) -> MetricsConfig | None:
    """The parsed flags as a MetricsConfig (None without ``--metrics-port``)."""
    if args.metrics_port is None:
        return None
    if not 0 <= args.metrics_port < 65536:
        raise ConfigError(f"--metrics-port must be in 0..65535, got {args.metrics_port}")
    _client()  # the extra is missing: say so before anything starts
    return MetricsConfig(args.metrics_port, args.metrics_host)
