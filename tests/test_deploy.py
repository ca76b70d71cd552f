"""deploy/: the KubeRay RayCluster manifest (against the Kubernetes client's models and the RayCluster
CRD fields it uses), the node-claiming wrapper of its worker pods, and the Grafana dashboard
(against the metric names actors/ops/metrics.py registers)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "deploy" / "kuberay" / "raycluster.yaml"
SPEC = ROOT / "deploy" / "kuberay" / "cluster.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "rollmux_grafana_dashboard.json"

# KubeRay's RayCluster CRD (ray.io/v1): the fields of each object this manifest may use, and the
# ones the CRD requires (openAPIV3Schema of ray-operator/config/crd/bases/ray.io_rayclusters.yaml).
CRD_SPEC = {"rayVersion", "enableInTreeAutoscaling", "autoscalerOptions", "headGroupSpec", "workerGroupSpecs",
            "headServiceAnnotations", "suspend", "gcsFaultToleranceOptions", "managedBy"}
CRD_HEAD = {"serviceType", "headService", "enableIngress", "rayStartParams", "template"}
CRD_HEAD_REQUIRED = {"template"}
CRD_WORKER = {"groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds", "numOfHosts",
              "rayStartParams", "template", "scaleStrategy", "suspend"}
CRD_WORKER_REQUIRED = {"groupName", "maxReplicas", "minReplicas", "template"}


def _raycluster() -> dict:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    rc = [d for d in docs if d.get("kind") == "RayCluster"]
    assert len(rc) == 1
    return rc[0]


def _resources_param(v: str) -> dict:
    """KubeRay's ``resources`` rayStartParam: a quoted, escaped JSON object ('"{\\"a\\": 1}"')."""
    assert v.startswith('"') and v.endswith('"'), v
    return json.loads(v[1:-1].replace('\\"', '"'))


def _pod_template(data: dict):
    """Deserialize into the Kubernetes client's V1PodTemplateSpec; serialize back; both must agree
    (a misspelt or mistyped field is dropped or changed by the round trip)."""
    from kubernetes.client import ApiClient, V1PodTemplateSpec

    api = ApiClient()
    obj = api._ApiClient__deserialize(data, "V1PodTemplateSpec")
    assert isinstance(obj, V1PodTemplateSpec)
    assert api.sanitize_for_serialization(obj) == data
    return obj


def test_raycluster_uses_only_crd_fields_and_valid_pod_templates():
    pytest.importorskip("kubernetes")
    rc = _raycluster()
    assert rc["apiVersion"] == "ray.io/v1" and rc["metadata"]["name"] == "rollmux"
    from kubernetes.client import ApiClient, V1ObjectMeta

    meta = ApiClient()._ApiClient__deserialize(rc["metadata"], "V1ObjectMeta")
    assert isinstance(meta, V1ObjectMeta) and ApiClient().sanitize_for_serialization(meta) == rc["metadata"]
    spec = rc["spec"]
    assert set(spec) <= CRD_SPEC, set(spec) - CRD_SPEC
    head = spec["headGroupSpec"]
    assert CRD_HEAD_REQUIRED <= set(head) <= CRD_HEAD, set(head) ^ CRD_HEAD
    for g in [head, *spec["workerGroupSpecs"]]:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in g["rayStartParams"].items()), g["rayStartParams"]
    for w in spec["workerGroupSpecs"]:
        assert CRD_WORKER_REQUIRED <= set(w) <= CRD_WORKER, set(w) ^ CRD_WORKER
        assert w["minReplicas"] <= w["replicas"] <= w["maxReplicas"]
    templates = [head["template"], *(w["template"] for w in spec["workerGroupSpecs"])]
    for t in templates:
        pod = _pod_template(t)
        for c in pod.spec.containers:  # Ray's token on every Ray process; RAY_AUTH_MODE=token
            env = {e.name: e for e in c.env}
            assert env["RAY_AUTH_MODE"].value == "token"
            ref = env["RAY_AUTH_TOKEN"].value_from.secret_key_ref
            assert (ref.name, ref.key) == ("rollmux-tokens", "ray-token")
    head_pod = _pod_template(head["template"])
    assert _resources_param(head["rayStartParams"]["resources"]) == {"rollmux_head": 1}
    ports = {p.name: p.container_port for p in head_pod.spec.containers[0].ports}
    assert ports["gcs-server"] == 6379 and ports["rollmux-api"] == 8000 and ports["metrics"] == 8080


def test_one_worker_group_per_pool_matches_the_cluster_spec():
    pytest.importorskip("kubernetes")
    from rollmux.config import load_cluster

    cluster = load_cluster(SPEC)
    groups = {w["groupName"]: w for w in _raycluster()["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"rollout", "train"}
    for pool, w in groups.items():
        p = cluster.pool(pool)
        assert w["replicas"] == p.num_nodes
        pod = _pod_template(w["template"])
        c = pod.spec.containers[0]
        gpus = p.node.gpus_per_node
        assert c.resources.limits["nvidia.com/gpu"] == str(gpus) == c.resources.requests["nvidia.com/gpu"]
        assert w["rayStartParams"]["num-gpus"] == str(gpus)
        assert _resources_param(w["rayStartParams"]["resources"]) == {f"rollmux_pool:{pool}": 1}
        args = " ".join(c.args)
        assert f"claim_node.py --pool {pool} --num-nodes {p.num_nodes}" in args
        assert pod.spec.node_selector["nvidia.com/gpu.product"].endswith(p.node.gpu.name)


def _claim():
    s = importlib.util.spec_from_file_location("claim_node", ROOT / "deploy" / "kuberay" / "claim_node.py")
    m = importlib.util.module_from_spec(s)
    s.loader.exec_module(m)
    return m


def test_claim_node_picks_the_lowest_free_index_and_resolves_double_claims():
    from rollmux.nodes import NODE_RESOURCE_UNITS, node_resource

    m = _claim()
    assert m.NODE_RESOURCE_UNITS == NODE_RESOURCE_UNITS
    nodes = [{"CPU": 8, node_resource("rollout-0"): 1000}, {node_resource("rollout-2"): 1000},
             {node_resource("train-1"): 1000}, {"rollmux_node:rollout-x": 1}]
    assert m.taken_indices("rollout", nodes) == {0, 2}
    assert m.pick_index("rollout", 4, nodes) == 1
    assert m.pick_index("train", 2, nodes) == 0
    assert m.pick_index("rollout", 1, nodes) is None
    flag = m.resources_flag("train", 3)
    assert json.loads(flag.split("=", 1)[1].strip("'")) == {node_resource("train-3"): 1000.0, "rollmux_pool:train": 1.0}
    me = node_resource("rollout-1")
    claims = [("b" * 8, "10.0.0.2", {me: 1000}), ("a" * 8, "10.0.0.1", {me: 1000}), ("c" * 8, "10.0.0.3", {})]
    assert m.loses_race(me, "10.0.0.2", claims) and not m.loses_race(me, "10.0.0.1", claims)
    assert not m.loses_race(me, "10.0.0.2", claims[:1])


def _registered_metrics() -> set[str]:
    src = (ROOT / "actors" / "ops" / "metrics.py").read_text()
    body = src[src.index("def _metrics"):src.index("def flush")]
    return set(re.findall(r'"(rollmux_[a-z_]+)"', body))


def test_grafana_dashboard_queries_exactly_the_exported_metrics():
    d = json.loads(DASHBOARD.read_text())
    names = _registered_metrics()
    assert {"rollmux_group_cost_usd_per_h", "rollmux_pool_bubble_seconds", "rollmux_job_slowdown",
            "rollmux_admission_decisions_total", "rollmux_phase_switch_total"} <= names
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    used = set()
    for e in exprs:
        for m in re.findall(r"\bray_(rollmux_[a-z_]+)", e):
            stripped = re.sub(r"_(bucket|sum|count)$", "", m)  # a histogram's series
            base = m if m in names else stripped
            assert base in names, f"{m} is not registered in actors/ops/metrics.py"
            used.add(base)
        assert 'SessionName=~"$SessionName"' in e  # Ray's dashboards filter by session the same way
    assert used == names  # every exported metric has a panel
    assert all(p["datasource"] == "${datasource}" for p in d["panels"])
    assert [v["name"] for v in d["templating"]["list"]][:1] == ["datasource"]
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"]) and d["uid"] == "rollmux"
    titles = " ".join(p["title"].lower() for p in d["panels"])
    for word in ("cost", "bubble", "slo", "admission", "switch"):
        assert word in titles
