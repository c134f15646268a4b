package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

// Request is one generated chat request.
type Request struct {
	// Index is the position in the stream, from 0.
	Index int `json:"index"`
	// Tenant is the prompt_cache_key (and the SageMaker prefix-aware id);
	// empty when the run has no tenants.
	Tenant string `json:"tenant,omitempty"`
	// Adapter is the LoRA adapter named as the model; empty for the base.
	Adapter  string        `json:"adapter,omitempty"`
	Messages []sim.Message `json:"messages"`
	// MaxTokens is sent with ignore_eos, so it is the output length.
	MaxTokens int `json:"max_tokens"`
	// Document is the shared prefix's index, or -1.
	Document int `json:"document"`
	// Session and Turn identify a multi-turn session's request (-1, 0 if
	// none). After is the Index of the previous turn, which must complete
	// before this one is sent, or -1.
	Session int `json:"session"`
	Turn    int `json:"turn"`
	After   int `json:"after"`
}

// Prompt is the text the simulator (and the oracle) sees.
func (r Request) Prompt() string { return sim.RenderChat(r.Messages) }

// StreamOptions are the knobs a run adds to a preset.
type StreamOptions struct {
	// Tenants is the number of tenants, each with its own prompt_cache_key
	// ("tenant-00", …); requests pick one uniformly. All tenants draw from
	// the same documents, so the same text appears under several keys and
	// the cache salt keeps them apart. 0 means no key is sent.
	Tenants int
	// AdapterMix is the share of requests (sessions, for KindSessions) that
	// name one of Adapters, picked uniformly.
	AdapterMix float64
	Adapters   []string
}

// Stream is a deterministic, unbounded sequence of requests. Not safe for
// concurrent use.
type Stream struct {
	p    Preset
	seed int64
	o    StreamOptions
	rng  *rand.Rand
	next int

	cdf  []float64 // document popularity
	docs map[int]string

	// KindGroups: the current shuffled pass over (group, question) pairs.
	perm []int

	// KindSessions: open session slots.
	slots    []*session
	sessions int
	system   string
}

type session struct {
	id, turns int
	sent      int
	tenant    string
	adapter   string
	msgs      []sim.Message
	lastIndex int
	lastMax   int
}

// NewStream returns the preset's request stream for seed.
func (p Preset) NewStream(seed int64, o StreamOptions) (*Stream, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if o.Tenants < 0 || o.AdapterMix < 0 || o.AdapterMix > 1 {
		return nil, fmt.Errorf("bench: tenants must be >= 0 and adapter mix within [0, 1]")
	}
	if o.AdapterMix > 0 && len(o.Adapters) == 0 {
		return nil, fmt.Errorf("bench: adapter mix %.2f needs at least one adapter", o.AdapterMix)
	}
	s := &Stream{
		p: p, seed: seed, o: o,
		rng:  rand.New(rand.NewPCG(seedFor(seed, "stream"), seedFor(seed, "stream", 1))),
		docs: make(map[int]string),
	}
	if p.Documents > 0 {
		s.cdf = make([]float64, p.Documents)
		total := 0.0
		for k := range s.cdf {
			w := 1.0
			if p.Zipf > 0 {
				w = 1 / math.Pow(float64(k+1), p.Zipf)
			}
			total += w
			s.cdf[k] = total
		}
		for k := range s.cdf {
			s.cdf[k] /= total
		}
	}
	if p.Kind == KindSessions {
		s.slots = make([]*session, p.Sessions)
		if p.SystemTokens > 0 {
			s.system = Text(seed, "system", p.SystemTokens)
		}
	}
	return s, nil
}

// Preset returns the stream's preset.
func (s *Stream) Preset() Preset { return s.p }

func (s *Stream) doc(k int) string {
	d, ok := s.docs[k]
	if !ok {
		d = Text(s.seed, "document", s.p.DocumentTokens, k)
		s.docs[k] = d
	}
	return d
}

func (s *Stream) pickDoc() int {
	u := s.rng.Float64()
	k := sort.SearchFloat64s(s.cdf, u)
	if k >= len(s.cdf) {
		k = len(s.cdf) - 1
	}
	return k
}

func (s *Stream) pickTenantAdapter() (string, string) {
	var tenant, adapter string
	if s.o.Tenants > 0 {
		tenant = fmt.Sprintf("tenant-%02d", s.rng.IntN(s.o.Tenants))
	}
	if s.o.AdapterMix > 0 && s.rng.Float64() < s.o.AdapterMix {
		adapter = s.o.Adapters[s.rng.IntN(len(s.o.Adapters))]
	}
	return tenant, adapter
}

// Next returns the next request.
func (s *Stream) Next() Request {
	i := s.next
	s.next++
	r := Request{Index: i, Document: -1, Session: -1, After: -1}
	switch s.p.Kind {
	case KindSharedPrefix:
		r.Tenant, r.Adapter = s.pickTenantAdapter()
		r.Document = s.pickDoc()
		q := s.p.QuestionTokens.draw(s.rng)
		r.Messages = []sim.Message{
			{Role: "system", Content: s.doc(r.Document)},
			{Role: "user", Content: Text(s.seed, "question", q, i)},
		}
		r.MaxTokens = s.p.Output.draw(s.rng)
	case KindGroups:
		if len(s.perm) == 0 {
			s.perm = s.rng.Perm(s.p.Documents * s.p.QuestionsPerDocument)
		}
		pair := s.perm[0]
		s.perm = s.perm[1:]
		r.Tenant, r.Adapter = s.pickTenantAdapter()
		r.Document = pair / s.p.QuestionsPerDocument
		q := s.p.QuestionTokens.draw(s.rng)
		r.Messages = []sim.Message{
			{Role: "system", Content: s.doc(r.Document)},
			{Role: "user", Content: Text(s.seed, "group-question", q, r.Document, pair%s.p.QuestionsPerDocument)},
		}
		r.MaxTokens = s.p.Output.draw(s.rng)
	case KindSessions:
		s.nextTurn(&r)
	case KindShort:
		r.Tenant, r.Adapter = s.pickTenantAdapter()
		if s.p.Documents > 0 && s.rng.Float64() < s.p.SharedShare {
			r.Document = s.rng.IntN(s.p.Documents)
			r.Messages = append(r.Messages, sim.Message{Role: "system", Content: s.doc(r.Document)})
		}
		n := s.p.PromptTokens.draw(s.rng)
		r.Messages = append(r.Messages, sim.Message{Role: "user", Content: Text(s.seed, "prompt", n, i)})
		r.MaxTokens = s.p.Output.draw(s.rng)
	}
	return r
}

// nextTurn continues a random open session. The assistant's previous answer
// is deterministic text of exactly the previous max_tokens tokens (the
// length ignore_eos makes the server generate), not the server's output, so
// the stream and the oracle do not depend on the server. A real server
// caches only the prompt's blocks of this text, like the simulator.
func (s *Stream) nextTurn(r *Request) {
	k := s.rng.IntN(len(s.slots))
	ss := s.slots[k]
	if ss == nil || ss.sent >= ss.turns {
		ss = &session{id: s.sessions, turns: s.p.Turns.draw(s.rng), lastIndex: -1}
		s.sessions++
		ss.tenant, ss.adapter = s.pickTenantAdapter()
		if s.system != "" {
			ss.msgs = append(ss.msgs, sim.Message{Role: "system", Content: s.system})
		}
		s.slots[k] = ss
	}
	turn := ss.sent
	if turn > 0 {
		ss.msgs = append(ss.msgs, sim.Message{Role: "assistant", Content: Text(s.seed, "answer", ss.lastMax, ss.id, turn-1)})
	}
	n := s.p.TurnTokens.draw(s.rng)
	ss.msgs = append(ss.msgs, sim.Message{Role: "user", Content: Text(s.seed, "turn", n, ss.id, turn)})
	ss.sent++
	r.Tenant, r.Adapter = ss.tenant, ss.adapter
	r.Session, r.Turn, r.After = ss.id, turn, ss.lastIndex
	r.Messages = append([]sim.Message(nil), ss.msgs...)
	r.MaxTokens = s.p.Output.draw(s.rng)
	ss.lastIndex, ss.lastMax = r.Index, r.MaxTokens
}
