"""An etcds:// store: etcd over TLS with client certificates (issue 15, item 3's TLS option).
Certificates are made here with the openssl tool; skipped without it or without etcd."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from taiji import env
from taiji.cluster.spec import ClusterConfig, WorkerSpec
from taiji.errors import StoreError

pytestmark = pytest.mark.timeout(120)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(where: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=taiji-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=where,
    )
    for name, usage in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (where / f"{name}.ext").write_text(usage + "\n")
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN=taiji-{name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=where,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.crt",
            cwd=where,
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory):
    if shutil.which("etcd") is None or shutil.which("openssl") is None:
        pytest.skip("needs the etcd server binary (apt-get install -y etcd-server) and openssl")
    pytest.importorskip("etcd3gw")
    where = tmp_path_factory.mktemp("tls")
    _certificates(where)
    port, peer = _free_port(), _free_port()
    client_url = f"https://127.0.0.1:{port}"
    argv = [
        "etcd",
        "--name",
        "tls",
        "--data-dir",
        str(where / "data"),
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls",
        f"http://127.0.0.1:{peer}",
        "--initial-cluster",
        f"tls=http://127.0.0.1:{peer}",
        "--cert-file",
        str(where / "server.crt"),
        "--key-file",
        str(where / "server.key"),
        "--trusted-ca-file",
        str(where / "ca.crt"),
        "--client-cert-auth",
        "--log-level",
        "warn",
    ]
    server = subprocess.Popen(argv, stdout=open(where / "etcd.log", "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:  # ready once it accepts connections on the client port
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((where / "etcd.log").read_text()[-2000:]) from None
                threading.Event().wait(0.1)
        yield where, port
    finally:
        server.kill()
        server.wait(timeout=30)


def _use(monkeypatch, where: Path, *names: str) -> None:
    files = {
        "ca": (env.ETCD_CA, "ca.crt"),
        "cert": (env.ETCD_CERT, "client.crt"),
        "key": (env.ETCD_KEY, "client.key"),
    }
    for var, _ in files.values():
        monkeypatch.delenv(var.name, raising=False)
    for name in names:
        var, file = files[name]
        monkeypatch.setenv(var.name, str(where / file))


def test_an_etcds_store_works_with_the_ca_and_a_client_certificate(tls_etcd, monkeypatch):
    from taiji.cluster.store import JobStore, open_store

    where, port = tls_etcd
    _use(monkeypatch, where, "ca", "cert", "key")
    job = JobStore(open_store(f"etcds://127.0.0.1:{port}", timeout=10), "t")
    job.set("x", "1")
    assert job.get("x") == b"1" and job.add("n", 2) == 2
    stop = threading.Event()
    stream = job.follow_configs(stop)  # the watch stream goes over TLS too
    config = ClusterConfig(1, (WorkerSpec("w0"),))
    assert job.publish(config) and next(stream) == config  # read when the watch begins
    config = ClusterConfig(2, (WorkerSpec("w0"), WorkerSpec("w1")))
    assert job.publish(config) and next(stream) == config  # carried by the watch
    stop.set()


def test_tls_mistakes_are_clear_errors(tls_etcd, monkeypatch):
    from taiji.cluster.store import open_store

    where, port = tls_etcd
    _use(monkeypatch, where)  # no CA: the server's certificate cannot be verified
    with pytest.raises(StoreError, match="TLS handshake failed.*TAIJI_ETCD_CA"):
        open_store(f"etcds://127.0.0.1:{port}", timeout=5)
    _use(monkeypatch, where, "ca")  # the server asks for a client certificate
    with pytest.raises(StoreError, match="TLS handshake failed|TAIJI_ETCD_CERT"):
        open_store(f"etcds://127.0.0.1:{port}", timeout=5)
    with pytest.raises(StoreError, match="serves TLS.*write the store as etcds://"):
        open_store(f"etcd://127.0.0.1:{port}", timeout=5)


def test_tls_flags_are_checked_and_exported_for_the_workers(tmp_path, monkeypatch):
    from taiji.errors import ConfigError
    from taiji.launch.arguments import export_tls_files
    from taiji.launch.parser import build_parser

    for var in (env.ETCD_CA, env.ETCD_CERT, env.ETCD_KEY):
        monkeypatch.delenv(var.name, raising=False)
    parser = build_parser()
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    export_tls_files(
        parser.parse_args(
            ["run", "-np", "1", "--store", "etcds://h:2379", "--etcd-ca", str(ca), "python", "-c", "pass"]
        )
    )
    assert env.ETCD_CA.get() == str(ca.resolve())
    with pytest.raises(ConfigError, match="--etcd-cert .*no such file"):
        export_tls_files(
            parser.parse_args(
                [
                    "join",
                    "j@etcds://h:2379",
                    "--secret-file",
                    "-",
                    "--nproc-per-node",
                    "1",
                    "--host",
                    "10.0.0.2",
                    "--etcd-cert",
                    str(tmp_path / "nope"),
                ]
            )
        )


def test_a_job_trains_and_resizes_on_an_etcds_store(tls_etcd, tmp_path, monkeypatch):
    """`taiji run --store etcds://... --etcd-ca/--etcd-cert/--etcd-key`: the launcher and every
    worker (which inherit the files through the environment) talk TLS; the job grows and trains."""
    from taiji_harness.testing import check_invariants, run_elastic

    where, port = tls_etcd
    _use(monkeypatch, where)  # only the flags say where the files are
    monkeypatch.setenv("TAIJI_HOME", str(tmp_path / "home"))
    flags = [
        "--store",
        f"etcds://127.0.0.1:{port}",
        "--etcd-ca",
        str(where / "ca.crt"),
        "--etcd-cert",
        str(where / "client.crt"),
        "--etcd-key",
        str(where / "client.key"),
        "--max-np",
        "2",
    ]
    done = run_elastic(
        tmp_path,
        1,
        "--steps",
        "120",
        "--sizes",
        "2",
        "--every",
        "10",
        "--step-delay",
        "0.1",
        launcher_args=flags,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"store etcds://127.0.0.1:{port}" in done.stdout
    assert check_invariants(tmp_path, 16)["sizes"] == [1, 2]
