package gguf

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
)

// Llama is the shape of a llama-architecture model. Zero fields take the
// defaults of a tiny test model: 4 layers, embedding 256, 4 heads, FFN 768,
// context 16,384 (about 25 MB in F16 with a 32,000-token vocabulary).
type Llama struct {
	Layers  int // block_count
	Embed   int // embedding_length
	Heads   int // attention.head_count (and head_count_kv)
	FFN     int // feed_forward_length
	Context int // context_length
	Seed    uint64
}

func (c Llama) withDefaults() Llama {
	c.Layers = cmp.Or(max(c.Layers, 0), 4)
	c.Embed = cmp.Or(max(c.Embed, 0), 256)
	c.Heads = cmp.Or(max(c.Heads, 0), 4)
	c.FFN = cmp.Or(max(c.FFN, 0), 768)
	c.Context = cmp.Or(max(c.Context, 0), 16384)
	return c
}

// Validate reports a shape llama.cpp cannot load.
func (c Llama) Validate() error {
	c = c.withDefaults()
	if c.Embed%c.Heads != 0 || (c.Embed/c.Heads)%2 != 0 {
		return fmt.Errorf("gguf: embedding %d must split into %d heads of an even size (rotary pairs)", c.Embed, c.Heads)
	}
	return nil
}

// WriteRandomLlama writes a llama-architecture model of shape c with
// random F16 weights (normal, standard deviation 0.02, from c.Seed) and
// the tokenizer of vocab (every tokenizer.* pair, copied unchanged). Its
// text is noise, but llama.cpp runs it as any model: tokenizer, prefill,
// KV cache and sampling are real.
func WriteRandomLlama(w io.Writer, vocab *File, c Llama) error {
	if err := c.Validate(); err != nil {
		return err
	}
	c = c.withDefaults()
	if arch, _ := vocab.String("tokenizer.ggml.model"); arch == "" {
		return fmt.Errorf("gguf: the vocabulary file has no tokenizer.ggml.model")
	}
	nVocab, ok := vocab.ArrayLen("tokenizer.ggml.tokens")
	if !ok || nVocab == 0 {
		return fmt.Errorf("gguf: the vocabulary file has no tokenizer.ggml.tokens")
	}
	kvs := []KV{
		String("general.architecture", "llama"),
		String("general.name", "tiny-random-llama"),
		Uint32("general.file_type", 1), // mostly F16
		Uint32("llama.context_length", uint32(c.Context)),
		Uint32("llama.embedding_length", uint32(c.Embed)),
		Uint32("llama.block_count", uint32(c.Layers)),
		Uint32("llama.feed_forward_length", uint32(c.FFN)),
		Uint32("llama.attention.head_count", uint32(c.Heads)),
		Uint32("llama.attention.head_count_kv", uint32(c.Heads)),
		Uint32("llama.rope.dimension_count", uint32(c.Embed/c.Heads)),
		Float32("llama.attention.layer_norm_rms_epsilon", 1e-5),
		Uint32("llama.vocab_size", uint32(nVocab)),
	}
	for _, kv := range vocab.KVs {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			kvs = append(kvs, kv)
		}
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x9e3779b97f4a7c15))
	e, v, f := uint64(c.Embed), uint64(nVocab), uint64(c.FFN)
	// The output projection shares token_embd's weights (llama.cpp ties
	// them when output.weight is absent): a smaller file.
	tensors := []Tensor{
		randomF16(rng, "token_embd.weight", e, v),
		ones("output_norm.weight", e),
	}
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		tensors = append(tensors,
			ones(p+"attn_norm.weight", e),
			randomF16(rng, p+"attn_q.weight", e, e),
			randomF16(rng, p+"attn_k.weight", e, e),
			randomF16(rng, p+"attn_v.weight", e, e),
			randomF16(rng, p+"attn_output.weight", e, e),
			ones(p+"ffn_norm.weight", e),
			randomF16(rng, p+"ffn_gate.weight", e, f),
			randomF16(rng, p+"ffn_up.weight", e, f),
			randomF16(rng, p+"ffn_down.weight", f, e),
		)
	}
	return Write(w, kvs, tensors)
}

// ones is an F32 vector of ones (a norm's weight).
func ones(name string, n uint64) Tensor {
	b := make([]byte, 0, 4*n)
	for range n {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(1))
	}
	return Tensor{Name: name, Dims: []uint64{n}, Type: F32, Data: b}
}

// randomF16 is a cols×rows F16 matrix of normal values with standard
// deviation 0.02.
func randomF16(rng *rand.Rand, name string, cols, rows uint64) Tensor {
	b := make([]byte, 2*cols*rows)
	for i := 0; i < len(b); i += 2 {
		binary.LittleEndian.PutUint16(b[i:], float16(float32(0.02*rng.NormFloat64())))
	}
	return Tensor{Name: name, Dims: []uint64{cols, rows}, Type: F16, Data: b}
}

// float16 converts f to IEEE 754 half precision, rounding to nearest
// (ties away from zero) and flushing values below the smallest normal
// half (6.1e-5) to zero: enough for random weights.
func float16(f float32) uint16 {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	exp := int((bits>>23)&0xff) - 127 + 15
	mant := bits & 0x7fffff
	switch {
	case exp <= 0:
		return sign
	case exp >= 0x1f:
		return sign | 0x7c00 // infinity
	}
	h := uint32(exp)<<10 | mant>>13
	if mant&0x1000 != 0 {
		h++ // may carry into the exponent, which is still correct
	}
	if h >= 0x7c00 {
		return sign | 0x7c00
	}
	return sign | uint16(h)
}
