package testsupport

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestSeriesMatchesEveryLabel: a sample is returned only when it carries
// every label pair asked for; Sum adds counters and gauges and is 0 for a
// family or label value that is not there.
func TestSeriesMatchesEveryLabel(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"ep", "code"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "g"})
	reg.MustRegister(c, g)
	c.WithLabelValues("a", "200").Add(2)
	c.WithLabelValues("a", "500").Add(3)
	c.WithLabelValues("b", "200").Add(5)
	g.Set(7)
	for _, tc := range []struct {
		name  string
		match map[string]string
		n     int
		sum   float64
	}{
		{"c_total", nil, 3, 10},
		{"c_total", map[string]string{"ep": "a"}, 2, 5},
		{"c_total", map[string]string{"ep": "a", "code": "500"}, 1, 3},
		{"c_total", map[string]string{"ep": "c"}, 0, 0},
		{"c_total", map[string]string{"other": "a"}, 0, 0},
		{"g", nil, 1, 7},
		{"missing", nil, 0, 0},
	} {
		if n := len(Series(t, reg, tc.name, tc.match)); n != tc.n {
			t.Errorf("Series(%s, %v): %d samples, want %d", tc.name, tc.match, n, tc.n)
		}
		if s := Sum(t, reg, tc.name, tc.match); s != tc.sum {
			t.Errorf("Sum(%s, %v) = %v, want %v", tc.name, tc.match, s, tc.sum)
		}
	}
	if v := Value(t, c.WithLabelValues("a", "500")); v != 3 {
		t.Errorf("Value of a counter = %v, want 3", v)
	}
	if v := Value(t, g); v != 7 {
		t.Errorf("Value of a gauge = %v, want 7", v)
	}
}
