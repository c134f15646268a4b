package main

// The Kubernetes manifests in deploy/kubernetes are built with kustomize (the
// library kubectl apply -k uses), every object is decoded strictly into its
// Go API type (an unknown or misspelt field fails), and the references
// between objects are checked: selectors, ports, probes, ConfigMaps, the etcd
// member names, and the flags and PREFIXROUTER_* variables given to
// prefixrouter containers, against this binary's real command tree.

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/prefixrouter/prefixrouter/agent"
	"github.com/prefixrouter/prefixrouter/membership"
)

// manifestDir is deploy/kubernetes; kustomizations lists the directories an
// operator applies with kubectl apply -k.
const manifestDir = "../../deploy/kubernetes"

var kustomizations = []string{".", "external-etcd", "epp-gie", "epp-envoy"}

// routerImage is the image name the manifests give prefixrouter containers
// (deploy/Dockerfile; its entrypoint is the binary, so args start with the
// subcommand).
const routerImage = "prefixrouter"

func TestManifestsBuildAndCrossReference(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			out := kustomizeBuild(t, filepath.Join(manifestDir, dir))
			objs, err := decodeManifests(out)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range checkManifests(objs) {
				t.Error(p)
			}
		})
	}
}

// TestEveryManifestIsApplied decodes every YAML file under deploy/kubernetes
// strictly on its own (kustomize passes unknown fields through) and checks
// that each object it declares is part of some kustomization's output.
func TestEveryManifestIsApplied(t *testing.T) {
	built := map[string]bool{}
	for _, dir := range kustomizations {
		objs, err := decodeManifests(kustomizeBuild(t, filepath.Join(manifestDir, dir)))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			built[o.id()] = true
		}
	}
	files := 0
	err := filepath.WalkDir(manifestDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" || d.Name() == "kustomization.yaml" {
			return err
		}
		files++
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		objs, err := decodeManifests(b)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, o := range objs {
			if !built[o.id()] {
				t.Errorf("%s: %s is in no kustomization's output", path, o.id())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 5 {
		t.Fatalf("found %d manifest files under %s", files, manifestDir)
	}
}

// TestManifestCheckerCatchesMistakes breaks the built manifests in one
// place at a time; each break must be reported, so the checks above can fail.
func TestManifestCheckerCatchesMistakes(t *testing.T) {
	builds := map[string]string{}
	for _, dir := range kustomizations {
		builds[dir] = string(kustomizeBuild(t, filepath.Join(manifestDir, dir)))
	}
	tests := []struct{ build, name, old, new, want string }{
		{".", "unknown field", "  serviceName: etcd\n", "  serviceName: etcd\n  servicName: etcd\n", "unknown field"},
		{".", "unknown serve flag", "--shutdown-timeout=60s", "--shutdown-timeout=60s\n        - --no-such-flag=1", "unknown flag"},
		{".", "bad flag value", "--drain-timeout=120s", "--drain-timeout=soon", "invalid argument"},
		{".", "unknown variable", "PREFIXROUTER_ETCD_ENDPOINTS:", "PREFIXROUTER_ETCD_ENDPOINT:", "no flag"},
		{".", "grace shorter than drain", "--drain-timeout=120s", "--drain-timeout=200s", "terminationGracePeriodSeconds"},
		{".", "grace shorter than shutdown", "--shutdown-timeout=60s", "--shutdown-timeout=80s", "terminationGracePeriodSeconds"},
		{".", "listen port differs", "--admin-listen=0.0.0.0:9090", "--admin-listen=0.0.0.0:9091", "admin"},
		{".", "loopback listen", "--listen=0.0.0.0:8080", "--listen=127.0.0.1:8080", "loopback"},
		{".", "undefined $(VAR)", "--replica-id=$(POD_NAME)", "--replica-id=$(POD)", "$(POD)"},
		{".", "agent addr port", "--addr=http://$(POD_IP):8000", "--addr=http://$(POD_IP):8001", "8001"},
		{".", "probe port", "port: admin\n", "port: adminx\n", "adminx"},
		{".", "service target port", "targetPort: http\n", "targetPort: htp\n", "htp"},
		{".", "pdb selector", "  minAvailable: 2\n  selector:\n    matchLabels:\n      app.kubernetes.io/component: membership-store\n", "  minAvailable: 2\n  selector:\n    matchLabels:\n      app.kubernetes.io/component: etcd\n", "PodDisruptionBudget"},
		{".", "servicemonitor port", "    port: admin\n  selector:", "    port: metrics\n  selector:", "ServiceMonitor"},
		{".", "agent endpoint", "- --endpoint=default\n        - --id=$(POD_NAME)", "- --endpoint=chat\n        - --id=$(POD_NAME)", "agents register under [chat]"},
		{".", "podmonitor port", "  - interval: 15s\n    path: /metrics\n    port: http\n", "  - interval: 15s\n    path: /metrics\n    port: metrics\n", "PodMonitor"},
		{".", "servicemonitor honorLabels", "honorLabels: true", "honorLabels: false", "honorLabels"},
		{".", "etcd initial cluster", "etcd-2=http://etcd-2.etcd:2380", "etcd-3=http://etcd-3.etcd:2380", "initial-cluster"},
		{".", "etcd endpoints", "http://etcd-2.etcd:2379", "http://etcd-9.etcd:2379", "etcd-endpoints"},
		{".", "configmap ref", "name: etcd-endpoints\n", "name: etcd-endpointz\n", "ConfigMap"},
		{".", "no readiness probe", "readinessProbe:\n          failureThreshold: 2\n          httpGet:\n            path: /readyz", "startupProbe:\n          failureThreshold: 2\n          httpGet:\n            path: /readyz", "readinessProbe"},
		{"epp-gie", "pool target port", "  - number: 8000\n", "  - number: 8001\n", "targetPort 8001"},
		{"epp-gie", "pool and agent ports", "--addr=http://$(POD_IP):8000", "--addr=http://$(POD_IP):8001", "not a targetPort of the pool"},
		{"epp-gie", "pool picker port", "    port:\n      number: 9002\n", "    port:\n      number: 9003\n", "has no port 9003"},
		{"epp-gie", "pool picker service", "    name: prefixrouter-epp\n", "    name: prefixrouter-ep\n", "prefixrouter-ep"},
		{"epp-gie", "picker reaches the admin port", "    port: 9002\n    targetPort: ext-proc\n", "    port: 9002\n    targetPort: admin\n", "not a router's ext-proc port"},
		{"epp-gie", "route backend", "kind: InferencePool\n      name: vllm", "kind: InferencePool\n      name: vlm", "vlm"},
		{"epp-gie", "unknown pool field", "    failureMode: FailClose\n", "    failurMode: FailClose\n", "unknown field"},
		{"epp-envoy", "unknown envoy field", "stat_prefix: inference", "stat_prefx: inference", "stat_prefx"},
		{"epp-envoy", "envoy constraint", "port_value: 8081", "port_value: 80810", "PortValue"},
		{"epp-envoy", "ext_proc cluster", "cluster_name: prefixrouter_epp }", "cluster_name: prefixrouter_ep }", "not defined"},
		{"epp-envoy", "picker dns name", "prefixrouter-epp-pods.prefixrouter.svc", "prefixrouter-epp-pod.prefixrouter.svc", "not a Service"},
		{"epp-envoy", "picker namespace", "prefixrouter-epp-pods.prefixrouter.svc", "prefixrouter-epp-pods.default.svc", "namespace"},
		{"epp-envoy", "body mode", "request_body_mode: FULL_DUPLEX_STREAMED", "request_body_mode: BUFFERED", "FULL_DUPLEX_STREAMED"},
		{"epp-envoy", "listener port", "port_value: 8081", "port_value: 8082", "listener port 8082"},
		{"epp-envoy", "ext-proc listen port", "--ext-proc-listen=0.0.0.0:9002", "--ext-proc-listen=0.0.0.0:9003", "ext-proc"},
		{"epp-envoy", "picker without client certificate", "              tls_certificates:\n              - certificate_chain: { filename: /etc/envoy-ext-proc-tls/tls.crt }\n                private_key: { filename: /etc/envoy-ext-proc-tls/tls.key }\n", "              tls_certificates: []\n", "presents no client certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.build+"/"+tt.name, func(t *testing.T) {
			good := builds[tt.build]
			if !strings.Contains(good, tt.old) {
				t.Fatalf("built manifests do not contain %q", tt.old)
			}
			bad := strings.Replace(good, tt.old, tt.new, 1)
			objs, err := decodeManifests([]byte(bad))
			var problems []string
			if err != nil {
				problems = []string{err.Error()}
			} else {
				problems = checkManifests(objs)
			}
			for _, p := range problems {
				if strings.Contains(p, tt.want) {
					return
				}
			}
			t.Fatalf("no problem mentions %q; got %q", tt.want, problems)
		})
	}
}

func kustomizeBuild(t *testing.T, dir string) []byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// object is one decoded manifest.
type object struct {
	kind, name string
	v          any // pointer to the typed object
}

func (o object) id() string { return o.kind + "/" + o.name }

// inferencePool is the part of the Gateway API Inference Extension's
// InferencePool (inference.networking.k8s.io/v1) that the manifests use. The
// upstream module is not on the module proxy, so this copy of its field names
// (api/v1/inferencepool_types.go) is what strict decoding checks against.
type inferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts       []poolPort `json:"targetPorts"`
		AppProtocol       string     `json:"appProtocol,omitempty"`
		EndpointPickerRef *struct {
			Group *string `json:"group,omitempty"`
			Kind  string  `json:"kind,omitempty"`
			Name  string  `json:"name"`
			Port  *struct {
				Number int32 `json:"number"`
			} `json:"port,omitempty"`
			FailureMode string `json:"failureMode,omitempty"`
		} `json:"endpointPickerRef,omitempty"`
	} `json:"spec"`
}

type poolPort struct {
	Number int32 `json:"number"`
}

// typed makes a pointer to the Go type of each apiVersion/kind.
var typed = map[string]func() any{
	"v1/Namespace":                                 func() any { return &corev1.Namespace{} },
	"v1/ConfigMap":                                 func() any { return &corev1.ConfigMap{} },
	"v1/Service":                                   func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                           func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                          func() any { return &appsv1.StatefulSet{} },
	"policy/v1/PodDisruptionBudget":                func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1/ServiceMonitor":      func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PodMonitor":          func() any { return &monitoringv1.PodMonitor{} },
	"inference.networking.k8s.io/v1/InferencePool": func() any { return &inferencePool{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":       func() any { return &httpRoute{} },
}

// newTyped returns a pointer to the Go type of apiVersion/kind.
func newTyped(apiVersion, kind string) (any, error) {
	if mk, ok := typed[apiVersion+"/"+kind]; ok {
		return mk(), nil
	}
	return nil, fmt.Errorf("no Go type known for %s %s", apiVersion, kind)
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeManifests decodes a multi-document YAML stream strictly.
func decodeManifests(stream []byte) ([]object, error) {
	var objs []object
	for i, doc := range docSep.Split(string(stream), -1) {
		var tm struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if tm.Kind == "" && tm.APIVersion == "" {
			if strings.TrimSpace(stripComments(doc)) != "" {
				return nil, fmt.Errorf("document %d has no apiVersion/kind", i)
			}
			continue // empty document
		}
		v, err := newTyped(tm.APIVersion, tm.Kind)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
			return nil, fmt.Errorf("%s %s: %w", tm.Kind, tm.Metadata.Name, err)
		}
		objs = append(objs, object{kind: tm.Kind, name: tm.Metadata.Name, v: v})
	}
	return objs, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for l := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// workload is a Deployment or StatefulSet: what the checks need of it.
type workload struct {
	id       string
	replicas int32
	selector *metav1.LabelSelector
	pod      corev1.PodTemplateSpec
}

// manifests indexes the decoded objects by kind.
type manifests struct {
	workloads       []workload
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	statefulSets    []*appsv1.StatefulSet
	pdbs            []*policyv1.PodDisruptionBudget
	serviceMonitors []*monitoringv1.ServiceMonitor
	podMonitors     []*monitoringv1.PodMonitor
	pools           []*inferencePool
	routes          []*httpRoute
	// commands collects the prefixrouter containers whose arguments parsed,
	// for the checks across pods (filled by checkPrefixrouter).
	commands *[]parsedCommand
}

// parsedCommand is a prefixrouter container's subcommand and parsed flags.
type parsedCommand struct {
	w    workload
	path string
	fs   *pflag.FlagSet
}

func index(objs []object) manifests {
	m := manifests{services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{}, commands: new([]parsedCommand)}
	for _, o := range objs {
		switch v := o.v.(type) {
		case *appsv1.Deployment:
			m.workloads = append(m.workloads, workload{o.id(), ptrOr(v.Spec.Replicas, 1), v.Spec.Selector, v.Spec.Template})
		case *appsv1.StatefulSet:
			m.workloads = append(m.workloads, workload{o.id(), ptrOr(v.Spec.Replicas, 1), v.Spec.Selector, v.Spec.Template})
			m.statefulSets = append(m.statefulSets, v)
		case *corev1.Service:
			m.services[v.Name] = v
		case *corev1.ConfigMap:
			m.configMaps[v.Name] = v
		case *policyv1.PodDisruptionBudget:
			m.pdbs = append(m.pdbs, v)
		case *monitoringv1.ServiceMonitor:
			m.serviceMonitors = append(m.serviceMonitors, v)
		case *monitoringv1.PodMonitor:
			m.podMonitors = append(m.podMonitors, v)
		case *inferencePool:
			m.pools = append(m.pools, v)
		case *httpRoute:
			m.routes = append(m.routes, v)
		}
	}
	return m
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// checkManifests returns every broken reference, one line each.
func checkManifests(objs []object) []string {
	m := index(objs)
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	for _, w := range m.workloads {
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		if err != nil || sel.Empty() {
			add("%s: selector %v is empty or invalid: %v", w.id, w.selector, err)
		} else if !sel.Matches(labels.Set(w.pod.Labels)) {
			add("%s: selector %v does not match its pod labels %v", w.id, w.selector, w.pod.Labels)
		}
		for _, v := range w.pod.Spec.Volumes {
			if v.ConfigMap != nil && m.configMaps[v.ConfigMap.Name] == nil {
				add("%s: volume %s: ConfigMap %q is not in the manifests", w.id, v.Name, v.ConfigMap.Name)
			}
		}
		for _, c := range w.pod.Spec.Containers {
			where := w.id + " container " + c.Name
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				add("%s: no cpu and memory requests", where)
			}
			if len(c.Ports) > 0 && c.ReadinessProbe == nil {
				add("%s: serves ports but has no readinessProbe", where)
			}
			if len(c.Ports) > 0 && c.LivenessProbe == nil {
				add("%s: serves ports but has no livenessProbe", where)
			}
			for name, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe} {
				if p == nil {
					continue
				}
				var port *intstr.IntOrString
				switch {
				case p.HTTPGet != nil:
					port = &p.HTTPGet.Port
				case p.TCPSocket != nil:
					port = &p.TCPSocket.Port
				case p.GRPC != nil:
					port = &intstr.IntOrString{IntVal: p.GRPC.Port}
				}
				if port != nil && !containerHasPort(c, *port) {
					add("%s: %s port %s is not a port of the container", where, name, port.String())
				}
			}
			problems = append(problems, checkEnvRefs(m, where, c)...)
			if isRouterImage(c.Image) {
				problems = append(problems, checkPrefixrouter(m, w, c)...)
			}
		}
	}

	for _, s := range m.services {
		if len(s.Spec.Selector) == 0 {
			add("Service %s: no selector", s.Name)
			continue
		}
		pods := selectWorkloads(m, labels.SelectorFromSet(s.Spec.Selector))
		if len(pods) == 0 {
			add("Service %s: selector %v matches no pod template", s.Name, s.Spec.Selector)
		}
		for _, w := range pods {
			for _, sp := range s.Spec.Ports {
				target := sp.TargetPort
				if target.Type == intstr.Int && target.IntVal == 0 {
					target = intstr.FromInt32(sp.Port)
				}
				if !podHasPort(w.pod.Spec, target) {
					add("Service %s port %s: targetPort %s is not a port of %s", s.Name, sp.Name, target.String(), w.id)
				}
			}
		}
	}

	for _, ss := range m.statefulSets {
		svc := m.services[ss.Spec.ServiceName]
		switch {
		case svc == nil:
			add("StatefulSet %s: serviceName %q is not a Service", ss.Name, ss.Spec.ServiceName)
		case svc.Spec.ClusterIP != corev1.ClusterIPNone:
			add("StatefulSet %s: Service %s is not headless: pods get no stable DNS names", ss.Name, svc.Name)
		case !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ss.Spec.Template.Labels)):
			add("StatefulSet %s: Service %s does not select its pods", ss.Name, svc.Name)
		}
		problems = append(problems, checkEtcd(m, ss)...)
	}

	for _, pdb := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() || len(selectWorkloads(m, sel)) == 0 {
			add("PodDisruptionBudget %s: selector %v matches no pod template", pdb.Name, pdb.Spec.Selector)
		}
	}

	for _, sm := range m.serviceMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil || sel.Empty() {
			add("ServiceMonitor %s: empty or invalid selector", sm.Name)
			continue
		}
		var matched []*corev1.Service
		for _, s := range m.services {
			if sel.Matches(labels.Set(s.Labels)) {
				matched = append(matched, s)
			}
		}
		if len(matched) == 0 {
			add("ServiceMonitor %s: selector matches no Service", sm.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			for _, s := range matched {
				if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
					add("ServiceMonitor %s: Service %s has no port named %q", sm.Name, s.Name, ep.Port)
				}
			}
			// The router's per-instance series label the model server
			// "instance"; without honorLabels Prometheus renames it.
			if !ep.HonorLabels {
				add("ServiceMonitor %s: endpoint %q needs honorLabels: true (the router exports an instance label)", sm.Name, ep.Port)
			}
		}
	}
	for _, pm := range m.podMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil || sel.Empty() {
			add("PodMonitor %s: empty or invalid selector", pm.Name)
			continue
		}
		pods := selectWorkloads(m, sel)
		if len(pods) == 0 {
			add("PodMonitor %s: selector matches no pod template", pm.Name)
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			for _, w := range pods {
				if ep.Port == nil || !podHasPort(w.pod.Spec, intstr.FromString(*ep.Port)) {
					add("PodMonitor %s: %s has no port named %v", pm.Name, w.id, ptrOr(ep.Port, ""))
				}
			}
		}
	}
	problems = append(problems, checkEndpoints(m)...)
	problems = append(problems, checkInferencePools(m)...)
	problems = append(problems, checkEnvoyConfig(m)...)
	return problems
}

func isRouterImage(image string) bool {
	name := image
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	name, _, _ = strings.Cut(name, ":")
	return name == routerImage
}

func selectWorkloads(m manifests, sel labels.Selector) []workload {
	var out []workload
	for _, w := range m.workloads {
		if sel.Matches(labels.Set(w.pod.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

func containerHasPort(c corev1.Container, p intstr.IntOrString) bool {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return true
		}
	}
	return false
}

func podHasPort(spec corev1.PodSpec, p intstr.IntOrString) bool {
	return slices.ContainsFunc(spec.Containers, func(c corev1.Container) bool { return containerHasPort(c, p) })
}

// containerEnv resolves the container's environment as the kubelet would,
// with sample values for the downward API; ok is false for names that come
// from nowhere the manifests define.
func containerEnv(m manifests, c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			if cm := m.configMaps[ef.ConfigMapRef.Name]; cm != nil {
				for k, v := range cm.Data {
					env[ef.Prefix+k] = v
				}
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expandVars(e.Value, env)
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = map[string]string{"metadata.name": "pod-0", "status.podIP": "10.1.2.3", "metadata.namespace": "prefixrouter"}[e.ValueFrom.FieldRef.FieldPath]
		case e.ValueFrom.ConfigMapKeyRef != nil:
			if cm := m.configMaps[e.ValueFrom.ConfigMapKeyRef.Name]; cm != nil {
				env[e.Name] = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
			}
		default:
			env[e.Name] = "secret"
		}
	}
	return env
}

func checkEnvRefs(m manifests, where string, c corev1.Container) []string {
	var problems []string
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil && m.configMaps[ef.ConfigMapRef.Name] == nil {
			problems = append(problems, fmt.Sprintf("%s: envFrom ConfigMap %q is not in the manifests", where, ef.ConfigMapRef.Name))
		}
	}
	for _, e := range c.Env {
		if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil {
			cm := m.configMaps[r.ConfigMapKeyRef.Name]
			if cm == nil {
				problems = append(problems, fmt.Sprintf("%s: env %s: ConfigMap %q is not in the manifests", where, e.Name, r.ConfigMapKeyRef.Name))
			} else if _, ok := cm.Data[r.ConfigMapKeyRef.Key]; !ok {
				problems = append(problems, fmt.Sprintf("%s: env %s: ConfigMap %q has no key %q", where, e.Name, cm.Name, r.ConfigMapKeyRef.Key))
			}
		}
	}
	env := containerEnv(m, c)
	for _, arg := range slices.Concat(c.Command, c.Args) {
		for _, ref := range varRef.FindAllStringSubmatch(arg, -1) {
			if _, ok := env[ref[1]]; !ok {
				problems = append(problems, fmt.Sprintf("%s: argument %q refers to $(%s), which the container's env does not define", where, arg, ref[1]))
			}
		}
	}
	return problems
}

// varRef is the kubelet's $(VAR) reference in command and args.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func expandVars(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// checkPrefixrouter parses a prefixrouter container's arguments and
// PREFIXROUTER_* variables with the subcommand's own flag set, then checks
// what they must agree with in the pod.
func checkPrefixrouter(m manifests, w workload, c corev1.Container) []string {
	where := w.id + " container " + c.Name
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, where+": "+fmt.Sprintf(format, args...))
	}
	if len(c.Command) > 0 {
		add("sets command %q; the image's entrypoint is the binary, give the subcommand in args", c.Command)
		return problems
	}
	env := containerEnv(m, c)
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		args[i] = expandVars(a, env)
	}
	cmd, rest, err := newRootCmd().Find(args)
	if err != nil || !cmd.Runnable() {
		add("args %q name no runnable subcommand: %v", c.Args, err)
		return problems
	}
	path := strings.TrimPrefix(cmd.CommandPath(), "prefixrouter ")
	fs := cmd.Flags()
	if err := cmd.ParseFlags(rest); err != nil {
		add("%s: %v", path, err)
		return problems
	}
	if fs.NArg() > 0 {
		add("%s takes no positional arguments, got %q", path, fs.Args())
	}
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if !strings.HasPrefix(k, "PREFIXROUTER_") {
			continue
		}
		var flag *pflag.Flag
		fs.VisitAll(func(f *pflag.Flag) {
			if envName(f.Name) == k {
				flag = f
			}
		})
		if flag == nil {
			add("%s has no flag for environment variable %s", path, k)
			continue
		}
		if !flag.Changed {
			if err := fs.Set(flag.Name, env[k]); err != nil {
				add("%s=%q: %v", k, env[k], err)
			}
		}
	}
	*m.commands = append(*m.commands, parsedCommand{w, path, fs})
	grace := time.Duration(ptrOr(w.pod.Spec.TerminationGracePeriodSeconds, corev1.DefaultTerminationGracePeriodSeconds)) * time.Second
	switch path {
	case "serve":
		problems = append(problems, checkServe(where, w, c, fs, grace)...)
	case "register":
		problems = append(problems, checkRegister(where, w, c, fs, grace)...)
	}
	if f := fs.Lookup("etcd-endpoints"); f != nil {
		eps, _ := fs.GetStringSlice("etcd-endpoints")
		if err := (membership.ClientOptions{Endpoints: eps}).Validate(); err != nil {
			add("%v", err)
		}
	}
	return problems
}

// listenPorts maps the container port names a serve container must declare
// to the flag that listens on them.
var listenPorts = map[string]string{"http": "listen", "admin": "admin-listen", "ext-proc": "ext-proc-listen"}

func checkServe(where string, w workload, c corev1.Container, fs *pflag.FlagSet, grace time.Duration) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, where+": "+fmt.Sprintf(format, args...))
	}
	for _, cp := range c.Ports {
		flag, ok := listenPorts[cp.Name]
		if !ok {
			add("port %q is not one serve listens on (%v)", cp.Name, listenPorts)
			continue
		}
		f := fs.Lookup(flag)
		if f == nil {
			add("port %q: serve has no --%s", cp.Name, flag)
			continue
		}
		host, port, err := net.SplitHostPort(f.Value.String())
		if err != nil {
			add("--%s=%s: %v", flag, f.Value, err)
			continue
		}
		if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
			add("--%s=%s listens on loopback: nothing outside the pod reaches it", flag, f.Value)
		}
		if port != strconv.Itoa(int(cp.ContainerPort)) {
			add("port %q is %d but --%s listens on %s", cp.Name, cp.ContainerPort, flag, f.Value)
		}
	}
	shutdown, _ := fs.GetDuration("shutdown-timeout")
	need := shutdown + preStopSleep(c)
	if grace <= need {
		add("terminationGracePeriodSeconds %v must exceed the preStop sleep plus --shutdown-timeout (%v)", grace, need)
	}
	return problems
}

func preStopSleep(c corev1.Container) time.Duration {
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		return time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	return 0
}

func checkRegister(where string, w workload, c corev1.Container, fs *pflag.FlagSet, grace time.Duration) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, where+": "+fmt.Sprintf(format, args...))
	}
	drain, _ := fs.GetDuration("drain-timeout")
	if need := drain + agent.EtcdCallTimeout; grace <= need {
		add("terminationGracePeriodSeconds %v must exceed --drain-timeout plus the revoke (%v), or the kubelet kills the drain", grace, need)
	}
	addr := fs.Lookup("addr").Value.String()
	u, err := url.Parse(addr)
	if err != nil || u.Port() == "" {
		add("--addr %q is not a URL with a port", addr)
		return problems
	}
	if u.Hostname() != "10.1.2.3" {
		add("--addr %q does not use the pod IP (status.podIP through the downward API)", addr)
	}
	port, _ := strconv.Atoi(u.Port())
	var server *corev1.Container
	for i := range w.pod.Spec.Containers {
		if containerHasPort(w.pod.Spec.Containers[i], intstr.FromInt(port)) {
			server = &w.pod.Spec.Containers[i]
		}
	}
	if server == nil {
		add("--addr port %d is not a port of any container in the pod", port)
		return problems
	}
	// The model server must outlive the agent's drain: its preStop hook
	// waits for the agent, which it can only see in a shared PID namespace.
	if server.Lifecycle == nil || server.Lifecycle.PreStop == nil || server.Lifecycle.PreStop.Exec == nil {
		add("container %s (the model server) has no preStop hook holding its SIGTERM until the agent has drained", server.Name)
	} else if !strings.Contains(strings.Join(server.Lifecycle.PreStop.Exec.Command, " "), "refixrouter") {
		add("container %s's preStop hook does not wait for the agent", server.Name)
	}
	if !ptrOr(w.pod.Spec.ShareProcessNamespace, false) {
		add("pod needs shareProcessNamespace: true so the model server's preStop hook sees the agent")
	}
	return problems
}

// checkEtcd checks an etcd StatefulSet's initial cluster against its pod
// names and headless Service, and the etcd-endpoints ConfigMap against its
// members.
func checkEtcd(m manifests, ss *appsv1.StatefulSet) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf("StatefulSet %s: ", ss.Name)+fmt.Sprintf(format, args...))
	}
	var c *corev1.Container
	for i := range ss.Spec.Template.Spec.Containers {
		if slices.Contains(ss.Spec.Template.Spec.Containers[i].Command, "etcd") {
			c = &ss.Spec.Template.Spec.Containers[i]
		}
	}
	if c == nil {
		return nil
	}
	flags := map[string]string{}
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
			flags[k] = v
		}
	}
	port := func(name string) int32 {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
		add("container %s has no port %q", c.Name, name)
		return 0
	}
	peer, client := port("peer"), port("client")
	n := int(ptrOr(ss.Spec.Replicas, 1))
	var wantCluster, wantEndpoints []string
	for i := range n {
		pod := fmt.Sprintf("%s-%d", ss.Name, i)
		host := pod + "." + ss.Spec.ServiceName
		wantCluster = append(wantCluster, fmt.Sprintf("%s=http://%s:%d", pod, host, peer))
		wantEndpoints = append(wantEndpoints, fmt.Sprintf("http://%s:%d", host, client))
	}
	if got := flags["initial-cluster"]; got != strings.Join(wantCluster, ",") {
		add("--initial-cluster=%s; the pods' stable names are %s", got, strings.Join(wantCluster, ","))
	}
	if n%2 == 0 || n < 3 {
		add("%d members: use 3 or 5 for a quorum that survives a member's loss", n)
	}
	if cm := m.configMaps["etcd-endpoints"]; cm != nil {
		if got := cm.Data["PREFIXROUTER_ETCD_ENDPOINTS"]; got != strings.Join(wantEndpoints, ",") {
			add("ConfigMap etcd-endpoints lists %q, the members are %q", got, strings.Join(wantEndpoints, ","))
		}
	} else {
		problems = append(problems, "ConfigMap etcd-endpoints is missing beside the etcd StatefulSet")
	}
	return problems
}

// TestDockerfileMatchesManifests: the manifests rely on the image's last
// stage running the binary as its entrypoint (args start with the
// subcommand; the model server's preStop hook finds the agent by
// "prefixrouter" in its command line) as a numeric user (runAsNonRoot can
// only verify a number).
func TestDockerfileMatchesManifests(t *testing.T) {
	b, err := os.ReadFile("../../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := regexp.MustCompile(`(?m)^FROM `).Split(string(b), -1)
	last := stages[len(stages)-1]
	if !regexp.MustCompile(`(?m)^ENTRYPOINT \["/prefixrouter"\]\s*$`).MatchString(last) {
		t.Errorf("the last stage's ENTRYPOINT is not [\"/prefixrouter\"]")
	}
	if !regexp.MustCompile(`(?m)^USER [0-9]+(:[0-9]+)?\s*$`).MatchString(last) {
		t.Errorf("the last stage has no numeric USER")
	}
	if !regexp.MustCompile(`(?m)^COPY --from=\S+ /prefixrouter /prefixrouter\s*$`).MatchString(last) {
		t.Errorf("the last stage does not copy the binary to /prefixrouter")
	}
}

// checkEndpoints: the agents register under the endpoint the routers serve
// by default (otherwise clients of /v1/* and /invocations reach nothing).
func checkEndpoints(m manifests) []string {
	var serve []string
	registered := map[string]bool{}
	for _, pc := range *m.commands {
		ep, _ := pc.fs.GetString("endpoint")
		switch pc.path {
		case "serve":
			serve = append(serve, ep)
		case "register":
			registered[ep] = true
		}
	}
	var problems []string
	for _, ep := range serve {
		if len(registered) > 0 && !registered[ep] {
			problems = append(problems, fmt.Sprintf("serve --endpoint=%s, but the agents register under %v", ep, slices.Sorted(maps.Keys(registered))))
		}
	}
	return problems
}
