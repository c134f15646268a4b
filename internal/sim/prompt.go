package sim

import (
	"strings"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Token approximation shared by the simulator and the benchmark's oracle.
//
// A real server tokenizes; the simulator approximates one token as
// CharsPerToken Unicode code points of prompt text (the common approximation
// for English, also used by the Gateway API Inference Extension's prefix
// scorer). The KV cache works in blocks of BlockTokens tokens like vLLM's, so
// a block covers BlockChars characters of text.
const (
	CharsPerToken = 4
	BlockTokens   = 16
	BlockChars    = CharsPerToken * BlockTokens
)

// Message is one chat message as the simulator renders it.
type Message struct {
	Role    string
	Content string
}

// RenderChat renders chat messages into the prompt text the model would
// see, in the spirit of a chat template: a role header, the content, a
// separator. The simulator and the oracle both use it, so they agree on
// which leading blocks two requests share.
func RenderChat(msgs []Message) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	b.WriteString("<|assistant|>\n")
	return b.String()
}

// CountTokens returns the approximate number of tokens of text.
func CountTokens(text string) int {
	n := utf8.RuneCountInString(text)
	return (n + CharsPerToken - 1) / CharsPerToken
}

// BlockHashes returns the chained hashes of the full blocks of text, like
// vLLM's: each block's hash covers its parent's hash, its content and the
// extras (adapter and cache salt), so two prompts share a block hash exactly
// when they share every character up to the end of that block and the same
// extras. Only full blocks are hashed (vLLM caches only full blocks).
func BlockHashes(adapter, salt, text string) []uint64 {
	full := utf8.RuneCountInString(text) / BlockChars
	if full == 0 {
		return nil
	}
	out := make([]uint64, 0, full)
	d := xxhash.New()
	_, _ = d.WriteString(adapter)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(salt)
	parent := d.Sum64()
	var buf [8]byte
	start, chars := 0, 0
	for i := 0; i < len(text) && len(out) < full; {
		_, size := utf8.DecodeRuneInString(text[i:])
		i += size
		chars++
		if chars == BlockChars {
			d.Reset()
			for k := 0; k < 8; k++ {
				buf[k] = byte(parent >> (8 * k))
			}
			_, _ = d.Write(buf[:])
			_, _ = d.WriteString(text[start:i])
			parent = d.Sum64()
			out = append(out, parent)
			start, chars = i, 0
		}
	}
	return out
}
