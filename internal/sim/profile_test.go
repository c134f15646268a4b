package sim

import (
	"math"
	"testing"
	"time"
)

// TestCalibration8B checks the h200-llama8b profile against every 8b row of
// the embedded calibration: every row the fit does not exclude must be
// within 10 %; excluded rows must say why. `go test ./sim -run
// TestCalibration -v` prints the table docs/simulator.md quotes.
func TestCalibration8B(t *testing.T) {
	p, err := LookupProfile(ProfileH200Llama8B)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("floor %v cachedFloor %v decodeFloor %v a=%.4g b=%.4g bc=%.4g c0=%.4g c1=%.4g",
		p.Floor, p.CachedPrefillFloor, p.DecodeFloor, p.PrefillTokenSec, p.PrefillPairSec, p.PrefillCachedPairSec, p.DecodeBaseSec, p.DecodeKVTokenSec)
	logChecks(t, p.Checks)
	t.Logf("decode step of 100 sequences at 8,192 tokens: %v", p.DecodeDuration(100, 8192))
	if len(p.Checks) != 23 {
		t.Fatalf("got %d checks, want one per 8b row (23)", len(p.Checks))
	}
	var excluded int
	for _, c := range p.Checks {
		switch {
		case c.Role == "excluded":
			excluded++
			if c.Note == "" {
				t.Errorf("excluded row %+v has no reason", c)
			}
		case math.Abs(c.ErrorPct) > 10:
			t.Errorf("%s batch %d prompt %d cached %d ctx %d: model %v vs measured %v (%.1f %%)",
				c.Kind, c.Batch, c.PromptTokens, c.CachedTokens, c.ContextTokens, c.Model, c.Measured, c.ErrorPct)
		}
	}
	// Only the 1,024-cached group is inconsistent; the rule must not grow.
	if excluded != 3 {
		t.Errorf("excluded %d rows, want the 3 rows of the 1,024-cached group", excluded)
	}
}

func logChecks(t *testing.T, cs []CalibrationCheck) {
	t.Helper()
	t.Logf("| kind | batch | prompt | cached | ctx | measured ms | model ms | error %% | role |")
	t.Logf("|---|---|---|---|---|---|---|---|---|")
	for _, c := range cs {
		t.Logf("| %s | %d | %d | %d | %d | %.1f | %.1f | %+.1f | %s %s |", c.Kind, c.Batch, c.PromptTokens, c.CachedTokens,
			c.ContextTokens, ms(c.Measured), ms(c.Model), c.ErrorPct, c.Role, c.Note)
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func TestProfile70B(t *testing.T) {
	p, err := LookupProfile(ProfileH100x8Llama70B)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("floor %v cachedFloor %v decodeFloor %v a=%.4g b=%.4g bc=%.4g c0=%.4g c1=%.4g",
		p.Floor, p.CachedPrefillFloor, p.DecodeFloor, p.PrefillTokenSec, p.PrefillPairSec, p.PrefillCachedPairSec, p.DecodeBaseSec, p.DecodeKVTokenSec)
	logChecks(t, p.Checks)
	d := p.PrefillDuration(8192, 0)
	if tps := 8192 / d.Seconds(); math.Abs(tps-26000) > 260 {
		t.Errorf("8,192-token prefill at %.0f tokens/s, want 26k", tps)
	}
	if got := p.DecodeDuration(1, 1024); got != 15*time.Millisecond {
		t.Errorf("decode at batch 1 = %v, want the 15 ms floor", got)
	}
	for _, n := range []int{1024, 2048, 4096, 16384} {
		t.Logf("70B prefill %d uncached: %v (%.0f tok/s); with %d cached +50: %v", n, p.PrefillDuration(n, 0),
			float64(n)/p.PrefillDuration(n, 0).Seconds(), n, p.PrefillDuration(n+50, n))
	}
	if _, err := LookupProfile("nope"); err == nil {
		t.Error("unknown profile accepted")
	}
}

// TestRooflineProfiles checks the roofline profiles against the worked
// examples of ../shared/calibration/README.md and logs the sensitivity to
// the efficiency (η 0.6 and 0.9) that docs/simulator.md quotes.
func TestRooflineProfiles(t *testing.T) {
	p8, err := LookupProfile(ProfileH200Llama8BRoofline)
	if err != nil {
		t.Fatal(err)
	}
	eager, _ := LookupProfile(ProfileH200Llama8B)
	// Worked examples at η 0.75: batch 1 ≈ 4.5 ms of weights (+1 ms
	// overhead); batch 64 × 4,096: (16.06 + 34.4) GB / 3.6 TB/s ≈ 14 ms (+1).
	for _, tc := range []struct {
		batch, ctx int
		want       float64 // ms
	}{{1, 0, 4.46 + 1}, {64, 4096, 14.0 + 1}} {
		got := ms(p8.DecodeDuration(tc.batch, tc.ctx))
		if math.Abs(got-tc.want) > 0.05*tc.want {
			t.Errorf("8B roofline decode batch %d × %d: %.2f ms, want %.2f ±5 %%", tc.batch, tc.ctx, got, tc.want)
		}
	}
	// Prefill stays on the measured rows above the floor.
	if a, b := p8.PrefillDuration(8192, 0), eager.PrefillDuration(8192, 0); a != b {
		t.Errorf("8,192-token prefill %v, eager profile %v: prefill must not change", a, b)
	}
	if got := p8.PrefillDuration(8242, 8192); got >= eager.PrefillDuration(8242, 8192) {
		t.Errorf("cached prefill %v not below the eager floor", got)
	}

	p70, err := LookupProfile(ProfileH100x8Llama70BRoofline)
	if err != nil {
		t.Fatal(err)
	}
	// 141 GB / 8 GPUs / (3.35 TB/s × 0.75) = 7.01 ms + 1.6 ms all-reduce + 1 ms.
	if got := ms(p70.DecodeDuration(1, 0)); math.Abs(got-9.61) > 0.1 {
		t.Errorf("70B TP8 roofline decode at batch 1: %.2f ms, want 9.61", got)
	}
	base70, _ := LookupProfile(ProfileH100x8Llama70B)
	if a, b := p70.PrefillDuration(8192, 0), base70.PrefillDuration(8192, 0); a != b {
		t.Errorf("70B prefill %v vs %v: prefill must not change", a, b)
	}
	for _, eff := range []float64{0.6, 0.75, 0.9} {
		q8 := WithRoofline(eager, "x", "", Llama8BH200Roofline(eff))
		q70 := WithRoofline(base70, "x", "", Llama70BH100x8Roofline(eff))
		t.Logf("η %.2f: 8B/H200 decode batch 1 %.1f ms, 32×2,048 %.1f ms, 64×4,096 %.1f ms, 100×8,192 %.1f ms (eager %.1f); "+
			"70B/8×H100 batch 1 %.1f ms, 64×4,096 %.1f ms, 100×8,192 %.1f ms",
			eff, ms(q8.DecodeDuration(1, 1024)), ms(q8.DecodeDuration(32, 2048)), ms(q8.DecodeDuration(64, 4096)),
			ms(q8.DecodeDuration(100, 8192)), ms(eager.DecodeDuration(100, 8192)),
			ms(q70.DecodeDuration(1, 1024)), ms(q70.DecodeDuration(64, 4096)), ms(q70.DecodeDuration(100, 8192)))
	}
}
