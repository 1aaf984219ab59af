"""deploy/kubernetes renders with ``kubectl kustomize`` and every object in it is valid.

Kubernetes' own kinds are validated (strictly: no unknown field) against the current schemas that
PyPI's kubernetes-validate ships; the InferencePool against the schema of its CRD, vendored from the
Gateway API Inference Extension's release the picker's image is (v1.5.0) in deploy/kubernetes/schemas;
the endpoint picker's configuration, which has no published schema, for its shape. Then what ties
the pieces together: the probes, the drain, the GPU request, the pool's selector and port, the
tap.conf the daemon reads, the names it answers in the namespace the README deploys to.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from twisted.trial.unittest import SynchronousTestCase

from mrunner import config

DEPLOY = Path(__file__).parents[2] / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl")
#: The endpoint picker's plugin types (v1.5.0) this configuration may use.
EPP_PLUGINS = frozenset(
    {
        "metrics-data-source",
        "core-metrics-extractor",
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "lora-affinity-scorer",
        "prefix-cache-scorer",
        "max-score-picker",
        "single-profile-handler",
    }
)
VLLM_NAMES = {
    "queuedRequestsSpec": "vllm:num_requests_waiting",
    "runningRequestsSpec": "vllm:num_requests_running",
    "kvUsageSpec": "vllm:kv_cache_usage_perc",
    "loraSpec": "vllm:lora_requests_info",
}


def render(directory: str) -> list[dict[str, Any]]:
    """The objects C{kubectl kustomize} makes of deploy/kubernetes/C{directory}."""
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / directory)], capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory}: {done.stderr}")
    return [document for document in yaml.safe_load_all(done.stdout) if document]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind]
    return found


def strict(schema: Any) -> Any:
    """C{schema} allowing no unknown field in an object that lists its fields (the API server prunes them)."""
    if isinstance(schema, dict):
        tightened = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            tightened["additionalProperties"] = False
        return tightened
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def validate_inference_pool(pool: dict[str, Any]) -> None:
    crd = json.loads((DEPLOY / "schemas" / "inferencepool-v1.json").read_text())
    if pool["apiVersion"] != f"{crd['group']}/{crd['version']}":
        raise AssertionError(f"InferencePool {pool['apiVersion']}: the vendored schema is {crd['version']}")
    schema = strict(crd["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: Kubernetes' own, checked below
    jsonschema.validate(pool, schema)
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": pool["metadata"]},
        kubernetes_validate.latest_version(),
        strict=True,
    )


def validate_picker_config(text: str) -> dict[str, Any]:
    """The EndpointPickerConfig's shape: known plugins, references to defined ones; the parsed config."""
    picker = yaml.safe_load(text)
    if (picker["apiVersion"], picker["kind"]) != (
        "inference.networking.x-k8s.io/v1alpha1",
        "EndpointPickerConfig",
    ):
        raise AssertionError(f"not an EndpointPickerConfig: {picker['apiVersion']} {picker['kind']}")
    unknown = set(picker) - {"apiVersion", "kind", "plugins", "data", "schedulingProfiles", "featureGates"}
    if unknown:
        raise AssertionError(f"unknown sections {sorted(unknown)}")
    names = {plugin.get("name", plugin["type"]) for plugin in picker["plugins"]}
    if not {plugin["type"] for plugin in picker["plugins"]} <= EPP_PLUGINS:
        raise AssertionError(f"unknown plugin types in {picker['plugins']}")
    references = [p["pluginRef"] for profile in picker["schedulingProfiles"] for p in profile["plugins"]]
    for source in picker["data"]["sources"]:
        references += [source["pluginRef"], *(e["pluginRef"] for e in source["extractors"])]
    if not set(references) <= names:
        raise AssertionError(f"references to undefined plugins: {set(references) - names}")
    return picker


class ManifestTests(SynchronousTestCase):
    skip = (
        None
        if KUBECTL
        else "kubectl is missing: apt-get install kubectl (or kubernetes-client; make system-deps)"
    )

    def test_every_object_is_valid(self) -> None:
        version = kubernetes_validate.latest_version()
        checked: set[str] = set()
        for directory in ("overlays/cpu", "overlays/nvidia", "inference"):
            for o in render(directory):
                if o["kind"] == "InferencePool":
                    validate_inference_pool(o)
                else:
                    kubernetes_validate.validate(o, version, strict=True)
                checked.add(o["kind"])
        self.assertEqual(
            checked,
            {
                "ConfigMap",
                "Service",
                "StatefulSet",
                "InferencePool",
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "Deployment",
            },
        )

    def test_an_invalid_object_is_caught(self) -> None:
        """The checks above can fail: a misspelt field and a pool without ports."""
        statefulset = one(render("overlays/cpu"), "StatefulSet")
        statefulset["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(statefulset, kubernetes_validate.latest_version(), strict=True)
        pool = one(render("inference"), "InferencePool")
        del pool["spec"]["targetPorts"]
        self.assertRaises(jsonschema.ValidationError, validate_inference_pool, pool)
        pool["spec"]["targetPorts"] = [{"number": 12434, "name": "http"}]
        self.assertRaises(jsonschema.ValidationError, validate_inference_pool, pool)

    def test_node(self) -> None:
        """Probes on /health and /ready, the drain before a stop, keys from the Secret, a store volume."""
        objects = render("overlays/cpu")
        statefulset = one(objects, "StatefulSet")
        pod = statefulset["spec"]["template"]["spec"]
        [container] = pod["containers"]
        self.assertEqual(container["livenessProbe"]["httpGet"]["path"], "/health")
        self.assertEqual(container["startupProbe"]["httpGet"]["path"], "/health")
        self.assertEqual(container["readinessProbe"]["httpGet"]["path"], "/ready")
        self.assertEqual(
            container["lifecycle"]["preStop"]["exec"]["command"], ["python3", "/etc/mrunner/drain.py"]
        )
        env = {e["name"]: e for e in container["env"]}
        self.assertEqual(
            env["MRUNNER_API_KEY"]["valueFrom"]["secretKeyRef"], {"name": "mrunner-keys", "key": "api-key"}
        )
        self.assertEqual(env["MRUNNER_LISTEN"]["value"], "tcp:12434:interface=$(POD_IP)")
        self.assertEqual(container["ports"], [{"name": "http", "containerPort": 12434}])
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        self.assertEqual(mounts["store"], env["MRUNNER_HOME"]["value"])
        self.assertEqual(
            [t["metadata"]["name"] for t in statefulset["spec"]["volumeClaimTemplates"]], ["store"]
        )
        self.assertEqual(container["image"], "mrunner:cpu")
        self.assertNotIn("nvidia.com/gpu", container["resources"]["limits"])
        # The config volume is the generated ConfigMap, by its hashed name.
        configmap = one(objects, "ConfigMap")
        [volume] = pod["volumes"]
        self.assertEqual(volume["configMap"]["name"], configmap["metadata"]["name"])
        # A kubelet that waits past the drain: the preStop's and SIGTERM's drain_timeout (30s).
        self.assertGreaterEqual(pod["terminationGracePeriodSeconds"], 60)

    def test_the_config_is_one_the_daemon_reads(self) -> None:
        configmap = one(render("overlays/cpu"), "ConfigMap")
        path = Path(self.mktemp())
        path.write_text(configmap["data"]["tap.conf"])
        loaded = config.load(path, environ={"MRUNNER_LISTEN": "tcp:12434:interface=10.1.2.3"})
        self.assertIn("mrunner", loaded.http.allowed_hosts)
        self.assertEqual(loaded.models.preload, ("ai/smollm2:latest",))
        # A preload unpinned would unload after keep_alive (5m) idle, as any runner does.
        self.assertTrue(all(loaded.models.settings[name].pinned for name in loaded.models.preload))
        # The Service's names in the namespace the README deploys to.
        deployed = re.search(r"kubectl create namespace (\S+)", (DEPLOY / "README.md").read_text())
        assert deployed is not None
        for name in (f"mrunner.{deployed[1]}.svc", f"mrunner.{deployed[1]}.svc.cluster.local"):
            self.assertIn(name, loaded.http.allowed_hosts)

    def test_the_drain_counts_what_the_node_serves(self) -> None:
        configmap = one(render("overlays/cpu"), "ConfigMap")
        path = Path(self.mktemp()).with_suffix(".py")
        path.write_text(configmap["data"]["drain.py"])
        spec = importlib.util.spec_from_file_location("drain", path)
        assert spec is not None and spec.loader is not None
        drain = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(drain)
        metrics = (
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="a"} 2.0\n'
            'vllm:num_requests_running{model_name="b"} 0.0\n'
            'vllm:num_requests_waiting{model_name="a"} 1.0\n'
            "vllm:kv_cache_usage_perc 0.5\n"
        )
        self.assertEqual(drain.busy(metrics), 3.0)
        self.assertEqual(drain.busy(metrics.replace("2.0", "0.0").replace("1.0", "0.0")), 0.0)

    def test_nvidia_overlay(self) -> None:
        pod = one(render("overlays/nvidia"), "StatefulSet")["spec"]["template"]["spec"]
        [container] = pod["containers"]
        self.assertEqual(container["resources"]["limits"]["nvidia.com/gpu"], 1)
        self.assertEqual(container["image"], "mrunner:cuda")
        self.assertEqual(pod["nodeSelector"], {"nvidia.com/gpu.present": "true"})
        self.assertIn(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, pod["tolerations"]
        )
        # The rest of the node is the base's.
        self.assertEqual(container["readinessProbe"]["httpGet"]["path"], "/ready")

    def test_inference_pool_and_picker(self) -> None:
        """The pool selects the StatefulSet's pods on their port; the picker reads vLLM's metric names."""
        node = one(render("overlays/cpu"), "StatefulSet")["spec"]["template"]
        objects = render("inference")
        pool = one(objects, "InferencePool")["spec"]
        labels = node["metadata"]["labels"]
        self.assertLessEqual(pool["selector"]["matchLabels"].items(), labels.items())
        self.assertEqual(
            pool["targetPorts"], [{"number": node["spec"]["containers"][0]["ports"][0]["containerPort"]}]
        )
        service = one(objects, "Service")
        self.assertEqual(pool["endpointPickerRef"]["name"], service["metadata"]["name"])
        self.assertEqual(pool["endpointPickerRef"]["port"]["number"], service["spec"]["ports"][0]["port"])

        deployment = one(objects, "Deployment")
        [epp] = deployment["spec"]["template"]["spec"]["containers"]
        schema = json.loads((DEPLOY / "schemas" / "inferencepool-v1.json").read_text())
        self.assertEqual(epp["image"].rpartition(":")[2], schema["release"], "the picker's and the CRD's")
        configmap = one(objects, "ConfigMap")
        [file] = configmap["data"]
        self.assertIn(f"/config/{file}", epp["args"])
        self.assertEqual(
            epp["args"][epp["args"].index("--pool-name") + 1],
            one(objects, "InferencePool")["metadata"]["name"],
        )
        picker = validate_picker_config(configmap["data"][file])
        [extractor] = [p for p in picker["plugins"] if p["type"] == "core-metrics-extractor"]
        [vllm] = extractor["parameters"]["engineConfigs"]
        self.assertLessEqual(VLLM_NAMES.items(), vllm.items())
        self.assertIn(
            "lora-affinity-scorer", [p["pluginRef"] for p in picker["schedulingProfiles"][0]["plugins"]]
        )

    def test_a_bad_picker_config_is_caught(self) -> None:
        configmap = one(render("inference"), "ConfigMap")
        [text] = configmap["data"].values()
        self.assertRaises(
            AssertionError,
            validate_picker_config,
            text.replace("- pluginRef: queue-scorer", "- pluginRef: queue"),
        )
        self.assertRaises(
            AssertionError, validate_picker_config, text.replace("type: queue-scorer", "type: queue")
        )
