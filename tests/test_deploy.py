"""Deploy files are parsed and cross-checked (no Docker engine or cluster here).

The compose stack, the Dockerfile, the nginx edge, the Prometheus scrape config, the Grafana
provisioning and the Kubernetes manifests must agree with each other and with the gateway's
own config: ports, probe paths, config mounts (files that exist and load), image names,
service names, and shutdown timing.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import yaml

from gateway.config import Config, load_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text("utf-8"))


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = _yaml(DEPLOY / "docker-compose.yml")
    return data


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _mounts(service: dict[str, Any], base: Path = DEPLOY) -> dict[str, Path]:
    """container path -> host path, for the service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        src, dst = volume.split(":")[:2]
        out[dst] = (base / src).resolve()
    return out


def _host_file(service: dict[str, Any], container_path: str) -> Path:
    """The host file behind ``container_path``: mounted itself or inside a mounted folder."""
    mounts = _mounts(service)
    path = PurePosixPath(container_path)
    for dst, src in mounts.items():
        if path == PurePosixPath(dst):
            return src
        if PurePosixPath(dst) in path.parents:
            return src / path.relative_to(dst)
    raise AssertionError(f"{container_path} is not mounted: {mounts}")


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port."""
    out = {}
    for port in service.get("ports", []):
        host, container = str(port).rsplit(":", 2)[-2:]
        out[int(container.split("/")[0])] = int(host)
    return out


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _instruction(name: str) -> list[str]:
    return [rest for word, rest in _dockerfile() if word == name]


def _dockerfile_env() -> dict[str, str]:
    env = {}
    for rest in _instruction("ENV"):
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def _compose_gateway_config() -> Config:
    gw = _compose()["services"]["gateway"]
    env = {**_dockerfile_env(), **_env(gw)}
    return load_config(_host_file(gw, env["GATEWAY_CONFIG"]), env=env)


def _command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def _flag(args: list[str], name: str) -> str:
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


# ---------------------------------------------------------------- Dockerfile


def test_dockerfile_slim_nonroot_healthcheck_and_serve() -> None:
    (base,) = _instruction("FROM")
    assert base == "python:3.11-slim"
    (user,) = _instruction("USER")
    assert user.split(":")[0] not in ("0", "root")
    assert re.search(rf"--uid {user.split(':')[0]}\b", " ".join(_instruction("RUN")))
    assert any("pip install" in run and '".${EXTRAS}"' in run for run in _instruction("RUN"))
    # what it copies is what `pip install .` needs, and it exists
    for rest in _instruction("COPY"):
        *sources, _ = rest.split()
        for src in sources:
            assert (ROOT / src).exists(), src
    assert _dockerfile_env()["GATEWAY__SERVER__HOST"] == "0.0.0.0"
    (expose,) = _instruction("EXPOSE")
    port = load_config(env={}).server.port
    assert int(expose) == port
    (health,) = _instruction("HEALTHCHECK")
    assert "/healthz" in health and "'8080'" in health and "GATEWAY__SERVER__PORT" in health
    (cmd,) = _instruction("CMD")
    assert yaml.safe_load(cmd) == ["gateway", "serve"]


def test_dockerfile_healthcheck_command_is_valid_python() -> None:
    (health,) = _instruction("HEALTHCHECK")
    argv = yaml.safe_load(health[health.index("CMD") + 3 :].strip())
    assert argv[:2] == ["python", "-c"]
    compile(argv[2], "<healthcheck>", "exec")


# ---------------------------------------------------------------- compose


def test_compose_has_the_whole_stack() -> None:
    services = _compose()["services"]
    want = {"gateway", "mock-upstream", "redis", "jaeger", "prometheus", "grafana", "edge"}
    assert want <= set(services)
    assert services["loadgen"]["profiles"] == ["load"]
    for name, service in services.items():
        if "build" in service:
            build = service["build"]
            assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (
                DEPLOY / "Dockerfile"
            ), name
        else:
            assert ":" in service["image"] and not service["image"].endswith(":latest"), name


def test_compose_gateway_config_is_mounted_valid_and_on_the_published_port() -> None:
    services = _compose()["services"]
    gw = services["gateway"]
    env = _env(gw)
    config_file = _host_file(gw, env["GATEWAY_CONFIG"])
    assert config_file.is_file() and config_file.is_relative_to(DEPLOY)
    cfg = _compose_gateway_config()
    assert cfg.server.host == "0.0.0.0"
    assert _published(gw) == {cfg.server.port: cfg.server.port}
    (expose,) = _instruction("EXPOSE")
    assert int(expose) == cfg.server.port
    # the file on its own passes `gateway check-config`
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # SIGKILL comes after the grace the gateway gives in-flight streams
    grace = gw["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) > cfg.server.shutdown_grace_s


def test_compose_gateway_reaches_its_backends_redis_and_jaeger_by_service_name() -> None:
    services = _compose()["services"]
    cfg = _compose_gateway_config()
    depends = set(services["gateway"]["depends_on"])
    # every http backend is a compose service listening on that port
    http_backends = [b for b in cfg.backends if not b.is_mock]
    assert http_backends
    for backend in http_backends:
        url = urlsplit(backend.url)
        service = services[url.hostname or ""]
        args = _command(service)
        assert args[:2] == ["gateway", "mock-upstream"]
        assert _flag(args, "--host") == "0.0.0.0" and int(_flag(args, "--port")) == url.port
        assert url.port in [int(p) for p in service["expose"]]
        assert str(url.port) in " ".join(service["healthcheck"]["test"])
        assert service["image"] == services["gateway"]["image"]  # one image
        assert url.hostname in depends
    assert any(b.is_mock for b in cfg.backends)  # the fallback when mock-upstream is stopped
    redis = urlsplit(cfg.cache.url)
    assert cfg.cache.backend == "redis" and redis.hostname == "redis" and redis.port == 6379
    assert "redis" in depends
    assert cfg.tracing.exporter == "otlp"
    otlp = urlsplit(cfg.tracing.endpoint or "")
    assert otlp.hostname == "jaeger"
    assert otlp.port == (4318 if cfg.tracing.protocol == "http/protobuf" else 4317)
    jaeger = services["jaeger"]
    assert "jaegertracing/jaeger:2." in jaeger["image"]
    assert {4317, 4318, 16686} <= set(_published(jaeger))
    sets = " ".join(_command(jaeger))
    assert (
        f"protocols.{'http' if otlp.port == 4318 else 'grpc'}.endpoint=0.0.0.0:{otlp.port}" in sets
    )


def test_compose_edge_stamps_the_hops_the_gateway_trusts() -> None:
    services = _compose()["services"]
    edge = services["edge"]
    conf = _host_file(edge, "/etc/nginx/nginx.conf").read_text()
    cfg = _compose_gateway_config()
    # the last proxy points at the gateway's service and port
    assert re.search(rf"server gateway:{cfg.server.port};", conf)
    stamped = {h.lower() for h in re.findall(r'proxy_set_header (\S+) "t=\$\{msec\}";', conf)}
    assert stamped == {hop.header for hop in cfg.edge.hops}
    assert [h.name for h in cfg.edge.hops] == ["cdn", "lb"]
    # SSE passes through unbuffered (the "buffering" symptom of deploy/README.md)
    locations = conf.count("proxy_pass")
    assert conf.count("proxy_buffering off;") == locations == 2
    listens = [int(p) for p in re.findall(r"listen (\d+);", conf)]
    assert set(_published(edge)) <= set(listens)
    # the inner hop is reached from the outer one
    assert re.search(rf"proxy_pass http://127\.0\.0\.1:{listens[1]};", conf)
    # docker's networks are trusted so the stamps count
    trusted = [ipaddress.ip_network(n) for n in cfg.edge.trusted_proxies]
    assert any(ipaddress.ip_address("172.18.0.5") in n for n in trusted)


def test_compose_loadgen_drives_the_edge_with_the_locustfile() -> None:
    services = _compose()["services"]
    loadgen = services["loadgen"]
    args = _command(loadgen)
    assert args[0] == "locust" and "--headless" in args
    assert _host_file(loadgen, _flag(args, "-f")) == (ROOT / "loadtests/locustfile.py").resolve()
    host = urlsplit(_flag(args, "--host"))
    assert host.hostname == "edge"
    assert host.port in set(_published(services["edge"]))
    assert loadgen["build"]["args"]["EXTRAS"] == "[load]"


def test_compose_prometheus_scrapes_the_gateway_and_loads_the_rules() -> None:
    services = _compose()["services"]
    prom = services["prometheus"]
    args = _command(prom)
    config_path = _flag(args, "--config.file")
    config_file = _host_file(prom, config_path)
    assert config_file == (DEPLOY / "prometheus/prometheus.yml").resolve()
    assert "--enable-feature=exemplar-storage" in args
    config = _yaml(config_file)
    for rule_file in config["rule_files"]:
        in_container = PurePosixPath(config_path).parent / rule_file
        assert _host_file(prom, str(in_container)).is_file(), rule_file
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "llm-gateway"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (static,) = job["static_configs"]
    cfg = _compose_gateway_config()
    assert static["targets"] == [f"gateway:{cfg.server.port}"]
    assert cfg.metrics.enabled
    assert 9090 in _published(prom)


def test_compose_grafana_is_provisioned_with_the_stack_and_the_dashboard() -> None:
    services = _compose()["services"]
    grafana = services["grafana"]
    datasources = _yaml(
        _host_file(grafana, "/etc/grafana/provisioning/datasources/datasources.yml")
    )["datasources"]
    by_type = {d["type"]: d for d in datasources}
    prom_url = urlsplit(by_type["prometheus"]["url"])
    assert prom_url.hostname == "prometheus" and prom_url.port in _published(services["prometheus"])
    jaeger_url = urlsplit(by_type["jaeger"]["url"])
    assert jaeger_url.hostname == "jaeger" and jaeger_url.port == 16686
    scrape = _yaml(DEPLOY / "prometheus/prometheus.yml")["global"]["scrape_interval"]
    assert by_type["prometheus"]["jsonData"]["timeInterval"] == scrape
    (provider,) = _yaml(_host_file(grafana, "/etc/grafana/provisioning/dashboards/dashboards.yml"))[
        "providers"
    ]
    folder = _host_file(grafana, provider["options"]["path"])
    assert (folder / "llm-gateway.json").is_file()
    home = _env(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_file(grafana, home) == (folder / "llm-gateway.json")


def test_jaeger_compose_exposes_otlp_and_ui_and_the_gateway_points_at_it() -> None:
    compose = _yaml(DEPLOY / "jaeger/docker-compose.yml")
    jaeger = compose["services"]["jaeger"]
    assert "jaegertracing/jaeger:2." in jaeger["image"]  # Jaeger v2, not the v1 all-in-one
    published = {int(p.split(":")[1]) for p in jaeger["ports"]}
    assert {4317, 4318, 16686} <= published
    gw = compose["services"]["gateway"]
    env = {k: str(v) for k, v in gw["environment"].items()}
    endpoint = urlsplit(env["GATEWAY__TRACING__ENDPOINT"])
    assert endpoint.hostname == "jaeger"
    want = 4318 if env["GATEWAY__TRACING__PROTOCOL"] == "http/protobuf" else 4317
    assert endpoint.port == want
    # the overrides are a valid gateway config on top of the embedded default
    cfg = load_config(env=env)
    assert cfg.tracing.exporter == "otlp" and cfg.server.host == "0.0.0.0"
    build = gw["build"]
    assert (DEPLOY / "jaeger" / build["context"] / build["dockerfile"]).resolve() == (
        DEPLOY / "Dockerfile"
    )
    assert gw["image"] == _compose()["services"]["gateway"]["image"]
    assert gw["ports"] == [f"{cfg.server.port}:{cfg.server.port}"]


def test_jaeger_readme_names_what_operators_search_for() -> None:
    text = (DEPLOY / "jaeger/README.md").read_text()
    for needle in (
        "4317",
        "4318",
        "16686",
        "hop.name",
        "gateway.overhead_ms",
        "OTEL_EXPORTER_JAEGER_AGENT_HOST",
        "1.22",
    ):
        assert needle in text, needle


# ---------------------------------------------------------------- Kubernetes


def _k8s() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (found,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(found)


def _k8s_gateway_config() -> Config:
    docs = _k8s()
    container = _container(docs[("Deployment", "llm-gateway")])
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    config_path = PurePosixPath(env["GATEWAY_CONFIG"])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert PurePosixPath(mount["mountPath"]) == config_path.parent
    volumes = docs[("Deployment", "llm-gateway")]["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "config"]
    configmap = docs[("ConfigMap", volume["configMap"]["name"])]
    return load_config(text=configmap["data"][config_path.name], env=env)


def test_k8s_kustomization_lists_every_manifest() -> None:
    kustomization = _yaml(K8S / "kustomization.yaml")
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    kinds = {kind for kind, _ in _k8s()}
    want = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap"}
    assert want <= kinds


def test_k8s_configmap_is_a_valid_config_sharing_redis_and_tracing_to_a_collector() -> None:
    docs = _k8s()
    cfg = _k8s_gateway_config()
    assert cfg.server.host == "0.0.0.0"
    assert cfg.cache.backend == "redis"
    redis = urlsplit(cfg.cache.url)
    service = docs[("Service", redis.hostname or "")]
    assert redis.port in [p["port"] for p in service["spec"]["ports"]]
    assert cfg.tracing.exporter == "otlp" and cfg.tracing.endpoint
    assert urlsplit(cfg.tracing.endpoint).port in (4317, 4318)


def test_k8s_deployment_ports_probes_and_scrape_annotations_agree() -> None:
    docs = _k8s()
    deployment = docs[("Deployment", "llm-gateway")]
    container = _container(deployment)
    cfg = _k8s_gateway_config()
    (port,) = container["ports"]
    assert port["containerPort"] == cfg.server.port
    ready, live = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert ready["path"] == "/readyz" and live["path"] == "/healthz"
    for probe in (ready, live, container["startupProbe"]["httpGet"]):
        assert _port_number(container, probe["port"]) == cfg.server.port
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == cfg.server.port
    assert annotations["prometheus.io/path"] == "/metrics"
    assert cfg.metrics.enabled
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    # the image is the compose one (deploy/Dockerfile), pinned
    image = container["image"]
    assert image.split(":")[0] == _compose()["services"]["gateway"]["image"].split(":")[0]
    assert not image.endswith(":latest")
    user = _instruction("USER")[0].split(":")[0]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(user)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_k8s_termination_grace_covers_prestop_sleep_plus_shutdown_grace() -> None:
    deployment = _k8s()[("Deployment", "llm-gateway")]
    container = _container(deployment)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    sleep = float(command[1])
    assert sleep >= 5  # endpoints controller + kube-proxy/LB have time to drop the pod
    cfg = _k8s_gateway_config()
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > cfg.server.shutdown_grace_s + sleep
    # the rollout adds a ready pod before it removes one
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_k8s_service_hpa_and_pdb_select_the_deployment() -> None:
    docs = _k8s()
    deployment = docs[("Deployment", "llm-gateway")]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    container = _container(deployment)
    service = docs[("Service", "llm-gateway")]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert _port_number(container, port["targetPort"]) == _k8s_gateway_config().server.port
    pdb = docs[("PodDisruptionBudget", "llm-gateway")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = docs[("HorizontalPodAutoscaler", "llm-gateway")]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "llm-gateway")
    # a drain can always evict one pod, and one pod never runs alone
    assert hpa["spec"]["minReplicas"] >= 2
    assert pdb["spec"]["maxUnavailable"] >= 1
    assert (
        hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    )


def test_k8s_prometheus_example_keeps_the_pods_the_deployment_annotates() -> None:
    config = _yaml(DEPLOY / "prometheus/prometheus-k8s.yml")
    # llm-gateway: the job alerts.yml's GatewayMetricsDown names
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "llm-gateway"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    meta = _k8s()[("Deployment", "llm-gateway")]["spec"]["template"]["metadata"]

    def sd_name(prefix: str, key: str) -> str:  # how Kubernetes SD names a label/annotation
        return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)

    pod = {sd_name("__meta_kubernetes_pod_label_", k): v for k, v in meta["labels"].items()}
    pod |= {
        sd_name("__meta_kubernetes_pod_annotation_", k): v for k, v in meta["annotations"].items()
    }
    keeps = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert len(keeps) >= 2
    for rule in keeps:
        (source,) = rule["source_labels"]
        assert re.fullmatch(rule["regex"], pod[source]), rule
    # the port and path annotations are the ones used for the target
    (address,) = [r for r in job["relabel_configs"] if r.get("target_label") == "__address__"]
    port_source = address["source_labels"][1]
    joined = f"10.1.2.3:9999;{pod[port_source]}"
    assert re.sub(
        f"^(?:{address['regex']})$", address["replacement"].replace("$", "\\"), joined
    ) == (f"10.1.2.3:{meta['annotations']['prometheus.io/port']}")
    (path,) = [r for r in job["relabel_configs"] if r.get("target_label") == "__metrics_path__"]
    assert pod[path["source_labels"][0]] == "/metrics"


def test_both_prometheus_configs_scrape_dcgm_exporter_for_the_gpu_row() -> None:
    # compose: file_sd from a file mounted beside prometheus.yml (empty: compose has no GPU)
    prom = _compose()["services"]["prometheus"]
    config_path = _flag(_command(prom), "--config.file")
    config = _yaml(_host_file(prom, config_path))
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "dcgm-exporter"]
    (sd,) = job["file_sd_configs"]
    for name in sd["files"]:
        in_container = PurePosixPath(config_path).parent / name
        assert _yaml(_host_file(prom, str(in_container))) == [], name
    # Kubernetes: the GPU operator's exporter pods and the Helm chart's, on their metrics port
    k8s = _yaml(DEPLOY / "prometheus/prometheus-k8s.yml")
    (job,) = [j for j in k8s["scrape_configs"] if j["job_name"] == "dcgm-exporter"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}] and job["honor_labels"] is True
    keeps = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    label_keep, port_keep = keeps
    for app, name, kept in (
        ("nvidia-dcgm-exporter", "", True),  # the GPU operator's DaemonSet
        ("", "dcgm-exporter", True),  # the dcgm-exporter Helm chart
        ("llm-gateway", "llm-gateway", False),
    ):
        assert bool(re.fullmatch(label_keep["regex"], f"{app};{name}")) is kept, (app, name)
    assert port_keep["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]
    assert re.fullmatch(port_keep["regex"], "metrics")


# ---------------------------------------------------------------- the operator's guide


def test_deploy_readme_names_panels_alerts_and_log_fields_that_exist() -> None:
    text = (DEPLOY / "README.md").read_text()
    dashboard = _yaml(DEPLOY / "grafana/dashboards/llm-gateway.json")  # JSON is YAML

    def titles(panels: list[dict[str, Any]]) -> set[str]:
        out = set()
        for p in panels:
            out.add(p["title"])
            out |= titles(p.get("panels", []))
        return out

    panel_titles = titles(dashboard["panels"])
    referenced = set(re.findall(r'panel\s+"([^"]+)"', text))
    assert len(referenced) >= 15
    assert referenced <= panel_titles, referenced - panel_titles
    alerts = {
        r["alert"] for g in _yaml(DEPLOY / "prometheus/alerts.yml")["groups"] for r in g["rules"]
    }
    named = set(re.findall(r"`((?:Gateway|Gpu)[A-Za-z0-9]+)`", text))
    assert named == alerts, named ^ alerts
    for symptom in (
        "Slow DNS or connect",
        "Proxy overhead",
        "Buffering",
        "Cache-miss storm",
        "A backend down",
        "Rate limiting",
        "Slow time to first token",
    ):
        assert f"### {symptom}" in text, symptom
    for field in (  # noqa: SIM905
        "trace_id span_id request_id method path status model route backend tenant cache "
        "request_time_ms upstream_time_ms overhead_ms ttft_ms tokens"
    ).split():
        assert f"`{field}`" in text, field
    for attribute in (
        "hop.name",
        "gateway.overhead_ms",
        "gateway.ttft_ms",
        "gen_ai.response.time_to_first_chunk",
        "gateway.cache",
        "gateway doctor BASE_URL",
    ):
        assert attribute in text, attribute
