package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/prefixrouter/prefixrouter/internal/sim"
	"github.com/prefixrouter/prefixrouter/replica"
	"github.com/prefixrouter/prefixrouter/router"
)

// probeChars is the length of each probe's text: shorter than the default
// PrefixLength (4,096 characters), so the whole text is the routing prefix.
const probeChars = 2000

// chatPath is the data-plane path of the probes and of the load.
const chatPath = "/v1/chat/completions"

// newProbes builds k OpenAI chat bodies with distinct random texts.
func newProbes(k int, seed int64) [][]byte {
	return newModelProbes(sim.DefaultBaseModel, k, seed)
}

// newModelProbes is newProbes for requests naming model.
func newModelProbes(model string, k int, seed int64) [][]byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyz      .,"
	rng := rand.New(rand.NewPCG(uint64(seed), 0x70726f6265))
	out := make([][]byte, k)
	text := make([]byte, probeChars)
	for i := range out {
		// The index up front makes the texts distinct whatever the RNG does.
		n := copy(text, fmt.Sprintf("probe %d: ", i))
		for j := n; j < len(text); j++ {
			text[j] = alphabet[rng.IntN(len(alphabet))]
		}
		out[i] = chatBodyModel(model, string(text), 8, false)
	}
	return out
}

func chatBody(text string, maxTokens int, stream bool) []byte {
	return chatBodyModel(sim.DefaultBaseModel, text, maxTokens, stream)
}

func chatBodyModel(model, text string, maxTokens int, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": text}},
		"max_tokens": maxTokens,
		"stream":     stream,
	})
	return b
}

// owners is the ring primary of every probe on every replica:
// owners[replica][probe].
type owners [][]string

// primaries asks every replica's router where each probe would go with no
// load (the ring primary, router.Router.Explain, which Choose wraps).
func primaries(reps []*replica.Replica, endpoint string, probes [][]byte) (owners, error) {
	out := make(owners, len(reps))
	for r, rep := range reps {
		out[r] = make([]string, len(probes))
		for i, body := range probes {
			ex, err := rep.Router().Explain(context.Background(), router.PickRequest{Endpoint: endpoint, Path: chatPath, Body: body})
			if err != nil {
				return nil, fmt.Errorf("chaos: probe %d on replica %d: %w", i, r, err)
			}
			out[r][i] = ex.Instance
		}
	}
	return out, nil
}

// agreement is the fraction of probes on which every replica names the same
// primary.
func (o owners) agreement() float64 {
	if len(o) == 0 || len(o[0]) == 0 {
		return 0
	}
	agree := 0
	for i := range o[0] {
		same := true
		for r := 1; r < len(o); r++ {
			if o[r][i] != o[0][i] {
				same = false
				break
			}
		}
		if same {
			agree++
		}
	}
	return float64(agree) / float64(len(o[0]))
}

// Movement compares the probes' primaries before and after one membership
// change (measured on the first replica once every replica converged).
type Movement struct {
	// Keys is the number of probes.
	Keys int `json:"keys"`
	// Changed is the instance added or removed; Added tells which.
	Changed string `json:"changed"`
	Added   bool   `json:"added"`
	// InstancesBefore and InstancesAfter the change.
	InstancesBefore int `json:"instances_before"`
	InstancesAfter  int `json:"instances_after"`
	// Moved is the number of probes whose primary changed.
	Moved         int     `json:"moved"`
	MovedFraction float64 `json:"moved_fraction"`
	// Ideal is the fraction that has to move: 1/(N+1) on an add, the
	// removed instance's measured share on a remove.
	Ideal float64 `json:"ideal"`
	// Nominal is 1/(N+1) on an add and 1/N on a remove: what a perfectly
	// even ring would move. Sigma is the standard deviation of the moved
	// fraction around it if keys fall on instances at random (binomial
	// with Keys trials), the scale of honest noise.
	Nominal float64 `json:"nominal"`
	Sigma   float64 `json:"sigma"`
	// Ratio is MovedFraction / Ideal.
	Ratio float64 `json:"ratio"`
	// Collateral counts probes that moved although neither their old nor
	// their new primary is Changed. Consistent hashing promises 0.
	Collateral int `json:"collateral"`
	// AgreementBefore and AgreementAfter: the fraction of probes on which
	// every replica names the same primary.
	AgreementBefore float64 `json:"agreement_before"`
	AgreementAfter  float64 `json:"agreement_after"`
}

// compare computes the movement between two measurements.
func compare(before, after owners, changed string, added bool, nBefore, nAfter int) *Movement {
	b, a := before[0], after[0]
	m := &Movement{Keys: len(b), Changed: changed, Added: added,
		InstancesBefore: nBefore, InstancesAfter: nAfter,
		AgreementBefore: before.agreement(), AgreementAfter: after.agreement()}
	owned := 0
	for i := range b {
		if b[i] == changed {
			owned++
		}
		if b[i] == a[i] {
			continue
		}
		m.Moved++
		if b[i] != changed && a[i] != changed {
			m.Collateral++
		}
	}
	k := float64(len(b))
	m.MovedFraction = float64(m.Moved) / k
	if added {
		m.Nominal = 1 / float64(m.InstancesAfter)
		m.Ideal = m.Nominal
	} else {
		m.Nominal = 1 / float64(m.InstancesBefore)
		m.Ideal = float64(owned) / k
	}
	m.Sigma = math.Sqrt(m.Nominal * (1 - m.Nominal) / k)
	if m.Ideal > 0 {
		m.Ratio = m.MovedFraction / m.Ideal
	}
	return m
}
