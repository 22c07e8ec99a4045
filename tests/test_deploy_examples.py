"""The example files in deploy/ are accepted by the programs that read them."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests
import yaml

from gpumon.config.file import Config
from tests.helpers import DaemonProcess, wait_for
from tests.pki import Pki

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", "check-config", str(path)], capture_output=True, text=True, timeout=60
    )


def test_gpumon_example_config_is_valid() -> None:
    result = check_config(DEPLOY / "gpumon.example.yaml")
    assert result.returncode == 0, result.stderr


def test_gpumon_example_config_mentions_every_option() -> None:
    text = (DEPLOY / "gpumon.example.yaml").read_text()
    options = [f.name for f in dataclasses.fields(Config) if f.name != "source"]
    missing = [o for o in options if not re.search(rf"^#? ?{o}:", text, flags=re.M)]
    assert missing == [], f"options not in deploy/gpumon.example.yaml: {missing}"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package: prometheus)")
def test_prometheus_scrape_example_is_valid() -> None:
    assert PROMTOOL is not None
    result = subprocess.run(
        [PROMTOOL, "check", "config", str(DEPLOY / "prometheus-scrape.example.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package: prometheus)")
def test_kubernetes_scrape_example_is_valid() -> None:
    assert PROMTOOL is not None
    result = subprocess.run(
        [PROMTOOL, "check", "config", str(DEPLOY / "kubernetes" / "prometheus-scrape.example.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        pytest.skip("this promtool is built without Kubernetes service discovery (Debian's is)")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (Debian package: prometheus-alertmanager)")
def test_alertmanager_example_is_valid() -> None:
    assert AMTOOL is not None
    result = subprocess.run(
        [AMTOOL, "check-config", str(DEPLOY / "alertmanager.example.yml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (Debian package: prometheus-alertmanager)")
def test_alertmanager_example_pages_critical_gpu_alerts() -> None:
    assert AMTOOL is not None
    result = subprocess.run(
        [AMTOOL, "config", "routes", "test", f"--config.file={DEPLOY / 'alertmanager.example.yml'}",
         "alertname=GpuLost", "severity=critical", "gpu=0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.stdout.strip() == "gpu-oncall", result.stdout + result.stderr


def daemonset_docs() -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "gpumon-daemonset.yaml").read_text()))
    return {d["kind"]: d for d in docs}


def test_daemonset_is_scraped_through_annotations_on_gpumon_port() -> None:
    docs = daemonset_docs()
    pod = docs["DaemonSet"]["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    container = pod["spec"]["containers"][0]
    assert int(annotations["prometheus.io/port"]) == container["ports"][0]["containerPort"] == 10480
    config = yaml.safe_load(docs["ConfigMap"]["data"]["gpumon.yaml"])
    assert config["listen"].endswith(":10480")


def test_daemonset_sees_host_processes_and_gpus_without_taking_them() -> None:
    spec = daemonset_docs()["DaemonSet"]["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "nvidia.com/gpu" not in str(container.get("resources", {})), "must not consume a GPU"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_daemonset_state_dir_is_a_host_path_and_its_config_is_valid(tmp_path: Path) -> None:
    docs = daemonset_docs()
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    config_text = docs["ConfigMap"]["data"]["gpumon.yaml"]
    state_dir = yaml.safe_load(config_text)["state_dir"]
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["state"] == state_dir
    assert volumes["state"]["hostPath"]["path"] == state_dir
    (tmp_path / "gpumon.yaml").write_text(config_text)
    result = check_config(tmp_path / "gpumon.yaml")
    assert result.returncode == 0, result.stderr


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # the kubelet does not verify either
@pytest.mark.parametrize("tls", [False, True], ids=["basic auth", "basic auth and TLS"])
def test_daemonset_probes_pass_with_auth_on_while_metrics_need_credentials(tmp_path: Path, pki: Pki, tls: bool) -> None:
    """What the kubelet does with the example's probes once basic auth (and TLS) is switched on."""
    docs = daemonset_docs()
    container = docs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-2:] == ["--web-config-file", "/etc/gpumon/web-config.yml"]
    web = yaml.safe_load(docs["ConfigMap"]["data"]["web-config.yml"])
    web["basic_auth_users"] = {"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()}
    if tls:
        web["tls_server_config"] = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    (tmp_path / "web-config.yml").write_text(yaml.safe_dump(web))
    config = yaml.safe_load(docs["ConfigMap"]["data"]["gpumon.yaml"])
    config.update(backend="fake", state_dir=str(tmp_path / "state"))
    (tmp_path / "gpumon.yaml").write_text(yaml.safe_dump(config))
    gpumon = DaemonProcess(
        ["--config", str(tmp_path / "gpumon.yaml"), "--web-config-file", str(tmp_path / "web-config.yml")], tmp_path
    )
    scheme = "https" if tls else "http"  # the manifest says: scheme HTTPS once TLS is on
    try:
        for probe in ("livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] == "metrics" and get.get("scheme", "HTTP") == "HTTP"
            url = f"{scheme}://127.0.0.1:{gpumon.port}{get['path']}"

            def passes(url: str = url) -> bool:  # the kubelet: no credentials, no certificate check
                assert gpumon.proc.poll() is None, gpumon.log()
                try:
                    return requests.get(url, verify=False, timeout=2).status_code == 200
                except requests.ConnectionError:
                    return False

            wait_for(passes, 20, 0.2, f"{probe} {url}")
        metrics = f"{scheme}://127.0.0.1:{gpumon.port}/metrics"
        assert requests.get(metrics, verify=False, timeout=5).status_code == 401
        assert requests.get(metrics, verify=False, auth=("prometheus", "s3cret"), timeout=5).status_code == 200
    finally:
        gpumon.stop()
