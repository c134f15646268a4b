package chaos

import (
	"bytes"
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func TestCompare(t *testing.T) {
	tests := []struct {
		name          string
		before, after owners
		changed       string
		added         bool
		nb, na        int
		moved, coll   int
		ideal         float64
		agreeAfter    float64
	}{
		{"add moves only to the new instance",
			owners{{"a", "b", "a", "b"}, {"a", "b", "a", "b"}}, owners{{"a", "c", "a", "b"}, {"a", "c", "a", "b"}},
			"c", true, 2, 3, 1, 0, 1.0 / 3, 1},
		{"add with a collateral move",
			owners{{"a", "b", "a", "b"}}, owners{{"c", "a", "a", "b"}},
			"c", true, 2, 3, 2, 1, 1.0 / 3, 1},
		{"remove: ideal is the removed instance's share",
			owners{{"a", "b", "c", "c"}}, owners{{"a", "b", "a", "b"}},
			"c", false, 3, 2, 2, 0, 0.5, 1},
		{"replicas disagree",
			owners{{"a", "b"}, {"a", "b"}}, owners{{"a", "b"}, {"a", "a"}},
			"c", true, 2, 3, 0, 0, 1.0 / 3, 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := compare(tc.before, tc.after, tc.changed, tc.added, tc.nb, tc.na)
			if m.Moved != tc.moved || m.Collateral != tc.coll || math.Abs(m.Ideal-tc.ideal) > 1e-12 || m.AgreementAfter != tc.agreeAfter {
				t.Fatalf("got moved %d collateral %d ideal %v agreement %v; want %d %d %v %v", m.Moved, m.Collateral, m.Ideal, m.AgreementAfter, tc.moved, tc.coll, tc.ideal, tc.agreeAfter)
			}
		})
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		cfg  Options
		ok   bool
	}{
		{"defaults", Options{}, true},
		{"one instance", Options{Instances: 1}, false},
		{"too few keys", Options{Keys: 10}, false},
		{"unknown scenario", Options{Scenarios: []string{"meteor"}}, false},
		{"negative rate", Options{LoadRate: -1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.withDefaults()
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
		})
	}
	for _, s := range Scenarios() {
		if Description(s) == "" {
			t.Errorf("scenario %s has no description", s)
		}
	}
}

// within4Sigma: the moved fraction of an add is within 4 standard
// deviations of a binomial with Keys trials around 1/(N+1) (rendezvous
// hashing places keys like independent uniform draws), so a correct ring
// fails this with probability ~6e-5.
func within4Sigma(t *testing.T, m *Movement, frac float64) {
	t.Helper()
	p := m.Nominal
	sigma := math.Sqrt(p * (1 - p) / float64(m.Keys))
	if math.Abs(frac-p) > 4*sigma {
		t.Errorf("fraction %.4f differs from %.4f by more than 4σ (σ = %.4f, %d keys)", frac, p, sigma, m.Keys)
	}
}

func checkMovement(t *testing.T, res *Result) {
	t.Helper()
	m := res.Movement
	if m == nil {
		t.Fatal("no movement measured")
	}
	if m.Collateral != 0 {
		t.Errorf("%d collateral moves", m.Collateral)
	}
	if m.AgreementAfter != 1 {
		t.Errorf("agreement after convergence %.4f, want 1", m.AgreementAfter)
	}
	if m.Added {
		within4Sigma(t, m, m.MovedFraction)
	} else {
		// Exactly the removed instance's keys move, and its share is fair.
		if m.MovedFraction != m.Ideal {
			t.Errorf("moved %.4f, removed instance's share %.4f", m.MovedFraction, m.Ideal)
		}
		within4Sigma(t, m, m.Ideal)
	}
}

func noFailed(t *testing.T, res *Result) {
	t.Helper()
	if res.Load == nil || res.Load.Sent == 0 {
		t.Fatal("no load ran across the event")
	}
	if res.Load.Failed != 0 {
		t.Errorf("%d of %d requests failed: %v %v", res.Load.Failed, res.Load.Sent, res.Load.ByKind, res.Load.Examples)
	}
}

// TestScenarios runs the suite on one small fleet and asserts each
// scenario's properties on the measurements (not only on its own checks).
// runScenarios runs o.Scenarios within timeout, logs the progress and the
// report, and fails unless every scenario has a result.
func runScenarios(t *testing.T, timeout time.Duration, o Options) *Report {
	t.Helper()
	var progress bytes.Buffer
	o.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rep, err := Run(ctx, o)
	t.Log("\n" + progress.String())
	if err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + md.String())
	if len(rep.Results) != len(o.Scenarios) {
		t.Fatalf("%d results, want %d", len(rep.Results), len(o.Scenarios))
	}
	return rep
}

func TestScenarios(t *testing.T) {
	// The fault scenarios observe a breaker opening and closing and health
	// checks marking an instance down, on the real clock of a whole fleet
	// (1 s open timeout, 100 ms probes). Unit tests cover those transitions
	// on fake clocks (overload, probe, router), so here they run only when
	// asked (CHAOS_FAULTS=1) and always in `make chaos`, which runs every
	// scenario. Lease expiry in the crash scenario is etcd's own clock.
	scenarios := []string{ScaleUp, ScaleDown, Crash, EtcdOutage, RollingRestart}
	faults := os.Getenv("CHAOS_FAULTS") != ""
	if faults {
		scenarios = append(scenarios, FailingInstance, HungInstance)
	}
	if testing.Short() {
		scenarios, faults = []string{ScaleUp, ScaleDown, Crash, EtcdOutage}, false
	}
	rep := runScenarios(t, 3*time.Minute, Options{
		Instances: 5, Replicas: 2, Keys: 2000, TimeScale: 20, LoadRate: 40,
		// The scenarios measure the fleet in real time, so they wait for
		// lease expiry (2 s TTL) and for breakers to close (1 s open
		// timeout) on the real clock. Shorter was tried on a loaded 2-core
		// machine: 1 s leases failed rolling-restart; with a 100 ms open
		// timeout 2 runs of 3 failed checks (rolling-restart, etcd-outage
		// agreement, failing-instance, hung-instance) that pass with 1 s.
		TTL: 2 * time.Second, LoadWindow: 500 * time.Millisecond, OutageWindow: 1500 * time.Millisecond, // under the 2 s TTL: the outage itself expires no lease, whatever the load on the machine
		BreakerOpenTimeout: time.Second, Seed: 7, Scenarios: scenarios,
	})

	t.Run(ScaleUp, func(t *testing.T) {
		res := rep.Result(ScaleUp)
		checkMovement(t, res)
		noFailed(t, res)
		if res.InstancesAfter != res.InstancesBefore+1 {
			t.Errorf("instances %d → %d", res.InstancesBefore, res.InstancesAfter)
		}
	})
	t.Run(ScaleDown, func(t *testing.T) {
		res := rep.Result(ScaleDown)
		checkMovement(t, res)
		noFailed(t, res)
	})
	t.Run(Crash, func(t *testing.T) {
		res := rep.Result(Crash)
		checkMovement(t, res)
		if res.Load == nil || res.Load.Sent == 0 {
			t.Fatal("no load ran across the crash")
		}
		if res.Load.FailedOther != 0 {
			t.Errorf("%d failures of requests not in flight at the crash: %v", res.Load.FailedOther, res.Load.Examples)
		}
		// Routers learn of a crash only when the lease expires.
		if res.Convergence < time.Second || res.Convergence > 5*time.Second {
			t.Errorf("crash detected after %v, want about the 2 s TTL", res.Convergence)
		}
	})
	t.Run(EtcdOutage, func(t *testing.T) {
		res := rep.Result(EtcdOutage)
		o := res.Outage
		n := res.InstancesBefore
		if o.MinInstances != n || o.MaxInstances != n || o.SnapshotsChanged != 0 {
			t.Errorf("during the outage replicas listed %d–%d instances (%d sets changed), want %d unchanged", o.MinInstances, o.MaxInstances, o.SnapshotsChanged, n)
		}
		if res.InstancesAfter != n+1 {
			t.Errorf("instances after recovery %d, want %d", res.InstancesAfter, n+1)
		}
		checkMovement(t, res)
		noFailed(t, res)
	})
	if faults {
		t.Run(FailingInstance, func(t *testing.T) {
			res := rep.Result(FailingInstance)
			b := res.Breaker
			if !b.OpenedAll {
				t.Errorf("breaker of %s did not open on every replica", b.Instance)
			}
			if !b.ClosedAll {
				t.Errorf("breaker of %s did not close after the fault cleared", b.Instance)
			}
			for _, c := range res.Checks {
				if !c.Pass {
					t.Errorf("%s: %s", c.Name, c.Detail)
				}
			}
		})
		t.Run(HungInstance, func(t *testing.T) {
			res := rep.Result(HungInstance)
			hg := res.Hang
			if !hg.DetectedAll || hg.Detected > 2*time.Second {
				t.Errorf("%s marked down on every replica: %v after %v", hg.Instance, hg.DetectedAll, hg.Detected)
			}
			if hg.AfterDetection == 0 || hg.RoutedToIt != 0 {
				t.Errorf("%d of %d requests sent after detection went to the frozen %s", hg.RoutedToIt, hg.AfterDetection, hg.Instance)
			}
			if !hg.RecoveredAll {
				t.Errorf("%s not marked up after the unfreeze", hg.Instance)
			}
			if res.Load.FailedOther != 0 {
				t.Errorf("%d failures of requests not sent to the frozen instance: %v", res.Load.FailedOther, res.Load.Examples)
			}
		})
	}
	if !testing.Short() {
		t.Run(RollingRestart, func(t *testing.T) {
			res := rep.Result(RollingRestart)
			noFailed(t, res)
			if res.InstancesAfter != res.InstancesBefore {
				t.Errorf("instances %d → %d", res.InstancesBefore, res.InstancesAfter)
			}
		})
	}
	if !rep.Passed() {
		t.Error("report has failed checks")
	}
	var js, tab bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"scenario": "scale-up"`) {
		t.Errorf("JSON: %v", err)
	}
	if err := rep.WriteTable(&tab); err != nil || !strings.Contains(tab.String(), "scale-up") {
		t.Errorf("table: %v", err)
	}
}

// TestReport runs the default short suite (what `prefixrouter chaos` runs)
// and prints its Markdown report. It takes minutes, so it runs only with
// CHAOS_REPORT=1: CHAOS_REPORT=1 go test -run TestReport -v ./chaos
func TestReport(t *testing.T) {
	if os.Getenv("CHAOS_REPORT") == "" {
		t.Skip("set CHAOS_REPORT=1 to run the default short suite")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteMarkdown(os.Stdout); err != nil {
		t.Fatal(err)
	}
	if !rep.Passed() {
		t.Error("report has failed checks")
	}
}

func TestAdapterScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("a fleet with placement and load")
	}
	scenarios := []string{AdapterJoin, AdapterUnload, AdapterHot, AdapterCrash}
	rep := runScenarios(t, 4*time.Minute, Options{
		Instances: 5, Replicas: 2, Keys: 8000, TimeScale: 20, LoadRate: 40,
		TTL: 2 * time.Second, LoadWindow: 500 * time.Millisecond, Seed: 7, Scenarios: scenarios,
	})
	for _, res := range rep.Results {
		if res.Adapter == nil {
			t.Errorf("%s: no adapter movement measured", res.Scenario)
		}
		for _, c := range res.Checks {
			if !c.Pass {
				t.Errorf("%s: %s: %s", res.Scenario, c.Name, c.Detail)
			}
		}
	}
}
