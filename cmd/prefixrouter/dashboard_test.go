package main

// The Grafana dashboard in deploy/grafana queries metrics by name. These
// tests take every name out of its PromQL expressions and check it against
// what a live router replica exports after traffic, an upstream failure, a
// dial error and a membership change (and vLLM's names against a simulated
// model server's), so that a renamed or removed metric fails here and not on
// an operator's empty panel.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/localfleet"
	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/probe"
)

const dashboardFile = "../../deploy/grafana/prefixrouter.json"

// dashboardPanel is the part of a Grafana panel the test reads; rows nest
// their panels when collapsed.
type dashboardPanel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

type dashboard struct {
	UID        string           `json:"uid"`
	Panels     []dashboardPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// dashboardQueries returns every PromQL expression of the dashboard and the
// metric names its template variables query (label_values(metric, label)).
func dashboardQueries(t *testing.T) (exprs []string, varMetrics []string) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" {
		t.Errorf("%s: no uid (imports would duplicate the dashboard)", dashboardFile)
	}
	ids := map[int]bool{}
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("variable %s: query is neither an object nor a string", v.Name)
			}
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: query %q is not label_values(metric, label)", v.Name, q.Query)
		}
		varMetrics = append(varMetrics, m[1])
	}
	return exprs, varMetrics
}

// promqlAggregations are the aggregation operators, which may take their
// grouping before the parenthesis: sum by (x) (...).
var promqlAggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

// promqlKeywords are identifiers that are not metric names where they
// appear without a following "(": binary operators, modifiers and literals.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true,
}

// promqlMetricNames returns the metric names an expression selects, in
// order of appearance. It tokenizes as PromQL does where it matters here:
// string literals, label matchers ({...}), ranges and subqueries ([...]),
// numbers and durations, grouping label lists (by (...), on (...), ...),
// Grafana variables ($x, ${x}) and function or aggregation names (an
// identifier followed by "(").
func promqlMetricNames(expr string) ([]string, error) {
	var names []string
	s := expr
	i := 0
	skipSpace := func() {
		for i < len(s) && strings.ContainsRune(" \t\r\n", rune(s[i])) {
			i++
		}
	}
	// skipString skips the literal starting at s[i].
	skipString := func() error {
		q := s[i]
		for j := i + 1; j < len(s); j++ {
			if s[j] == '\\' && q != '`' {
				j++
				continue
			}
			if s[j] == q {
				i = j + 1
				return nil
			}
		}
		return fmt.Errorf("unterminated string in %q", expr)
	}
	// skipGroup skips from the opening bracket at s[i] to its match.
	skipGroup := func(open, close byte) error {
		depth := 0
		for i < len(s) {
			switch c := s[i]; {
			case c == '"' || c == '\'' || c == '`':
				if err := skipString(); err != nil {
					return err
				}
				continue
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					i++
					return nil
				}
			}
			i++
		}
		return fmt.Errorf("unbalanced %c in %q", open, expr)
	}
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') }
	isIdent := func(c byte) bool { return isIdentStart(c) || ('0' <= c && c <= '9') }
	for {
		skipSpace()
		if i >= len(s) {
			return names, nil
		}
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			if err := skipString(); err != nil {
				return nil, err
			}
		case c == '{':
			if err := skipGroup('{', '}'); err != nil {
				return nil, err
			}
		case c == '[':
			if err := skipGroup('[', ']'); err != nil {
				return nil, err
			}
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				if err := skipGroup('{', '}'); err != nil {
					return nil, err
				}
				continue
			}
			for i < len(s) && isIdent(s[i]) {
				i++
			}
		case '0' <= c && c <= '9' || (c == '.' && i+1 < len(s) && '0' <= s[i+1] && s[i+1] <= '9'):
			// A number (1, 0.99, 1e-3, 0x1f) or a duration (5m, 1h30m).
			for i < len(s) && (isIdent(s[i]) || s[i] == '.' || ((s[i] == '+' || s[i] == '-') && (s[i-1] == 'e' || s[i-1] == 'E'))) {
				i++
			}
		case isIdentStart(c):
			j := i
			for i < len(s) && isIdent(s[i]) {
				i++
			}
			word := s[j:i]
			skipSpace()
			next := byte(0)
			if i < len(s) {
				next = s[i]
			}
			switch lw := strings.ToLower(word); {
			case lw == "by" || lw == "without" || lw == "on" || lw == "ignoring" || lw == "group_left" || lw == "group_right":
				if next == '(' {
					if err := skipGroup('(', ')'); err != nil {
						return nil, err
					}
				}
			case promqlKeywords[lw]:
			case next == '(':
				// A function or aggregation; its arguments are scanned next.
			case promqlAggregations[lw] && (hasWordAt(s, i, "by") || hasWordAt(s, i, "without")):
				// An aggregation with its grouping first.
			default:
				names = append(names, word)
			}
		default:
			i++ // operators, parentheses, commas
		}
	}
}

// hasWordAt reports whether s has the keyword w at i, not as the start of a
// longer identifier.
func hasWordAt(s string, i int, w string) bool {
	if len(s)-i < len(w) || !strings.EqualFold(s[i:i+len(w)], w) {
		return false
	}
	j := i + len(w)
	return j == len(s) || !(s[j] == '_' || s[j] == ':' || ('a' <= s[j] && s[j] <= 'z') || ('A' <= s[j] && s[j] <= 'Z') || ('0' <= s[j] && s[j] <= '9'))
}

func TestPromqlMetricNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (decision) (rate(a_total{endpoint=~"$endpoint", code=~"4..|5.."}[$__rate_interval]))`, []string{"a_total"}},
		{`histogram_quantile(0.99, sum by (le, strategy) (rate(b_bucket[5m])))`, []string{"b_bucket"}},
		{`sum(rate(x[1m])) / on (endpoint) group_left (instance) y * 1e-3 + 0.5`, []string{"x", "y"}},
		{`max by (endpoint, instance) (c{endpoint=~"$endpoint"} >= 0) or vector(0)`, []string{"c"}},
		{`label_replace(d, "dst", "$1 {x} [y] by (z)", "src", "(.*)")`, []string{"d"}},
		{`e offset 5m unless f @ 1609746000 and bool g`, []string{"e", "f", "g"}},
		{`sum without (pod) (h{a='}', b="\"]"}) - Inf + NaN`, []string{"h"}},
		{`rate(i[${__interval}]) > ${threshold}`, []string{"i"}},
		{`vllm:num_requests_running + sum(rate(j[5m:1m]))`, []string{"vllm:num_requests_running", "j"}},
		{`1 / count by (endpoint) (max by (endpoint, instance) (k))`, []string{"k"}},
	}
	for _, tt := range tests {
		got, err := promqlMetricNames(tt.expr)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("promqlMetricNames(%q) = %q, %v; want %q", tt.expr, got, err, tt.want)
		}
	}
	for _, bad := range []string{`a{b="c"`, `rate(a[5m)`, `a{b="c}`} {
		if _, err := promqlMetricNames(bad); err == nil {
			t.Errorf("promqlMetricNames(%q): no error", bad)
		}
	}
}

// exportedNames lists the sample names an exposition carries: a histogram
// family's _bucket, _sum and _count, a summary's quantiles, _sum and _count.
func exportedNames(m probe.Metrics) map[string]bool {
	out := map[string]bool{}
	for name, f := range m {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			out[name], out[name+"_sum"], out[name+"_count"] = true, true, true
		default:
			out[name] = true
		}
	}
	return out
}

// dashboardMetrics returns every metric name the dashboard queries, and how
// many expressions it has.
func dashboardMetrics(t *testing.T) (map[string]bool, int) {
	t.Helper()
	exprs, varMetrics := dashboardQueries(t)
	want := map[string]bool{}
	for _, e := range exprs {
		names, err := promqlMetricNames(e)
		if err != nil {
			t.Fatal(err)
		}
		if len(names) == 0 {
			t.Errorf("expression selects no metric: %s", e)
		}
		for _, n := range names {
			want[n] = true
		}
	}
	for _, n := range varMetrics {
		want[n] = true
	}
	if len(want) < 10 {
		t.Errorf("the dashboard queries only %d metrics: %v", len(want), want)
	}
	return want, len(exprs)
}

// checkExported fails the test for every name in want that neither the
// replica's exposition (have) nor, for vLLM's names, the model server's
// exports.
func checkExported(t *testing.T, want, have, haveServer map[string]bool) {
	t.Helper()
	for name := range want {
		switch {
		case strings.HasPrefix(name, "vllm:"):
			if !haveServer[name] {
				t.Errorf("the dashboard queries %s; the model server does not export it", name)
			}
		case !have[name]:
			t.Errorf("the dashboard queries %s; the replica does not export it", name)
		}
	}
}

// startDashboardTest skips in -short mode (the tests start etcd, model
// servers and a router replica), checks at the end that the fleet's
// goroutines (etcd, agents, replica, simulators) are all gone, and returns
// the dashboard's metric names and a context for the test.
func startDashboardTest(t *testing.T) (want map[string]bool, nExprs int, ctx context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd, model servers and a router replica")
	}
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	want, nExprs = dashboardMetrics(t)
	return want, nExprs, testsupport.Context(t, 2*time.Minute)
}

func TestDashboardQueriesExportedMetrics(t *testing.T) {
	want, nExprs, ctx := startDashboardTest(t)
	const threshold = 7
	f, err := localfleet.Start(ctx, localfleet.Options{
		Instances: 3, Replicas: 1,
		Sim: sim.Options{TimeScale: 1000},
		// The crashed instance stays registered this long, so requests
		// meet its refused connections and are retried.
		TTL:          30 * time.Second,
		DrainTimeout: time.Second,
		Routing: fleet.RoutingConfig{RoutingStrategy: fleet.PrefixAware,
			PrefixAwareRoutingConfig: &fleet.PrefixAwareConfig{PrefixLength: fleet.MinPrefixLength, ConcurrencyThreshold: threshold}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep := f.Replicas()[0]
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	n := 0
	send := func() {
		n++
		body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":"%08d %s"}]}`, sim.DefaultBaseModel, n, strings.Repeat("x", 200))
		resp, err := client.Post(rep.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	scrape := func() probe.Metrics {
		m, err := probe.Scrape(ctx, client, "http://"+rep.AdminAddr()+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// sendUntil sends distinct prefixes (each lands on its own primary)
	// until the metric counts something (its series exist at 0 from the
	// start), at most 200 requests.
	sendUntil := func(metric string) {
		t.Helper()
		for range 200 {
			send()
			if n, err := scrape().Sum(metric); err == nil && n > 0 {
				return
			}
		}
		t.Fatalf("%s counted nothing after 200 requests", metric)
	}

	for range 10 {
		send()
	}
	insts := f.Instances()
	insts[0].SetFault(localfleet.FaultError)
	sendUntil("prefixrouter_upstream_errors_total")
	insts[0].SetFault(localfleet.FaultNone)
	f.CrashInstance(insts[1])
	sendUntil("prefixrouter_retries_total")
	added, err := f.AddInstance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	joined := func(s *fleet.Snapshot) bool {
		ep := s.Endpoint(f.Endpoint())
		return ep != nil && slices.ContainsFunc(ep.Instances, func(in fleet.Instance) bool { return in.ID == added.ID })
	}
	if err := f.WaitFor(ctx, joined); err != nil {
		t.Fatal(err)
	}

	m := scrape()
	have := exportedNames(m)
	// vLLM's own series come from the model servers (the simulator exports
	// vLLM v1's names), everything else from the router replica.
	sm, err := probe.Scrape(ctx, client, f.Instances()[0].URL()+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	haveServer := exportedNames(sm)
	t.Logf("%d expressions query %d metric names; the replica exports %d, a model server %d", nExprs, len(want), len(have), len(haveServer))
	checkExported(t, want, have, haveServer)
	for _, s := range m.Series("prefixrouter_endpoint_concurrency_threshold") {
		if s.Value != threshold {
			t.Errorf("prefixrouter_endpoint_concurrency_threshold%v = %v, want %d", s.Labels, s.Value, threshold)
		}
	}
}

// TestDashboardSeriesAtZeroOnAHealthyReplica: a replica that has served
// nothing, on a healthy fleet, already exports every series the dashboard
// queries, so that no panel says "No data"; the counters of events that did
// not happen read 0 (issue 18). The keys-moved histogram is only checked to
// exist: instances joining after the replica's first snapshot are
// membership changes it counts.
func TestDashboardSeriesAtZeroOnAHealthyReplica(t *testing.T) {
	want, _, ctx := startDashboardTest(t)
	f, err := localfleet.Start(ctx, localfleet.Options{Instances: 2, Replicas: 1, FastEtcd: true, Sim: sim.Options{TimeScale: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ids []string
	for _, in := range f.Instances() {
		ids = append(ids, in.ID)
	}
	if err := f.WaitFor(ctx, f.HasInstances(ids...)); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	m, err := probe.Scrape(ctx, client, "http://"+f.Replicas()[0].AdminAddr()+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	sm, err := probe.Scrape(ctx, client, f.Instances()[0].URL()+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	checkExported(t, want, exportedNames(m), exportedNames(sm))
	for name, fam := range m {
		if !want[name] && !want[name+"_bucket"] {
			continue
		}
		for _, s := range fam.GetMetric() {
			var v float64
			switch {
			case fam.GetType() == dto.MetricType_COUNTER:
				v = s.GetCounter().GetValue()
			case fam.GetType() == dto.MetricType_HISTOGRAM && name != "prefixrouter_keys_moved_ratio":
				v = float64(s.GetHistogram().GetSampleCount())
			}
			if name == "prefixrouter_membership_relists_total" && slices.ContainsFunc(s.GetLabel(), func(l *dto.LabelPair) bool { return l.GetValue() == "start" }) {
				continue // the one list at start
			}
			if v != 0 {
				t.Errorf("%s%v = %v on a replica that served nothing, want 0", name, s.GetLabel(), v)
			}
		}
	}
}
