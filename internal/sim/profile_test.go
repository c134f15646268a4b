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
