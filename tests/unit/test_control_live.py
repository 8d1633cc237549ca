"""The --live harness of benchmarks/control_scale.py: its pure parts, and one small real run
(the real launcher, simulated hosts, a real store) that must finish in well under a minute."""

import os
import shutil
import time

import pytest

from taiji_harness import control_live as live


def test_plan_hosts_gives_the_launcher_one_host_of_slots():
    assert live.plan_hosts(1024) == [8] * 127
    assert live.plan_hosts(16) == [8]
    with pytest.raises(ValueError):
        live.plan_hosts(20)
    with pytest.raises(ValueError):
        live.plan_hosts(8)


def test_host_addresses_are_distinct():
    addresses = {live.host_address(i) for i in range(600)}
    assert len(addresses) == 600 and all(a.startswith("127.1.") for a in addresses)


def test_etcd_ops_counts_unary_calls_and_stream_messages_only():
    text = "\n".join(
        [
            "# HELP grpc_server_handled_total Total number of RPCs completed on the server",
            'grpc_server_handled_total{grpc_code="OK",grpc_method="Range",grpc_service="etcdserverpb.KV",'
            'grpc_type="unary"} 120',
            'grpc_server_handled_total{grpc_code="OK",grpc_method="Txn",grpc_service="etcdserverpb.KV",'
            'grpc_type="unary"} 3.5e+01',
            'grpc_server_handled_total{grpc_code="OK",grpc_method="Watch",grpc_service="etcdserverpb.Watch",'
            'grpc_type="bidi_stream"} 9',
            'grpc_server_msg_sent_total{grpc_method="Watch",grpc_service="etcdserverpb.Watch",'
            'grpc_type="bidi_stream"} 40',
            'grpc_server_msg_sent_total{grpc_method="Range",grpc_service="etcdserverpb.KV",'
            'grpc_type="unary"} 120',
            'grpc_server_started_total{grpc_method="Range",grpc_service="etcdserverpb.KV",'
            'grpc_type="unary"} 121',
        ]
    )
    assert live.etcd_ops(text) == 120 + 35 + 40


def test_cpu_seconds_reads_utime_and_stime_past_a_command_with_spaces():
    fields = ["S"] + ["0"] * 10 + [str(3 * live.CLK_TCK), str(live.CLK_TCK)] + ["0"] * 30
    assert live.cpu_seconds("4242 (python -m x) " + " ".join(fields)) == pytest.approx(4.0)


def test_store_address_from_the_launchers_first_line():
    line = "taiji: job j: 16 worker(s) (min 1, max 136), store {}, command: python -m x"
    assert live.store_address(line.format("127.0.0.1:4000")) == "tcp://127.0.0.1:4000"
    assert live.store_address(line.format("etcd://127.0.0.1:2379")) == "etcd://127.0.0.1:2379"
    assert live.store_address("taiji: resize with `taiji resize`") is None


def test_rows_are_named_as_the_issue_asks_and_growth_is_per_store():
    results = [
        {
            "store": "tcp",
            "workers": 64,
            "hosts": 7,
            "loss_s": 0.2,
            "ops_per_s": 1000.0,
            "grow_s": 3.0,
            "launcher_cpu": 0.1,
            "grown": 128,
        },
        {
            "store": "tcp",
            "workers": 256,
            "hosts": 31,
            "loss_s": 0.5,
            "ops_per_s": 4000.0,
            "grow_s": 5.0,
            "launcher_cpu": 0.3,
            "grown": 128,
        },
        {
            "store": "etcd",
            "workers": 64,
            "hosts": 7,
            "loss_s": 2.0,
            "ops_per_s": 150.0,
            "grow_s": None,
            "launcher_cpu": 0.1,
            "grown": 128,
            "error": "not every simulated worker reached a config of 184",
        },
    ]
    from taiji_harness.bench import contract_row

    rows = live.rows(results, {64: {"loss_s": 3.0, "ops_per_s": 10.0}}, contract_row)
    cases = [r["case"] for r in rows]
    assert "host loss → every simulated worker on the new config, tcp, 64 workers (s)" in cases
    assert "store ops/s at steady state, tcp, 256 workers" in cases
    assert rows[0]["anchor"] == 3.0 and rows[4]["anchor"] is None
    assert "grow of 128 workers → every simulated worker on the new config, tcp, 64 workers (s)" in cases
    assert rows[-2]["taiji"] is None  # a phase that did not end: no figure, the others kept
    assert live.growth(results, "ops_per_s") == {"tcp": 4.0}
    assert "grow of 128 —" in live.summary(results[-1]) and "184" in live.summary(results[-1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", ["tcp", "etcd"])
def test_a_small_live_run_measures_every_figure(store):
    if store == "etcd" and shutil.which("etcd") is None:
        pytest.skip("no etcd binary (make etcd)")
    began = time.monotonic()
    r = live.measure(store, 6, window=1.0, sim_procs=1, grow_hosts=1, per_host=2)
    assert r["workers"] == 6 and r["hosts"] == 2 and r["grown"] == 2
    assert 0 < r["loss_s"] < 30 and 0 < r["grow_s"] < 60 and 0 < r["start_s"] < 60
    assert r["ops_per_s"] > 0 and r["launcher_cpu"] > 0
    assert (r["etcd_cpu"] is not None) == (store == "etcd")
    assert time.monotonic() - began < 110, os.getloadavg()
