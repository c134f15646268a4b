package bench

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixrouter/prefixrouter/internal/sim"
)

// vocabulary is a fixed list of pseudo-words. It does not depend on the seed:
// the seed picks the sequence of words, and a fixed vocabulary keeps text of
// the same seed identical across versions of the word list's consumers.
var vocabulary = buildVocabulary(4096)

func buildVocabulary(n int) []string {
	syll := []string{"ka", "lo", "mi", "ne", "ru", "ta", "vo", "si", "de", "pa", "gu", "ho", "fi", "ze", "no", "ba",
		"tr", "en", "al", "or", "is", "um", "an", "et"}
	r := rand.New(rand.NewPCG(0x70726566, 0x69787274))
	seen := make(map[string]bool, n)
	out := make([]string, 0, n)
	for len(out) < n {
		k := 1 + r.IntN(4)
		var b strings.Builder
		for i := 0; i < k; i++ {
			b.WriteString(syll[r.IntN(len(syll))])
		}
		w := b.String()
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}

// seedFor derives an independent 64-bit seed for one named piece of a
// workload (a document, a question, a session), so each piece's text is
// fixed by (seed, name, index) and does not depend on generation order.
func seedFor(seed int64, name string, idx ...int) uint64 {
	d := xxhash.New()
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(seed))
	_, _ = d.Write(buf[:])
	_, _ = d.WriteString(name)
	for _, i := range idx {
		binary.LittleEndian.PutUint64(buf[:], uint64(i))
		_, _ = d.Write(buf[:])
	}
	return d.Sum64()
}

// Text returns deterministic pseudo-English text of exactly tokens tokens
// under sim.CountTokens (tokens × sim.CharsPerToken ASCII characters). It
// starts with a 16-hex-digit tag derived from (seed, name, idx), so two
// distinct pieces of text differ from their first characters: a prefix
// router that looks only at the first characters can tell them apart.
func Text(seed int64, name string, tokens int, idx ...int) string {
	if tokens <= 0 {
		return ""
	}
	s := seedFor(seed, name, idx...)
	n := tokens * sim.CharsPerToken
	var b strings.Builder
	b.Grow(n + 16)
	fmt.Fprintf(&b, "%016x", s)
	r := rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
	sentence := 0
	for b.Len() < n {
		w := vocabulary[r.IntN(len(vocabulary))]
		b.WriteByte(' ')
		if sentence == 0 {
			b.WriteString(strings.ToUpper(w[:1]))
			b.WriteString(w[1:])
		} else {
			b.WriteString(w)
		}
		sentence++
		if sentence > 6 && r.IntN(8) == 0 {
			b.WriteByte('.')
			sentence = 0
		}
	}
	return b.String()[:n]
}
