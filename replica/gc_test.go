package replica

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestSetGCPercent: Run's GCPercent sets the GC target, unless it is zero
// or GOGC is in the environment (the operator's own setting wins).
func TestSetGCPercent(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	if v, ok := os.LookupEnv("GOGC"); ok {
		os.Unsetenv("GOGC")
		defer os.Setenv("GOGC", v)
	}
	setGCPercent(250)
	if got := debug.SetGCPercent(100); got != 250 {
		t.Errorf("without GOGC: GC percent %d, want 250", got)
	}
	setGCPercent(0)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GCPercent 0: GC percent %d, want it untouched (100)", got)
	}
	t.Setenv("GOGC", "100")
	setGCPercent(250)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC=100 in the environment: GC percent %d, want it untouched (100)", got)
	}
}
