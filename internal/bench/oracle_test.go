package bench

import (
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

func TestOracle(t *testing.T) {
	blk := func(c byte, n int) string { return strings.Repeat(string(c), n*sim.BlockChars) }
	a2 := blk('a', 2)                          // 2 full blocks
	a2b1 := a2 + blk('b', 1)                   // shares a2's 2 blocks
	a2c := a2 + "c" + blk('c', 1)[1:] + "tail" // 3 full blocks + 4 chars
	// An observation: the request (adapter, cache salt, prompt text),
	// whether it is measured, and the cached and prompt tokens it reports.
	type obs struct {
		adapter, salt, text string
		measure             bool
		cached, prompt      int
	}
	// m is a measured request without adapter or salt.
	m := func(text string, cached, prompt int) obs {
		return obs{text: text, measure: true, cached: cached, prompt: prompt}
	}
	tests := []struct {
		name         string
		stream       []obs
		hit          float64
		promptTotal  int64
		distinctBlks int64
	}{
		{"cold then shared prefix", []obs{m(a2, 0, 32), m(a2b1, 32, 48), m(a2b1, 48, 48)}, 80.0 / 128, 128, 3},
		{"partial block is not cached", []obs{m(a2c, 0, 49), m(a2c, 48, 49)}, 48.0 / 98, 98, 3},
		{"salt and adapter separate caches", []obs{
			{salt: "t1", text: a2, measure: true, prompt: 32},
			{salt: "t2", text: a2, measure: true, prompt: 32},
			{adapter: "lora", salt: "t1", text: a2, measure: true, prompt: 32},
			{adapter: "lora", salt: "t1", text: a2, measure: true, cached: 32, prompt: 32},
		}, 32.0 / 128, 128, 6},
		{"warmup fills but does not count", []obs{{text: a2, prompt: 32}, m(a2b1, 32, 48)}, 32.0 / 48, 48, 3},
		{"a different first block shares nothing", []obs{m(a2b1, 0, 48), m("x"+a2b1[1:], 0, 48)}, 0, 96, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOracle()
			for i, s := range tt.stream {
				c, p := o.Observe(s.adapter, s.salt, s.text, s.measure)
				if c != s.cached || p != s.prompt {
					t.Fatalf("observation %d: cached %d of %d, want %d of %d", i, c, p, s.cached, s.prompt)
				}
			}
			if o.HitRate() != tt.hit || o.PromptTokens != tt.promptTotal {
				t.Fatalf("hit rate %v over %d tokens, want %v over %d", o.HitRate(), o.PromptTokens, tt.hit, tt.promptTotal)
			}
			if o.DistinctTokens() != tt.distinctBlks*sim.BlockTokens {
				t.Fatalf("distinct %d tokens, want %d blocks", o.DistinctTokens(), tt.distinctBlks)
			}
		})
	}
}

func TestOracleOnRenderedChat(t *testing.T) {
	// Two requests of one document with different questions share the
	// rendered document's full blocks and nothing after them.
	doc := Text(1, "document", 1000, 0)
	q1, q2 := Text(1, "q", 40, 1), Text(1, "q", 40, 2)
	p1 := sim.RenderChat([]sim.Message{{Role: "system", Content: doc}, {Role: "user", Content: q1}})
	p2 := sim.RenderChat([]sim.Message{{Role: "system", Content: doc}, {Role: "user", Content: q2}})
	o := NewOracle()
	o.Observe("", "", p1, false)
	c, _ := o.Observe("", "", p2, true)
	// Shared characters: "<|system|>\n" (11) + doc (4000) + "\n<|user|>\n" (10) + the
	// 16-hex tags differ at once; 4021 characters is 62 full blocks.
	shared := len("<|system|>\n") + len(doc) + len("\n<|user|>\n")
	if want := shared / sim.BlockChars * sim.BlockTokens; c != want {
		t.Fatalf("cached %d, want %d", c, want)
	}
}
