"""Serving /metrics securely from an exporter-toolkit web-config.yml: TLS, client certificates,
basic auth with bcrypt, clear errors, and re-reading the file when it changes.

Certificates are made per test session with the openssl command line tool."""

from __future__ import annotations

import base64
import logging
import shutil
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from gpumon.collect.store import SnapshotStore
from gpumon.http.limits import HttpLimits
from gpumon.http.server import MetricsServer
from gpumon.http.tls import HTTP_ON_HTTPS_RESPONSE
from gpumon.http.webconfig import WebConfig, WebConfigError, parse_duration_seconds
from gpumon.http.webconfig_watcher import WebConfigWatcher
from tests.helpers import DaemonProcess, RenderedBytes, examples, free_port, run_cli, wait_for
from tests.pki import OPENSSL, Pki
from tests.prometheus_helpers import needs_prometheus, run_prometheus

pytestmark = pytest.mark.skipif(OPENSSL is None, reason="openssl command not installed (Debian package: openssl)")


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def write_web_config(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def tls_doc(pki: Pki, **extra: Any) -> dict[str, Any]:
    return {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **extra}}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], tuple[str, WebConfigWatcher, Path]]]:
    """Start gpumon's MetricsServer with a web config built from the given document.

    Returns (https or http base URL, watcher, web-config path). The watcher re-checks the
    files on every request so that tests see changes at once.
    """
    servers: list[MetricsServer] = []

    def start(doc: dict[str, Any]) -> tuple[str, WebConfigWatcher, Path]:
        path = write_web_config(tmp_path / "web-config.yml", doc)
        watcher = WebConfigWatcher(path, check_interval_seconds=0.0)
        registry = CollectorRegistry()
        Gauge("gpumon_test_up", "a test series", registry=registry).set(1)
        server = MetricsServer(
            ("127.0.0.1", 0),
            RenderedBytes(lambda: generate_latest(registry)),
            SnapshotStore(),
            stale_after_seconds=5,
            web_config=watcher,
        )
        server.start()
        servers.append(server)
        scheme = "https" if watcher.ssl_context() is not None else "http"
        return f"{scheme}://127.0.0.1:{server.port}", watcher, path

    yield start
    for server in servers:
        server.stop()


# --- what a scraper sees --------------------------------------------------------------------------


def test_https_with_basic_auth_serves_metrics_and_configured_headers(serve: Any, pki: Pki) -> None:
    doc = tls_doc(pki) | {
        "basic_auth_users": {"prometheus": bcrypt_hash("s3cret")},
        "http_server_config": {"headers": {"X-Frame-Options": "deny", "X-Content-Type-Options": "nosniff"}},
    }
    url, _, _ = serve(doc)
    assert url.startswith("https://")
    response = requests.get(url + "/metrics", auth=("prometheus", "s3cret"), verify=str(pki.ca), timeout=5)
    assert response.status_code == 200
    assert "gpumon_test_up 1.0" in response.text
    assert response.headers["X-Frame-Options"] == "deny"
    assert response.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize(
    "auth",
    [("prometheus", "wrong"), ("nobody", "s3cret"), None],
    ids=["wrong password", "unknown user", "no credentials"],
)
def test_bad_credentials_get_401_with_www_authenticate(serve: Any, pki: Pki, auth: tuple[str, str] | None) -> None:
    url, _, _ = serve(tls_doc(pki) | {"basic_auth_users": {"prometheus": bcrypt_hash("s3cret")}})
    response = requests.get(url + "/metrics", auth=auth, verify=str(pki.ca), timeout=5)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Basic")
    assert "gpumon_test_up" not in response.text


def test_plain_http_against_tls_port_gets_a_clear_400(serve: Any, pki: Pki) -> None:
    url, _, _ = serve(tls_doc(pki))
    response = requests.get(url.replace("https://", "http://") + "/metrics", timeout=5)
    assert response.status_code == 400
    assert response.text == "Client sent an HTTP request to an HTTPS server.\n"


def test_plain_http_400_is_sent_before_the_connection_closes(serve: Any, pki: Pki) -> None:
    url, _, _ = serve(tls_doc(pki))
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: curl\r\nAccept: */*\r\n\r\n")
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    assert received == HTTP_ON_HTTPS_RESPONSE


def test_without_tls_section_serves_plain_http(serve: Any) -> None:
    url, watcher, _ = serve({"basic_auth_users": {"u": bcrypt_hash("p")}})
    assert url.startswith("http://")
    assert watcher.ssl_context() is None
    assert requests.get(url + "/metrics", auth=("u", "p"), timeout=5).status_code == 200
    assert requests.get(url + "/metrics", auth=("u", "x"), timeout=5).status_code == 401


def test_required_client_certificate_missing_fails_the_handshake(serve: Any, pki: Pki) -> None:
    url, _, _ = serve(
        tls_doc(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca)),
    )
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        requests.get(url + "/metrics", verify=str(pki.ca), timeout=5)
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        requests.get(url + "/metrics", verify=str(pki.ca), cert=(str(pki.stranger_cert), str(pki.stranger_key)))
    ok = requests.get(url + "/metrics", verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)))
    assert ok.status_code == 200


def test_client_allowed_sans_rejects_other_names(serve: Any, pki: Pki) -> None:
    url, _, _ = serve(
        tls_doc(
            pki,
            client_auth_type="RequireAndVerifyClientCert",
            client_ca_file=str(pki.ca),
            client_allowed_sans=["grafana.example"],
        )
    )
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(url + "/metrics", verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)))


def test_a_silent_client_does_not_block_others(serve: Any, pki: Pki) -> None:
    url, _, _ = serve(tls_doc(pki))
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)):  # connects, never says anything
        response = requests.get(url + "/metrics", verify=str(pki.ca), timeout=5)
    assert response.status_code == 200


def test_tls_versions_below_min_version_are_refused(serve: Any, pki: Pki) -> None:
    url, _, _ = serve(tls_doc(pki, min_version="TLS13"))
    port = int(url.rsplit(":", 1)[1])
    client = ssl.create_default_context(cafile=str(pki.ca))
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, pytest.raises(ssl.SSLError):
        client.wrap_socket(raw, server_hostname="127.0.0.1")


# --- re-reading the file ----------------------------------------------------------------------------


def test_changed_password_hash_takes_effect_without_restart(serve: Any, pki: Pki) -> None:
    doc = tls_doc(pki) | {"basic_auth_users": {"prometheus": bcrypt_hash("old")}}
    url, _, path = serve(doc)
    get = lambda pw: requests.get(url + "/metrics", auth=("prometheus", pw), verify=str(pki.ca), timeout=5)  # noqa: E731
    assert get("old").status_code == 200
    write_web_config(path, tls_doc(pki) | {"basic_auth_users": {"prometheus": bcrypt_hash("new")}})
    wait_for(lambda: get("new").status_code == 200, 5, what="the new password to work")
    assert get("old").status_code == 401


def test_renewed_certificate_is_served_to_new_connections(serve: Any, pki: Pki, tmp_path: Path) -> None:
    cert, key = tmp_path / "live.crt", tmp_path / "live.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    url, _, _ = serve({"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}})
    port = int(url.rsplit(":", 1)[1])

    def served_cert() -> bytes:
        return ssl.get_server_certificate(("127.0.0.1", port), timeout=5).encode()

    assert served_cert().strip() == pki.server_cert.read_bytes().strip()
    shutil.copy(pki.other_server_key, key)
    shutil.copy(pki.other_server_cert, cert)
    wait_for(lambda: served_cert().strip() == pki.other_server_cert.read_bytes().strip(), 5, what="the new cert")


def test_invalid_new_file_keeps_the_old_config_and_logs_every_problem(
    serve: Any, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    url, watcher, path = serve(tls_doc(pki) | {"basic_auth_users": {"prometheus": bcrypt_hash("pw")}})
    path.write_text("basic_auth_users:\n  prometheus: plaintext\ntls_server_config:\n  cert_file: /nope.crt\n")
    with caplog.at_level(logging.ERROR, logger="gpumon.http"):
        assert watcher.reload() is False
        response = requests.get(url + "/metrics", auth=("prometheus", "pw"), verify=str(pki.ca), timeout=5)
    assert response.status_code == 200
    assert "keeping the previous one" in caplog.text
    assert "not a bcrypt hash" in caplog.text
    assert "/nope.crt" in caplog.text


def test_watcher_checks_files_at_most_every_interval(tmp_path: Path) -> None:
    now = [0.0]
    path = write_web_config(tmp_path / "w.yml", {"basic_auth_users": {"a": bcrypt_hash("1")}})
    watcher = WebConfigWatcher(path, check_interval_seconds=5.0, clock=lambda: now[0])
    write_web_config(path, {"basic_auth_users": {"b": bcrypt_hash("2")}})
    assert set(watcher.current().basic_auth_users) == {"a"}
    now[0] = 5.0
    assert set(watcher.current().basic_auth_users) == {"b"}


# --- validation --------------------------------------------------------------------------------------


def test_missing_certificate_is_reported_by_name(tmp_path: Path) -> None:
    path = write_web_config(
        tmp_path / "w.yml", {"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}
    )
    with pytest.raises(WebConfigError) as err:
        WebConfig.load(path)
    text = "\n".join(err.value.problems)
    assert f"cert_file '{tmp_path / 'missing.crt'}': no such file" in text
    assert f"key_file '{tmp_path / 'missing.key'}': no such file" in text


def test_a_huge_bad_value_is_quoted_cut_short_so_the_problem_stays_one_readable_line(tmp_path: Path, pki: Pki) -> None:
    # found by the property test: a max_version thousands of characters long was echoed whole
    huge = "9" * 5000 + "TLS13"
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), "max_version": huge}
    path = write_web_config(tmp_path / "w.yml", {"tls_server_config": tls, "basic_auth_users": {"x" * 3000: "h"}})
    with pytest.raises(WebConfigError) as err:
        WebConfig.load(path)
    (version,) = [p for p in err.value.problems if "max_version" in p]
    assert version.endswith("TLS13' is not one of TLS10, TLS11, TLS12, TLS13") and "9999...9999" in version
    assert all(len(p) < 400 for p in err.value.problems), [len(p) for p in err.value.problems]


def test_every_problem_is_listed_at_once(tmp_path: Path, pki: Pki) -> None:
    path = write_web_config(
        tmp_path / "w.yml",
        {
            "tls_server_config": {
                "cert_file": str(pki.server_cert),
                "key_file": str(pki.client_key),
                "client_auth_type": "Sometimes",
                "min_version": "TLS9",
                "cipher_suites": ["TLS_RSA_WITH_RC4_128_SHA"],
            },
            "http_server_config": {"headers": {"X-Frame-Options": "allow", "Server": "x"}},
            "basic_auth_users": {"admin": "hunter2"},
            "tls_config": {},
        },
    )
    with pytest.raises(WebConfigError) as err:
        WebConfig.load(path)
    text = "\n".join(err.value.problems)
    for expected in (
        "unknown key 'tls_config'",
        "client_auth_type 'Sometimes' is not one of NoClientCert",
        "min_version 'TLS9'",
        "unknown or insecure suite 'TLS_RSA_WITH_RC4_128_SHA'",
        "X-Frame-Options must be one of deny, sameorigin",
        "'Server' cannot be set",
        "basic_auth_users.admin: not a bcrypt hash",
    ):
        assert expected in text, text
    assert len(err.value.problems) == 7


def test_key_not_matching_the_certificate_is_reported(tmp_path: Path, pki: Pki) -> None:
    path = write_web_config(tmp_path / "w.yml", tls_doc(pki) | {})
    doc = yaml.safe_load(path.read_text())
    doc["tls_server_config"]["key_file"] = str(pki.client_key)
    write_web_config(path, doc)
    with pytest.raises(WebConfigError, match=r"cannot use certificate .* key values mismatch"):
        WebConfig.load(path)


def test_unreadable_key_is_reported(tmp_path: Path, pki: Pki) -> None:
    key = tmp_path / "server.key"
    shutil.copy(pki.server_key, key)
    key.chmod(0)
    if _can_read(key):
        pytest.skip("running as root: file modes do not stop reads")
    path = write_web_config(
        tmp_path / "w.yml", {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(key)}}
    )
    with pytest.raises(WebConfigError, match=r"key_file .*: not readable by this user"):
        WebConfig.load(path)


def test_key_that_is_not_a_key_is_reported(tmp_path: Path, pki: Pki) -> None:
    key = tmp_path / "server.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    path = write_web_config(
        tmp_path / "w.yml", {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(key)}}
    )
    with pytest.raises(WebConfigError, match=f"cannot use certificate '{pki.server_cert}' with key '{key}'"):
        WebConfig.load(path)


def _can_read(path: Path) -> bool:
    try:
        path.read_bytes()
    except PermissionError:
        return False
    return True


@pytest.mark.parametrize(
    ("tls", "problem"),
    [
        ({"client_auth_type": "RequireAndVerifyClientCert"}, "needs client_ca_file"),
        ({"client_auth_type": "NoClientCert", "client_ca_file": "CA"}, "client_auth_type is NoClientCert"),
        ({"client_allowed_sans": ["a"], "client_auth_type": "VerifyClientCertIfGiven", "client_ca_file": "CA"},
         "client_allowed_sans needs client_auth_type"),
        ({"min_version": "TLS13", "max_version": "TLS12"}, "min_version is above max_version"),
    ],
)  # fmt: skip
def test_inconsistent_client_auth_settings(tmp_path: Path, pki: Pki, tls: dict[str, Any], problem: str) -> None:
    tls = {k: (str(pki.ca) if v == "CA" else v) for k, v in tls.items()}
    path = write_web_config(tmp_path / "w.yml", tls_doc(pki, **tls))
    with pytest.raises(WebConfigError, match=problem):
        WebConfig.load(path)


def test_inline_certificate_and_key(tmp_path: Path, pki: Pki) -> None:
    path = write_web_config(
        tmp_path / "w.yml",
        {"tls_server_config": {"cert": pki.server_cert.read_text(), "key": pki.server_key.read_text()}},
    )
    assert WebConfig.load(path).context is not None


def test_relative_paths_resolve_next_to_the_web_config(tmp_path: Path, pki: Pki) -> None:
    shutil.copy(pki.server_cert, tmp_path / "s.crt")
    shutil.copy(pki.server_key, tmp_path / "s.key")
    path = write_web_config(tmp_path / "w.yml", {"tls_server_config": {"cert_file": "s.crt", "key_file": "s.key"}})
    config = WebConfig.load(path)
    assert config.tls is not None and config.tls.cert_file == tmp_path / "s.crt"
    assert tmp_path / "s.key" in config.watched_files()


def test_tls_section_without_certificate_means_plain_http(tmp_path: Path) -> None:
    path = write_web_config(tmp_path / "w.yml", {"tls_server_config": {"min_version": "TLS12"}})
    assert WebConfig.load(path).tls is None


def test_shipped_example_web_config_is_valid_apart_from_its_certificate_paths() -> None:
    example = Path(__file__).resolve().parent.parent / "deploy" / "web-config.example.yml"
    with pytest.raises(WebConfigError) as err:
        WebConfig.load(example)
    assert all("no such file" in p for p in err.value.problems), err.value.problems


def test_rate_limit_answers_with_a_token_bucket(tmp_path: Path) -> None:
    now = [0.0]
    path = write_web_config(tmp_path / "w.yml", {"rate_limit": {"interval": "1s", "burst": 2}})
    watcher = WebConfigWatcher(path, check_interval_seconds=3600, clock=lambda: now[0])
    assert [watcher.allow_request() for _ in range(3)] == [True, True, False]
    now[0] = 1.0
    assert watcher.allow_request() is True


# --- parsers under arbitrary input --------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_watcher(tmp_path_factory: pytest.TempPathFactory) -> WebConfigWatcher:
    path = tmp_path_factory.mktemp("auth") / "w.yml"
    return WebConfigWatcher(write_web_config(path, {"basic_auth_users": {"prometheus": bcrypt_hash("s3cret")}}))


@settings(max_examples=examples(200), deadline=None)
@given(header=st.text())
def test_authorization_header_parsing_never_raises(auth_watcher: WebConfigWatcher, header: str) -> None:
    assert auth_watcher.check_basic_auth(header) in (True, False)


@settings(max_examples=examples(40), deadline=None)
@given(user=st.text(min_size=1).filter(lambda u: ":" not in u), password=st.text(max_size=20))
def test_basic_auth_round_trip(auth_watcher: WebConfigWatcher, user: str, password: str) -> None:
    header = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    assert auth_watcher.check_basic_auth(header) == (user == "prometheus" and password == "s3cret")


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
    )
)
def test_any_document_is_accepted_or_rejected_with_problems(doc: Any) -> None:
    try:
        WebConfig.from_mapping(doc, Path("/nonexistent/web-config.yml"))
    except WebConfigError as exc:
        assert exc.problems and all(isinstance(p, str) for p in exc.problems)


@given(st.lists(st.tuples(st.integers(0, 999), st.sampled_from(["h", "m", "s", "ms", "us", "ns"])), min_size=1))
def test_duration_parser(parts: list[tuple[int, str]]) -> None:
    unit = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    text = "".join(f"{n}{u}" for n, u in parts)
    assert parse_duration_seconds(text) == pytest.approx(sum(n * unit[u] for n, u in parts))
    assert parse_duration_seconds(text + "x") is None


# --- a real Prometheus scraping over TLS with basic auth ---------------------------------------------------


@needs_prometheus
@pytest.mark.integration
def test_real_prometheus_scrapes_over_tls_with_basic_auth_and_client_cert(serve: Any, pki: Pki, tmp_path: Path) -> None:
    doc = tls_doc(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca)) | {
        "basic_auth_users": {"prometheus": bcrypt_hash("s3cret")}
    }
    url, _, _ = serve(doc)
    target = url.removeprefix("https://")
    tls_config = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    jobs = [
        {"job_name": "good", "scheme": "https", "tls_config": tls_config,
         "basic_auth": {"username": "prometheus", "password": "s3cret"}, "static_configs": [{"targets": [target]}]},
        {"job_name": "badpw", "scheme": "https", "tls_config": tls_config,
         "basic_auth": {"username": "prometheus", "password": "guess"}, "static_configs": [{"targets": [target]}]},
        {"job_name": "plain", "scheme": "http", "static_configs": [{"targets": [target]}]},
    ]  # fmt: skip
    with run_prometheus(tmp_path, jobs) as prom:
        prom.wait_target_health("good", "up")
        assert prom.wait_query('gpumon_test_up{job="good"}')[0]["value"][1] == "1"
        bad = prom.wait_target_health("badpw", "down")
        assert "401" in bad["lastError"], bad["lastError"]
        plain = prom.wait_target_health("plain", "down")
        assert "400" in plain["lastError"], plain["lastError"]


# --- the real daemon ------------------------------------------------------------------------------------


@pytest.mark.integration
def test_gpumon_run_serves_metrics_over_tls_with_basic_auth(pki: Pki, tmp_path: Path) -> None:
    web_config = write_web_config(
        tmp_path / "web-config.yml", tls_doc(pki) | {"basic_auth_users": {"prometheus": bcrypt_hash("s3cret")}}
    )
    gpumon = DaemonProcess(["--backend", "fake", "--fake-gpus", "1", "--web-config-file", str(web_config)], tmp_path)
    try:
        url = f"https://127.0.0.1:{gpumon.port}/metrics"

        def scrape() -> requests.Response | None:
            if gpumon.proc.poll() is not None:
                raise AssertionError(f"gpumon exited:\n{gpumon.log()}")
            response = requests.get(url, auth=("prometheus", "s3cret"), verify=str(pki.ca), timeout=2)
            return response if "gpumon_gpu_up" in response.text else None

        assert wait_for(scrape, 20, 0.2, "gpumon over TLS").status_code == 200
        assert requests.get(url, auth=("prometheus", "nope"), verify=str(pki.ca), timeout=5).status_code == 401
        plain = requests.get(url.replace("https", "http"), timeout=5)
        assert (plain.status_code, plain.text) == (400, "Client sent an HTTP request to an HTTPS server.\n")
    finally:
        gpumon.stop()


def test_gpumon_run_refuses_a_broken_web_config_listing_every_problem(tmp_path: Path) -> None:
    web_config = write_web_config(
        tmp_path / "web-config.yml",
        {"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"},
         "basic_auth_users": {"prometheus": "plaintext"}},
    )  # fmt: skip
    result = run_cli("run", "--backend", "fake", "--listen", f"127.0.0.1:{free_port()}", "--web-config-file", str(web_config),
                     "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    for problem in ("missing.crt': no such file", "missing.key': no such file", "not a bcrypt hash"):
        assert problem in result.stderr


@pytest.mark.parametrize(
    "broken",
    ["basic_auth_users: " + "[" * 3000 + "]" * 3000 + "\n", 'basic_auth_users:\n  prometheus: "caf\xe9"\n'],
    ids=["nested 3,000 deep", "not UTF-8"],
)
def test_broken_web_config_re_read_on_change_keeps_the_previous_one_with_one_log_line(
    tmp_path: Path, broken: str
) -> None:
    web_config = write_web_config(tmp_path / "web-config.yml", {"basic_auth_users": {"prometheus": bcrypt_hash("pw")}})
    gpumon = DaemonProcess(["--backend", "fake", "--fake-gpus", "1", "--web-config-file", str(web_config)], tmp_path)
    try:
        url = f"http://127.0.0.1:{gpumon.port}/metrics"

        def served() -> bool:
            assert gpumon.proc.poll() is None, gpumon.log()
            try:
                return requests.get(url, auth=("prometheus", "pw"), timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(served, 20, 0.2, "gpumon with basic auth")
        # the start-up's last line (the first snapshot's inventory) can come after the first scrape
        wait_for(lambda: "inventory baseline" in gpumon.log(), 20, 0.1, "gpumon's start-up lines")
        before = gpumon.log()
        web_config.write_bytes(broken.encode("latin-1"))
        statuses = []

        def scrape_until_the_broken_file_was_read() -> bool:  # it is checked at most once a second
            try:
                statuses.append(requests.get(url, auth=("prometheus", "pw"), timeout=5).status_code)
            except requests.RequestException as exc:
                statuses.append(type(exc).__name__)  # type: ignore[arg-type]
            return "keeping the previous one" in gpumon.log()[len(before) :]

        wait_for(scrape_until_the_broken_file_was_read, 20, 0.1, "the broken web config read and refused")
        for _ in range(5):  # and scrapes go on being served after it
            statuses.append(requests.get(url, auth=("prometheus", "pw"), timeout=5).status_code)
        added = gpumon.log()[len(before) :]
        assert statuses == [200] * len(statuses)
        assert requests.get(url, auth=("prometheus", "wrong"), timeout=5).status_code == 401
        assert added.count("keeping the previous one") == 1, added[:3000]
        assert added.count("\n") == 1, added[:3000]
        assert "Traceback" not in added
    finally:
        gpumon.stop()


def test_unauthenticated_paths_open_only_probes(serve: Any) -> None:
    url, _, _ = serve(
        {"basic_auth_users": {"prometheus": bcrypt_hash("s3cret")}, "unauthenticated_paths": ["/healthz"]}
    )
    assert requests.get(url + "/healthz", timeout=5).status_code == 200
    assert requests.get(url + "/ready", timeout=5).status_code == 401
    assert requests.get(url + "/metrics", timeout=5).status_code == 401


def test_unauthenticated_paths_cannot_open_metrics(tmp_path: Path) -> None:
    path = write_web_config(tmp_path / "w.yml", {"unauthenticated_paths": ["/metrics", "/healthz"]})
    with pytest.raises(WebConfigError, match=r"unauthenticated_paths: '/metrics' cannot be opened"):
        WebConfig.load(path)


def test_a_stalled_tls_handshake_is_closed_after_the_header_timeout(tmp_path: Path, pki: Pki) -> None:
    watcher = WebConfigWatcher(write_web_config(tmp_path / "w.yml", tls_doc(pki)))
    server = MetricsServer(
        ("127.0.0.1", 0),
        RenderedBytes(lambda: b"x 1.0\n"),
        SnapshotStore(),
        stale_after_seconds=5,
        web_config=watcher,
        limits=HttpLimits(header_timeout_seconds=0.5),
    )
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
            assert sock.recv(4096) == b""  # closed by the server, well before our 10 s
        ok = requests.get(f"https://127.0.0.1:{server.port}/metrics", verify=str(pki.ca), timeout=5)
        assert ok.text == "x 1.0\n"
    finally:
        server.stop()


@pytest.mark.parametrize(
    "tls",
    [
        {"cert_file": "a.crt", "key_file": "a.key", "cipher_suites": [[]]},
        {"cert_file": "a.crt", "key_file": "a.key", "cipher_suites": [{"x": 1}]},
        {"cert_file": [["x"]], "key_file": {"k": "v"}},
    ],
)
def test_values_of_the_wrong_shape_are_problems_not_type_errors(tmp_path: Path, tls: dict[str, Any]) -> None:
    """A list or mapping where a name goes (found by fuzzing: TypeError: unhashable type) is a listed problem."""
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"tls_server_config": tls}))
    with pytest.raises(WebConfigError) as raised:
        WebConfig.load(path)
    assert raised.value.problems and all("\n" not in p for p in raised.value.problems)
