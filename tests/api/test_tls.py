"""TLS on the client listener and mTLS principals, against real broker processes.

Certificates come from a throwaway CA (:mod:`tests.certs`). One broker asks for client
certificates (``requested``, CN mapping) with auth on; another requires them (DN mapping, as
Kafka's ``ssl.principal.mapping.rules=DEFAULT``). What is checked: HTTPS works and plain HTTP
does not; a verified certificate is the principal when no other credential is sent, and ACLs
judge it; an explicit key wins over the certificate; a certificate from another CA is refused
in the handshake; a WebSocket upgrade carries the certificate's principal too; bad TLS
settings stop ``serve`` with one line.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from auth_quotas.credentials import generate_api_key
from tests import zygote
from tests.certs import CertificateAuthority, Issued
from tests.server import BrokerProcess


@dataclass
class Pki:
    ca: CertificateAuthority
    server: Issued
    alice: Issued
    bob: Issued
    rogue: Issued

    def context(self, client: Issued | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca.path)
        if client is not None:
            context.load_cert_chain(client.cert, client.key)
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority(d)
    rogue_ca = CertificateAuthority(d, "Rogue CA")
    return Pki(
        ca=ca,
        server=ca.issue("broker", server=True),
        alice=ca.issue("alice", org="eng"),
        bob=ca.issue("bob", org="eng"),
        rogue=rogue_ca.issue("alice", org="eng"),
    )


def _tls_args(pki: Pki, client_auth: str, mapping: str) -> list[str]:
    return [
        "--ssl-certfile",
        str(pki.server.cert),
        "--ssl-keyfile",
        str(pki.server.key),
        "--ssl-cafile",
        str(pki.ca.path),
        "--ssl-client-auth",
        client_auth,
        "--ssl-principal-mapping",
        mapping,
    ]


@dataclass
class Tls:
    broker: BrokerProcess
    admin: dict[str, str]


@pytest.fixture(scope="module")
def requested(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    key = generate_api_key().token
    tmp = tmp_path_factory.mktemp("tls-requested")
    args = ["--auth", *_tls_args(pki, "requested", "cn")]
    b = BrokerProcess(tmp / "data", None, *args, env={"LOGBUS_BOOTSTRAP_KEY": key})
    b.tls = pki.context()
    b.start()
    try:
        admin = {"authorization": f"Bearer {key}"}
        r = httpx.post(f"{b.url}/v1/topics", json={"name": "orders"}, headers=admin, verify=b.tls)
        assert r.status_code == 201, r.text
        yield Tls(b, admin)
    finally:
        b.kill()


def test_https_serves_and_plain_http_does_not(requested: Tls, pki: Pki) -> None:
    b = requested.broker
    assert b.url.startswith("https://")
    assert httpx.get(f"{b.url}/healthz", verify=pki.context()).status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{b.port}/healthz", timeout=5)
    # The banner and the broker's advertised URL say https.
    assert f"https://127.0.0.1:{b.port}" in b.log()


def test_a_verified_certificate_is_the_principal(requested: Tls, pki: Pki) -> None:
    b = requested.broker
    with httpx.Client(base_url=b.url, verify=pki.context(pki.alice)) as alice:
        me = alice.get("/v1/whoami").json()
        assert me == {"principal": "User:alice", "method": "mtls", "authenticated": True}
        produce = {"records": [{"value": 1}]}
        r = alice.post("/v1/topics/orders/records", json=produce)
        assert r.status_code == 403 and r.json()["code"] == "TOPIC_AUTHORIZATION_FAILED"
        acl = {
            "principal": "User:alice",
            "resource_type": "topic",
            "name": "orders",
            "operation": "write",
        }
        r = alice.post("/v1/acls", json=acl, headers=requested.admin)  # the key wins
        assert r.status_code == 201, r.text
        r = alice.post("/v1/topics/orders/records", json=produce)
        assert r.status_code == 200, r.text
        assert alice.get("/v1/whoami", headers=requested.admin).json()["method"] == "api_key"
    # No certificate and no key: 401, as before.
    r = httpx.get(f"{b.url}/v1/whoami", verify=pki.context())
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")


def test_a_certificate_of_another_ca_is_refused(requested: Tls, pki: Pki) -> None:
    # TLS 1.3: the client's handshake completes before the broker checks its certificate, so
    # the refusal shows as an alert or a closed connection, never as an answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{requested.broker.url}/v1/whoami", verify=pki.context(pki.rogue), timeout=10)


def test_a_websocket_carries_the_certificates_principal(requested: Tls, pki: Pki) -> None:
    b = requested.broker
    acl = {"principal": "User:bob", "resource_type": "topic", "name": "orders", "operation": "read"}
    r = httpx.post(f"{b.url}/v1/acls", json=acl, headers=requested.admin, verify=pki.context())
    assert r.status_code == 201, r.text
    ws_url = f"wss://127.0.0.1:{b.port}/v1/ws"

    async def subscribe(context: ssl.SSLContext) -> dict[str, object]:
        async with connect(ws_url, ssl=context, open_timeout=10) as ws:
            await ws.send(json.dumps({"op": "subscribe", "topics": ["orders"], "id": 1}))
            answer: dict[str, object] = json.loads(await asyncio.wait_for(ws.recv(), 10))
            return answer

    assert asyncio.run(subscribe(pki.context(pki.bob)))["type"] == "subscribed"
    with pytest.raises(Exception) as refused:  # no certificate, no key: closed with 4401
        asyncio.run(subscribe(pki.context()))
    assert "4401" in str(refused.value)


def test_required_client_auth_and_dn_mapping(pki: Pki, tmp_path: Path) -> None:
    key = generate_api_key().token
    args = ["--auth", *_tls_args(pki, "required", "dn")]
    b = BrokerProcess(tmp_path / "data", None, *args, env={"LOGBUS_BOOTSTRAP_KEY": key})
    b.tls = pki.context(pki.bob)  # the readiness probe needs a certificate too
    b.start()
    try:
        r = httpx.get(f"{b.url}/v1/whoami", verify=pki.context(pki.bob))
        assert r.json()["principal"] == "User:CN=bob,O=eng", r.text
        with pytest.raises(httpx.HTTPError):  # no certificate: no handshake
            httpx.get(f"{b.url}/healthz", verify=pki.context(), timeout=10)
    finally:
        b.kill()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ssl-client-auth", "required"], "ssl_client_auth needs ssl_cafile"),
        (["--ssl-cafile", "/x.pem"], "need ssl_certfile"),
        (["--ssl-certfile", "/nonexistent.pem"], "cannot serve TLS"),
    ],
)
def test_bad_tls_settings_stop_serve_with_one_line(
    args: list[str], message: str, tmp_path: Path
) -> None:
    cmd = ["serve", "--data-dir", str(tmp_path), "--port", "0"]
    done = zygote.run([*cmd, *args], timeout=120)  # forked from the zygote: tests/zygote.py
    assert done.returncode in (1, 2), done
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "metadata.db").exists()


def test_a_tls_cluster_advertises_https_and_forwards_over_it(pki: Pki, tmp_path: Path) -> None:
    """Two brokers serving TLS (clients' certificates required): each advertises https, and an
    admin call made to the broker that is not the controller is forwarded to it over TLS,
    the forwarding broker presenting its own certificate."""
    from tests.cluster.test_cluster_processes import CLUSTER_ENV, eventually

    key = generate_api_key().token
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    env = {**CLUSTER_ENV, "LOGBUS_BOOTSTRAP_KEY": key}
    # Each broker's certificate is also a client certificate of the CA (sign both usages).
    brokers = [
        BrokerProcess(
            tmp_path / f"b{i}",
            None,
            "--broker-id",
            str(i),
            "--metadata-url",
            url,
            "--auth",
            *_tls_args(pki, "required", "cn"),
            env=env,
        )
        for i in (1, 2)
    ]
    admin = {"authorization": f"Bearer {key}"}
    try:
        for b in brokers:
            b.tls = pki.context(pki.alice)
            b.start()
        with httpx.Client(verify=pki.context(pki.alice), headers=admin, timeout=30) as client:

            def both_registered() -> bool | None:
                doc = client.get(f"{brokers[0].url}/v1/cluster").json()
                urls = sorted(b["url"] for b in doc["brokers"])
                return urls == sorted(b.url for b in brokers) or None

            eventually(both_registered, "both brokers advertised with https")
            for i, b in enumerate(brokers):  # one of the two is not the controller: forwarded
                r = client.post(f"{b.url}/v1/topics", json={"name": f"tls{i}"})
                assert r.status_code == 201, r.text
            names = {t["name"] for t in client.get(f"{brokers[1].url}/v1/topics").json()["topics"]}
            assert {"tls0", "tls1"} <= names
    finally:
        for b in brokers:
            b.kill()
