package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

// vocab is a small vocabulary file's metadata, as a tokenizer-only GGUF
// (llama.cpp's ggml-vocab-*.gguf) holds it.
func vocab(t *testing.T, tokens ...string) *File {
	t.Helper()
	arr := binary.LittleEndian.AppendUint32(nil, uint32(TypeString))
	arr = binary.LittleEndian.AppendUint64(arr, uint64(len(tokens)))
	for _, tok := range tokens {
		arr = append(arr, String("", tok).Raw...)
	}
	kvs := []KV{
		String("general.architecture", "llama"),
		String("tokenizer.ggml.model", "llama"),
		{Key: "tokenizer.ggml.tokens", Type: TypeArray, Raw: arr},
		Uint32("tokenizer.ggml.bos_token_id", 1),
	}
	var b bytes.Buffer
	if err := Write(&b, kvs, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Read(&b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestWriteThenRead: pairs of every kind come back as written, in order,
// and tensor data starts and ends aligned.
func TestWriteThenRead(t *testing.T) {
	nested := binary.LittleEndian.AppendUint32(nil, uint32(TypeArray))
	nested = binary.LittleEndian.AppendUint64(nested, 1)
	nested = binary.LittleEndian.AppendUint32(nested, uint32(TypeUint8))
	nested = binary.LittleEndian.AppendUint64(nested, 2)
	nested = append(nested, 7, 9)
	kvs := []KV{
		String("general.name", "t"),
		Uint32("n", 42),
		Float32("eps", 1e-5),
		{Key: "flag", Type: TypeBool, Raw: []byte{1}},
		{Key: "big", Type: TypeUint64, Raw: binary.LittleEndian.AppendUint64(nil, 1<<40)},
		{Key: "nested", Type: TypeArray, Raw: nested},
	}
	tensors := []Tensor{
		{Name: "a", Dims: []uint64{3}, Type: F32, Data: make([]byte, 12)},
		{Name: "b", Dims: []uint64{5, 3}, Type: F16, Data: make([]byte, 30)},
	}
	var b bytes.Buffer
	if err := Write(&b, kvs, tensors); err != nil {
		t.Fatal(err)
	}
	// Data: 12 bytes padded to 32, then 30 padded to 32.
	if b.Len()%Alignment != 0 {
		t.Fatalf("file of %d bytes: not aligned", b.Len())
	}
	f, err := Read(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != Version || f.Tensors != 2 || len(f.KVs) != len(kvs) {
		t.Fatalf("version %d, %d tensors, %d pairs", f.Version, f.Tensors, len(f.KVs))
	}
	for i, kv := range kvs {
		if got := f.KVs[i]; got.Key != kv.Key || got.Type != kv.Type || !bytes.Equal(got.Raw, kv.Raw) {
			t.Errorf("pair %d: %+v, want %+v", i, got, kv)
		}
	}
	if s, ok := f.String("general.name"); !ok || s != "t" {
		t.Errorf("String: %q %v", s, ok)
	}
	if n, ok := f.ArrayLen("nested"); !ok || n != 1 {
		t.Errorf("ArrayLen: %d %v", n, ok)
	}
	if _, ok := f.String("n"); ok {
		t.Error("String of a uint32 pair succeeded")
	}
}

// TestReadRejectsMalformedFiles: each defect is an error wrapping
// ErrFormat, without allocating what a corrupt length claims.
func TestReadRejectsMalformedFiles(t *testing.T) {
	var good bytes.Buffer
	if err := Write(&good, []KV{String("k", "v")}, nil); err != nil {
		t.Fatal(err)
	}
	header := func(version uint32, kvs uint64) []byte {
		b := append([]byte(Magic), binary.LittleEndian.AppendUint32(nil, version)...)
		b = binary.LittleEndian.AppendUint64(b, 0)
		return binary.LittleEndian.AppendUint64(b, kvs)
	}
	pair := func(typ ValueType, value ...byte) []byte {
		b := append(header(Version, 1), String("", "k").Raw...)
		b = binary.LittleEndian.AppendUint32(b, uint32(typ))
		return append(b, value...)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"bad magic", append([]byte("GGML"), good.Bytes()[4:]...), "magic"},
		{"version 1", header(1, 0), "version 1"},
		{"version 4", header(4, 0), "version 4"},
		{"too many pairs", header(Version, 1<<40), "key-value pairs"},
		{"truncated pair", pair(TypeString, append(binary.LittleEndian.AppendUint64(nil, 10), 'a')...), "truncated"},
		{"unknown type", pair(99), "unknown value type 99"},
		{"huge string", pair(TypeString, binary.LittleEndian.AppendUint64(nil, 1<<50)...), "string of"},
		{"huge array", pair(TypeArray, append(binary.LittleEndian.AppendUint32(nil, uint32(TypeUint8)), binary.LittleEndian.AppendUint64(nil, 1<<50)...)...), "array of"},
	} {
		_, err := Read(bytes.NewReader(tc.in))
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrFormat mentioning %q", tc.name, err, tc.want)
		}
	}
}

// TestWriteRejectsABadTensor: data that does not match the dimensions, or
// a type the writer does not know, fails before anything is written.
func TestWriteRejectsABadTensor(t *testing.T) {
	for _, tc := range []Tensor{
		{Name: "short", Dims: []uint64{4}, Type: F32, Data: make([]byte, 8)},
		{Name: "no dims", Type: F32},
		{Name: "q4", Dims: []uint64{32}, Type: 2, Data: make([]byte, 18)},
	} {
		var b bytes.Buffer
		if err := Write(&b, nil, []Tensor{tc}); err == nil || !strings.Contains(err.Error(), tc.Name) || b.Len() != 0 {
			t.Errorf("%s: err %v, %d bytes written", tc.Name, err, b.Len())
		}
	}
}

func TestFloat16(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {65504, 0x7bff},
		{0.1, 0x2e66}, {-0.02, 0xa51f}, {1e-8, 0}, {1e6, 0x7c00}, {float32(math.Inf(-1)), 0xfc00},
		{65520, 0x7c00}, // rounds up past the largest half
	} {
		if got := float16(tc.f); got != tc.want {
			t.Errorf("float16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
}

// TestWriteRandomLlama: the model has llama's keys, the vocabulary's
// tokenizer unchanged, and the tensors of its shape; a vocabulary without a
// tokenizer, or heads that do not split the embedding, fail.
func TestWriteRandomLlama(t *testing.T) {
	v := vocab(t, "<unk>", "<s>", "</s>", "a", "b", "c", "d", "e")
	c := Llama{Layers: 2, Embed: 16, Heads: 2, FFN: 24, Context: 64, Seed: 3}
	var b bytes.Buffer
	if err := WriteRandomLlama(&b, v, c); err != nil {
		t.Fatal(err)
	}
	f, err := Read(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if arch, _ := f.String("general.architecture"); arch != "llama" || f.Tensors != 2+9*2 {
		t.Fatalf("architecture %q, %d tensors", arch, f.Tensors)
	}
	for _, key := range []string{"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id"} {
		want, _ := v.Get(key)
		if got, ok := f.Get(key); !ok || !bytes.Equal(got.Raw, want.Raw) {
			t.Errorf("%s not copied", key)
		}
	}
	if got, _ := f.Get("llama.embedding_length"); binary.LittleEndian.Uint32(got.Raw) != 16 {
		t.Errorf("embedding_length %v", got.Raw)
	}
	// Same seed, same bytes: the model is reproducible.
	var again bytes.Buffer
	if err := WriteRandomLlama(&again, v, c); err != nil || !bytes.Equal(again.Bytes(), b.Bytes()) {
		t.Errorf("a second model from the same seed differs (err %v)", err)
	}
	if err := WriteRandomLlama(&again, &File{}, c); err == nil {
		t.Error("a vocabulary without a tokenizer: no error")
	}
	if err := WriteRandomLlama(&again, v, Llama{Embed: 30, Heads: 4}); err == nil {
		t.Error("30 dimensions in 4 heads: no error")
	}
}
