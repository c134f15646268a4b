package proxybench

import (
	"fmt"
	"strings"
)

// bodies returns n distinct SageMaker invoke bodies of exactly size bytes
// ({"inputs": …, "parameters": …}). Each differs from the others within its
// first bytes (the document number leads the text), so a router keyed on
// the first PrefixLength bytes sees n keys, as a fleet of n documents would.
func bodies(n, size int) ([][]byte, error) {
	const words = "the quick brown fox jumps over the lazy dog while the model reads its prompt "
	out := make([][]byte, n)
	for i := range out {
		head := fmt.Sprintf(`{"inputs":"document %04d: `, i)
		tail := `","parameters":{"max_new_tokens":16}}`
		fill := size - len(head) - len(tail)
		if fill < 0 {
			return nil, fmt.Errorf("proxybench: body size %d is below the %d bytes of an invoke body's frame", size, len(head)+len(tail))
		}
		var b strings.Builder
		b.Grow(size)
		b.WriteString(head)
		for fill > 0 {
			w := words[:min(fill, len(words))]
			b.WriteString(w)
			fill -= len(w)
		}
		b.WriteString(tail)
		out[i] = []byte(b.String())
	}
	return out, nil
}
