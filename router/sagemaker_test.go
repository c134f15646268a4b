package router

import (
	"math"
	"strconv"
	"testing"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// TestProductionVariantWeights: without a Target-Variant, the endpoint's
// ProductionVariants weights split keys between variants; a key keeps its
// variant. n = 2000 keys: the green share's standard deviation is
// sqrt(0.2·0.8/2000) ≈ 0.009, so ±0.045 is five of them.
func TestProductionVariantWeights(t *testing.T) {
	cfg := prefixCfg(1000)
	cfg.ProductionVariants = []fleet.ProductionVariant{{VariantName: "blue", InitialVariantWeight: 4}, {VariantName: "green", InitialVariantWeight: 1}}
	bs := []*backend{newBackend(t, "b1"), newBackend(t, "b2"), newBackend(t, "g1"), newBackend(t, "g2")}
	h := newHarness(t, hopts{cfg: cfg}, bs...)
	for i := range h.ep.Instances {
		v := "blue"
		if h.ep.Instances[i].ID[0] == 'g' {
			v = "green"
		}
		h.ep.Instances[i].Labels = map[string]string{VariantLabel: v}
	}
	h.update()
	const n = 2000
	green := 0
	for i := range n {
		body := "prompt " + strconv.Itoa(i)
		res := h.mustDo("/invocations", body, nil)
		v := res.header.Get(HeaderInvokedVariant)
		if (v == "green") != (res.instance[0] == 'g') || (v != "green" && v != "blue") {
			t.Fatalf("instance %s answered as variant %q", res.instance, v)
		}
		if v == "green" {
			green++
		}
		if i%100 == 0 { // a key keeps its variant
			if again := h.mustDo("/invocations", body, nil).header.Get(HeaderInvokedVariant); again != v {
				t.Fatalf("key %d: variant %s then %s", i, v, again)
			}
		}
	}
	share := float64(green) / n
	t.Logf("green share %.3f (weight 0.2)", share)
	if math.Abs(share-0.2) > 0.045 {
		t.Fatalf("green share %.3f, want 0.2 ± 0.045", share)
	}
	// A Target-Variant overrides the weights.
	for i := range 20 {
		if res := h.mustDo("/invocations", "p"+strconv.Itoa(i), map[string]string{"X-Amzn-SageMaker-Target-Variant": "green"}); res.instance[0] != 'g' {
			t.Fatalf("target variant green answered by %s", res.instance)
		}
	}
}

// TestInternalFailure: a router bug before the proxy answers 500
// InternalFailure rather than dropping the connection.
func TestInternalFailure(t *testing.T) {
	h := newHarness(t, hopts{cfg: fleet.RoutingConfig{RoutingStrategy: fleet.Random}}, threeBackends(t)...)
	h.r.rand = func(int) int { panic("a bug") }
	checkError(t, h.mustDo("/invocations", "x", nil), false, 500, codeInternal)
	checkError(t, h.mustDo("/v1/completions", `{"prompt":"x"}`, nil), true, 500, codeInternal)
}
