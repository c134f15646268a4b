package testsupport

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Series gathers g and returns the samples of the family name whose labels
// include every pair of match (nil: all of them), in the registry's order.
func Series(t testing.TB, g prometheus.Gatherer, name string, match map[string]string) []*dto.Metric {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, match) {
				out = append(out, m)
			}
		}
	}
	return out
}

// Sum is the total of the counter or gauge samples Series returns: 0 when
// there is none.
func Sum(t testing.TB, g prometheus.Gatherer, name string, match map[string]string) float64 {
	t.Helper()
	total := 0.0
	for _, m := range Series(t, g, name, match) {
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total
}

func hasLabels(m *dto.Metric, match map[string]string) bool {
	have := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		have[lp.GetName()] = lp.GetValue()
	}
	for k, v := range match {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Value is the value of one counter or gauge (a Vec's child included).
func Value(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetCounter().GetValue() + d.GetGauge().GetValue()
}
