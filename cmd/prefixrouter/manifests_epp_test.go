package main

// Checks of the EPP-mode example (deploy/kubernetes/epp): the InferencePool
// and HTTPRoute against the pods and Services, and the plain Envoy's
// bootstrap, decoded strictly into Envoy's own proto types.

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // resolves the router filter's Any
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // resolves HttpProtocolOptions
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// httpRoute is the part of the Gateway API's HTTPRoute
// (gateway.networking.k8s.io/v1) that the manifests use, with the upstream
// field names; the upstream module needs a newer Go than this one.
type httpRoute struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ParentRefs []struct {
			Group       *string `json:"group,omitempty"`
			Kind        *string `json:"kind,omitempty"`
			Namespace   *string `json:"namespace,omitempty"`
			Name        string  `json:"name"`
			SectionName *string `json:"sectionName,omitempty"`
			Port        *int32  `json:"port,omitempty"`
		} `json:"parentRefs"`
		Hostnames []string `json:"hostnames,omitempty"`
		Rules     []struct {
			Matches []struct {
				Path *struct {
					Type  string `json:"type"`
					Value string `json:"value"`
				} `json:"path,omitempty"`
			} `json:"matches,omitempty"`
			BackendRefs []struct {
				Group  *string `json:"group,omitempty"`
				Kind   *string `json:"kind,omitempty"`
				Name   string  `json:"name"`
				Port   *int32  `json:"port,omitempty"`
				Weight *int32  `json:"weight,omitempty"`
			} `json:"backendRefs,omitempty"`
			Timeouts *struct {
				Request        *string `json:"request,omitempty"`
				BackendRequest *string `json:"backendRequest,omitempty"`
			} `json:"timeouts,omitempty"`
		} `json:"rules"`
	} `json:"spec"`
}

func checkInferencePools(m manifests) []string {
	var problems []string
	for _, p := range m.pools {
		add := func(format string, args ...any) {
			problems = append(problems, "InferencePool "+p.Name+": "+fmt.Sprintf(format, args...))
		}
		if len(p.Spec.Selector.MatchLabels) == 0 {
			add("empty selector")
			continue
		}
		pods := selectWorkloads(m, labels.SelectorFromSet(p.Spec.Selector.MatchLabels))
		if len(pods) == 0 {
			add("selector %v matches no pod template", p.Spec.Selector.MatchLabels)
		}
		if len(p.Spec.TargetPorts) == 0 {
			add("no targetPorts")
		}
		for _, w := range pods {
			for _, tp := range p.Spec.TargetPorts {
				if !podHasPort(w.pod.Spec, intstr.FromInt32(tp.Number)) {
					add("targetPort %d is not a port of %s", tp.Number, w.id)
				}
			}
			// The gateway's subset hint lists pool endpoints (pod IP and
			// target port); the picker matches them against the addresses
			// the agents registered, so the ports must agree.
			for _, pc := range *m.commands {
				if pc.path != "register" || pc.w.id != w.id {
					continue
				}
				u, err := url.Parse(pc.fs.Lookup("addr").Value.String())
				if err != nil || !slices.ContainsFunc(p.Spec.TargetPorts, func(tp poolPort) bool { return strconv.Itoa(int(tp.Number)) == u.Port() }) {
					add("the agents in %s register port %s, not a targetPort of the pool", w.id, u.Port())
				}
			}
		}
		ref := p.Spec.EndpointPickerRef
		if ref == nil {
			add("no endpointPickerRef: the gateway would not ask prefixrouter")
			continue
		}
		if ref.Kind != "" && ref.Kind != "Service" || ref.Group != nil && *ref.Group != "" {
			add("endpointPickerRef names a %s, the manifests give a Service", ref.Kind)
		}
		if !slices.Contains([]string{"", "FailOpen", "FailClose"}, ref.FailureMode) {
			add("failureMode %q is not FailOpen or FailClose", ref.FailureMode)
		}
		if ref.Port == nil {
			add("endpointPickerRef has no port (required for a Service)")
			continue
		}
		problems = append(problems, checkPickerService(m, "InferencePool "+p.Name+": endpointPickerRef", ref.Name, ref.Port.Number)...)
	}
	for _, r := range m.routes {
		for _, rule := range r.Spec.Rules {
			for _, b := range rule.BackendRefs {
				if ptrOr(b.Kind, "Service") == "InferencePool" {
					if !slices.ContainsFunc(m.pools, func(p *inferencePool) bool { return p.Name == b.Name }) {
						problems = append(problems, fmt.Sprintf("HTTPRoute %s: backendRef InferencePool %q is not in the manifests", r.Name, b.Name))
					}
					if ptrOr(b.Group, "") != "inference.networking.k8s.io" {
						problems = append(problems, fmt.Sprintf("HTTPRoute %s: backendRef %s needs group inference.networking.k8s.io", r.Name, b.Name))
					}
				} else if m.services[b.Name] == nil {
					problems = append(problems, fmt.Sprintf("HTTPRoute %s: backendRef Service %q is not in the manifests", r.Name, b.Name))
				}
			}
		}
	}
	return problems
}

// checkPickerService checks that Service name has port number, and that its
// target is a router container's ext-proc port (which checkServe ties to
// --ext-proc-listen).
func checkPickerService(m manifests, where, name string, number int32) []string {
	svc := m.services[name]
	if svc == nil {
		return []string{fmt.Sprintf("%s: Service %q is not in the manifests", where, name)}
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == number })
	if i < 0 {
		return []string{fmt.Sprintf("%s: Service %s has no port %d", where, name, number)}
	}
	target := svc.Spec.Ports[i].TargetPort
	var problems []string
	for _, w := range selectWorkloads(m, labels.SelectorFromSet(svc.Spec.Selector)) {
		for _, c := range w.pod.Spec.Containers {
			for _, cp := range c.Ports {
				if (target.Type == intstr.String && cp.Name == target.StrVal) || (target.Type == intstr.Int && cp.ContainerPort == target.IntVal) {
					if !isRouterImage(c.Image) || cp.Name != "ext-proc" {
						problems = append(problems, fmt.Sprintf("%s: Service %s port %d reaches %s port %q, not a router's ext-proc port", where, name, number, w.id, cp.Name))
					}
				}
			}
		}
	}
	return problems
}

// checkEnvoyConfig decodes every envoy.yaml of a ConfigMap strictly into
// Envoy's bootstrap, validates it with Envoy's own constraints, and checks
// its references: routes and the ext_proc filter name clusters that exist,
// DNS clusters name Services (and ports) of the manifests, and the pods that
// mount the ConfigMap declare the listener ports.
func checkEnvoyConfig(m manifests) []string {
	var problems []string
	for _, cm := range m.configMaps {
		src, ok := cm.Data["envoy.yaml"]
		if !ok {
			continue
		}
		add := func(format string, args ...any) {
			problems = append(problems, "ConfigMap "+cm.Name+" envoy.yaml: "+fmt.Sprintf(format, args...))
		}
		js, err := yaml.YAMLToJSON([]byte(src))
		if err != nil {
			add("%v", err)
			continue
		}
		var bs bootstrapv3.Bootstrap
		if err := protojson.Unmarshal(js, &bs); err != nil {
			add("%v", err)
			continue
		}
		if err := bs.ValidateAll(); err != nil {
			add("%v", err)
		}
		clusters := map[string]*clusterv3.Cluster{}
		for _, c := range bs.GetStaticResources().GetClusters() {
			clusters[c.GetName()] = c
		}
		needCluster := func(what, name string) {
			if clusters[name] == nil {
				add("%s names cluster %q, which is not defined", what, name)
			}
		}
		var ports []uint32
		extProc, pickerCluster := false, ""
		for _, l := range bs.GetStaticResources().GetListeners() {
			if sa := l.GetAddress().GetSocketAddress(); sa != nil && !isLoopback(sa.GetAddress()) {
				ports = append(ports, sa.GetPortValue())
			}
			for _, fc := range l.GetFilterChains() {
				for _, f := range fc.GetFilters() {
					var hcm hcmv3.HttpConnectionManager
					if f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
						continue
					}
					for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
						for _, r := range vh.GetRoutes() {
							if c := r.GetRoute().GetCluster(); c != "" {
								needCluster("listener "+l.GetName()+" route", c)
							}
						}
					}
					for _, hf := range hcm.GetHttpFilters() {
						var ep extprocv3.ExternalProcessor
						if hf.GetTypedConfig().UnmarshalTo(&ep) != nil {
							continue
						}
						extProc = true
						pickerCluster = ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()
						needCluster("the ext_proc filter", pickerCluster)
						pm := ep.GetProcessingMode()
						if pm.GetRequestBodyMode() != extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED || pm.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND {
							add("the ext_proc filter must stream request bodies FULL_DUPLEX_STREAMED and send trailers (docs/envoy.md)")
						}
						if !slices.Contains(ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), "envoy.lb") {
							add("the ext_proc filter does not forward the envoy.lb metadata namespace")
						}
					}
				}
			}
		}
		if !extProc {
			add("no ext_proc filter")
		}
		if c := clusters[pickerCluster]; c != nil {
			// The routers count the outcomes only of an authenticated
			// peer (issue 19).
			var tc tlsv3.UpstreamTlsContext
			if c.GetTransportSocket().GetTypedConfig().UnmarshalTo(&tc) != nil || len(tc.GetCommonTlsContext().GetTlsCertificates()) == 0 {
				add("cluster %s presents no client certificate: the routers would not count Envoy's outcome reports (docs/security.md)", pickerCluster)
			}
		}
		for _, c := range clusters {
			if c.GetType() != clusterv3.Cluster_STRICT_DNS && c.GetType() != clusterv3.Cluster_LOGICAL_DNS {
				continue
			}
			for _, le := range c.GetLoadAssignment().GetEndpoints() {
				for _, lb := range le.GetLbEndpoints() {
					where := "ConfigMap " + cm.Name + " envoy.yaml: cluster " + c.GetName()
					sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
					svc, more := checkDNSEndpoint(m, cm.Namespace, where, sa)
					problems = append(problems, more...)
					if svc != nil && c.GetName() == pickerCluster {
						problems = append(problems, checkPickerService(m, where, svc.Name, int32(sa.GetPortValue()))...)
					}
				}
			}
		}
		mounted := false
		for _, w := range m.workloads {
			if !slices.ContainsFunc(w.pod.Spec.Volumes, func(v corev1.Volume) bool { return v.ConfigMap != nil && v.ConfigMap.Name == cm.Name }) {
				continue
			}
			mounted = true
			for _, p := range ports {
				if !podHasPort(w.pod.Spec, intstr.FromInt32(int32(p))) {
					add("listener port %d is not a container port of %s", p, w.id)
				}
			}
		}
		if !mounted {
			add("no pod mounts it")
		}
	}
	return problems
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// checkDNSEndpoint checks that a DNS name in an Envoy cluster is a Service of
// the manifests (<service>[.<namespace>[.svc[...]]]) with that port, and
// returns the Service.
func checkDNSEndpoint(m manifests, namespace, where string, sa *corev3.SocketAddress) (*corev1.Service, []string) {
	host := sa.GetAddress()
	if net.ParseIP(host) != nil {
		return nil, nil
	}
	parts := strings.Split(host, ".")
	svc := m.services[parts[0]]
	switch {
	case svc == nil:
		return nil, []string{fmt.Sprintf("%s: %s is not a Service of the manifests", where, host)}
	case len(parts) > 1 && namespace != "" && parts[1] != namespace:
		return nil, []string{fmt.Sprintf("%s: %s names namespace %q, the manifests are in %q", where, host, parts[1], namespace)}
	case !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return uint32(p.Port) == sa.GetPortValue() }):
		return nil, []string{fmt.Sprintf("%s: Service %s has no port %d", where, svc.Name, sa.GetPortValue())}
	}
	return svc, nil
}
