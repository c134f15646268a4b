package matrix

import (
	"bytes"
	"strings"
	"testing"
)

func TestConfigsAreTheSeedsSixteen(t *testing.T) {
	cs := Configs()
	seen := map[Config]bool{}
	for _, c := range cs {
		seen[c] = true
	}
	if len(cs) != 16 || len(seen) != 16 {
		t.Fatalf("%d configurations, %d distinct; want 16", len(cs), len(seen))
	}
}

func TestReportPassedAndTable(t *testing.T) {
	full := Measure{Requests: 40, Succeeded: 40, SuccessRate: 1}
	r := &Report{Options: Options{}.withDefaults()}
	for _, c := range Configs() {
		r.Rows = append(r.Rows, Row{Config: c, PrefixAware: full, Random: full})
	}
	if !r.Passed() {
		t.Fatal("every request succeeded, yet not passed")
	}
	var b bytes.Buffer
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "\n| "); n != 17 { // header + 16 rows
		t.Fatalf("%d table lines:\n%s", n, b.String())
	}
	r.Rows[3].Random.Succeeded = 39
	if r.Passed() {
		t.Fatal("a failed request must fail the matrix")
	}
	r.Rows = r.Rows[:15]
	r.Rows[3].Random.Succeeded = 40
	if r.Passed() {
		t.Fatal("15 rows must fail the matrix")
	}
}
