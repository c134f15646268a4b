package router

import (
	"github.com/prefixrouter/prefixrouter/lora"
)

// SageMaker Runtime's request and response headers beyond the tenant and
// target model (issue 8). X-Amzn-SageMaker-Custom-Attributes needs no code:
// the proxy passes it both ways like any end-to-end header.
const (
	// HeaderInferenceComponent names an inference component: its instances
	// (those whose record names it as their model or an adapter) form the
	// sticky set, exactly like an adapter's.
	HeaderInferenceComponent = "X-Amzn-Sagemaker-Inference-Component"
	// HeaderTargetVariant restricts the request to the instances of one
	// production variant (an instance's label "variant"; DefaultVariant
	// when it has none).
	HeaderTargetVariant = "X-Amzn-Sagemaker-Target-Variant"
	// HeaderInvokedVariant names the variant that answered.
	HeaderInvokedVariant = "X-Amzn-Invoked-Production-Variant"
	// Stateful sessions: the request's session id (NewSession to open
	// one), and the container's answers opening or closing one.
	HeaderSessionID       = "X-Amzn-Sagemaker-Session-Id"
	HeaderNewSessionID    = "X-Amzn-Sagemaker-New-Session-Id"
	HeaderClosedSessionID = "X-Amzn-Sagemaker-Closed-Session-Id"
	// NewSession is the session id that asks the container for a session.
	NewSession = "NEW_SESSION"
	// DefaultVariant is SageMaker's variant name of an endpoint created
	// with one variant.
	DefaultVariant = "AllTraffic"
	// VariantLabel is the instance label naming its production variant.
	VariantLabel = "variant"
)

// variantOf is the production variant of an instance.
func variantOf(iv *instanceView) string {
	if v := iv.inst.Labels[VariantLabel]; v != "" {
		return v
	}
	return DefaultVariant
}

// variantSkip marks the set indexes of instances outside variant; ok is
// false when no instance of the set is in it.
func variantSkip(ev *endpointView, set *lora.Set, variant string) (skip bitset, ok bool) {
	for i := 0; i < set.Len(); i++ {
		if iv := ev.instance(set, i); iv == nil || variantOf(iv) != variant {
			skip.set(i)
		} else {
			ok = true
		}
	}
	return skip, ok
}

// weightedVariant chooses the production variant of a request that names
// none, by the endpoint's weights. The choice is a function of the routing
// key (not a coin flip), so every replica sends a key to the same variant
// and a prefix stays warm in one variant's caches; over many keys the
// shares follow the weights. "" when the endpoint has no split.
func (ev *endpointView) weightedVariant(key uint64) string {
	n := len(ev.cumWeight)
	if n == 0 {
		return ""
	}
	// Re-mix the key: its low bits also place it on the ring.
	x := key * 0x9E3779B97F4A7C15
	u := float64(x>>11) / (1 << 53) * ev.cumWeight[n-1]
	for i, c := range ev.cumWeight {
		if u < c {
			return ev.variants[i]
		}
	}
	return ev.variants[n-1]
}
