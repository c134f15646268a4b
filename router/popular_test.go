package router

import (
	"slices"
	"testing"
)

// TestSpreadOf: a hot prefix places its children over its parent's
// instances only while it carries more than spreadShare of its hot
// parent's traffic with fewer candidates (a new tool prompt whose k trails
// its traffic); a session under a hot prefix keeps its own candidates.
func TestSpreadOf(t *testing.T) {
	parent := &popNode{k: 7, share: 1, cands: []int{0, 1, 2, 3, 4, 5, 6}}
	parent.spread = parent.cands
	for _, tc := range []struct {
		name string
		nd   popNode
		want []int
	}{
		{"warm: no children placed", popNode{k: 1, share: 0.5, cands: []int{3}, parent: parent}, nil},
		{"shallowest", popNode{k: 3, share: 0.5, cands: []int{4, 1, 6}}, []int{4, 1, 6}},
		{"trailing its parent's traffic", popNode{k: 3, share: 0.3, cands: []int{4, 1, 6}, parent: parent}, []int{4, 1, 6, 0, 2, 3, 5}},
		{"a session: an eighth of it", popNode{k: 2, share: 0.125, cands: []int{4, 1}, parent: parent}, []int{4, 1}},
		{"as many candidates as its parent", popNode{k: 7, share: 0.9, cands: []int{6, 5, 4, 3, 2, 1, 0}, parent: parent}, []int{6, 5, 4, 3, 2, 1, 0}},
		{"parent not hot", popNode{k: 3, share: 0.9, cands: []int{4, 1, 6}, parent: &popNode{k: 1, share: 1, cands: []int{4}}}, []int{4, 1, 6}},
	} {
		if got := spreadOf(&tc.nd); !slices.Equal(got, tc.want) {
			t.Errorf("%s: spread %v, want %v", tc.name, got, tc.want)
		}
	}
}
