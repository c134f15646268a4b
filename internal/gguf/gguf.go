// Package gguf reads and writes GGUF, llama.cpp's model file format, far
// enough to build a tiny model with random weights for tests: the metadata
// of a file (its key-value pairs, kept as their encoded bytes so that they
// copy verbatim) and a writer of metadata and tensors.
//
// The format (llama.cpp docs/gguf.md, version 3): the magic "GGUF", a
// uint32 version, the tensor and key-value counts (uint64), the key-value
// pairs (a string key, a uint32 value type, the value), the tensor infos
// (name, dimension count, dimensions, ggml type, offset into the data),
// then the tensor data, each tensor aligned to general.alignment (32).
// Everything is little-endian; a string is a uint64 length and its bytes.
package gguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Magic opens every GGUF file; Version is the version this package writes.
const (
	Magic   = "GGUF"
	Version = 3
)

// Alignment is the default alignment of tensor data (general.alignment).
const Alignment = 32

// ValueType is the type of a metadata value.
type ValueType uint32

// The value types of GGUF version 3.
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

// fixedSize is the encoded size of the fixed-size types; 0 for string and
// array.
func (t ValueType) fixedSize() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// TensorType is a ggml tensor type; this package writes F32 and F16.
type TensorType uint32

// The tensor types this package writes.
const (
	F32 TensorType = 0
	F16 TensorType = 1
)

// KV is one metadata pair. Raw is the encoded value (after the type), so
// a pair read from one file is written to another unchanged.
type KV struct {
	Key  string
	Type ValueType
	Raw  []byte
}

// File is the metadata of a GGUF file: its key-value pairs in file order
// and the number of tensors it declares.
type File struct {
	Version uint32
	KVs     []KV
	Tensors uint64
}

// Limits on what a reader accepts, so that a corrupt file fails with an
// error instead of an allocation of its claimed size.
const (
	maxKVs       = 1 << 16
	maxString    = 1 << 24
	maxArrayLen  = 1 << 24
	maxNestDepth = 4
)

// ErrFormat is wrapped by every error about a malformed file.
var ErrFormat = errors.New("gguf: malformed file")

// ReadFile reads the metadata of the GGUF file at path.
func ReadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := Read(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Read reads the header and key-value pairs of a GGUF file from r (the
// tensor infos and data that follow are left unread).
func Read(r io.Reader) (*File, error) {
	d := decoder{r: r}
	var magic [4]byte
	d.full(magic[:])
	if d.err == nil && string(magic[:]) != Magic {
		return nil, fmt.Errorf("%w: magic %q, want %q", ErrFormat, magic[:], Magic)
	}
	f := &File{Version: d.u32()}
	if d.err == nil && (f.Version < 2 || f.Version > Version) {
		return nil, fmt.Errorf("%w: version %d (this reader knows 2 and 3)", ErrFormat, f.Version)
	}
	f.Tensors = d.u64()
	n := d.u64()
	if d.err == nil && n > maxKVs {
		return nil, fmt.Errorf("%w: %d key-value pairs", ErrFormat, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		key := string(d.str())
		typ := ValueType(d.u32())
		var raw bytes.Buffer
		d.value(&raw, typ, 0)
		if d.err != nil {
			return nil, fmt.Errorf("key %q: %w", key, d.err)
		}
		f.KVs = append(f.KVs, KV{Key: key, Type: typ, Raw: raw.Bytes()})
	}
	if d.err != nil {
		return nil, d.err
	}
	return f, nil
}

// Get returns the pair named key.
func (f *File) Get(key string) (KV, bool) {
	for _, kv := range f.KVs {
		if kv.Key == key {
			return kv, true
		}
	}
	return KV{}, false
}

// String returns the string value of key.
func (f *File) String(key string) (string, bool) {
	kv, ok := f.Get(key)
	if !ok || kv.Type != TypeString || len(kv.Raw) < 8 {
		return "", false
	}
	return string(kv.Raw[8:]), true
}

// ArrayLen returns the length of the array value of key.
func (f *File) ArrayLen(key string) (int, bool) {
	kv, ok := f.Get(key)
	if !ok || kv.Type != TypeArray || len(kv.Raw) < 12 {
		return 0, false
	}
	return int(binary.LittleEndian.Uint64(kv.Raw[4:])), true
}

// decoder reads little-endian values, keeping the first error.
type decoder struct {
	r   io.Reader
	err error
	b   [8]byte
}

func (d *decoder) full(p []byte) {
	if d.err != nil {
		return
	}
	if _, err := io.ReadFull(d.r, p); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w: truncated", ErrFormat)
		}
		d.err = err
	}
}

func (d *decoder) u32() uint32 {
	d.full(d.b[:4])
	return binary.LittleEndian.Uint32(d.b[:4])
}

func (d *decoder) u64() uint64 {
	d.full(d.b[:8])
	return binary.LittleEndian.Uint64(d.b[:8])
}

func (d *decoder) str() []byte {
	n := d.u64()
	if d.err != nil {
		return nil
	}
	if n > maxString {
		d.err = fmt.Errorf("%w: string of %d bytes", ErrFormat, n)
		return nil
	}
	b := make([]byte, n)
	d.full(b)
	return b
}

// value copies one encoded value of type t to w.
func (d *decoder) value(w *bytes.Buffer, t ValueType, depth int) {
	if d.err != nil {
		return
	}
	if size := t.fixedSize(); size > 0 {
		d.full(d.b[:size])
		w.Write(d.b[:size])
		return
	}
	switch t {
	case TypeString:
		s := d.str()
		_ = binary.Write(w, binary.LittleEndian, uint64(len(s)))
		w.Write(s)
	case TypeArray:
		if depth >= maxNestDepth {
			d.err = fmt.Errorf("%w: arrays nested deeper than %d", ErrFormat, maxNestDepth)
			return
		}
		et := ValueType(d.u32())
		n := d.u64()
		if d.err != nil {
			return
		}
		if n > maxArrayLen {
			d.err = fmt.Errorf("%w: array of %d values", ErrFormat, n)
			return
		}
		_ = binary.Write(w, binary.LittleEndian, uint32(et))
		_ = binary.Write(w, binary.LittleEndian, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			d.value(w, et, depth+1)
		}
	default:
		d.err = fmt.Errorf("%w: unknown value type %d", ErrFormat, t)
	}
}

// Helpers that encode the scalar values a writer needs.

// Uint32 is a uint32 pair.
func Uint32(key string, v uint32) KV {
	return KV{Key: key, Type: TypeUint32, Raw: binary.LittleEndian.AppendUint32(nil, v)}
}

// Float32 is a float32 pair.
func Float32(key string, v float32) KV {
	return KV{Key: key, Type: TypeFloat32, Raw: binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))}
}

// String is a string pair.
func String(key, v string) KV {
	return KV{Key: key, Type: TypeString, Raw: append(binary.LittleEndian.AppendUint64(nil, uint64(len(v))), v...)}
}

// Tensor is one tensor to write: Dims in ggml order (the first dimension
// varies fastest), Data its encoded values (len = product of Dims × the
// type's element size).
type Tensor struct {
	Name string
	Dims []uint64
	Type TensorType
	Data []byte
}

func (t Tensor) size() (uint64, error) {
	elem := uint64(4)
	switch t.Type {
	case F32:
	case F16:
		elem = 2
	default:
		return 0, fmt.Errorf("gguf: tensor %q: type %d not supported by this writer", t.Name, t.Type)
	}
	n := elem
	for _, d := range t.Dims {
		n *= d
	}
	if len(t.Dims) == 0 || n != uint64(len(t.Data)) {
		return 0, fmt.Errorf("gguf: tensor %q: %d bytes of data for dimensions %v", t.Name, len(t.Data), t.Dims)
	}
	return n, nil
}

// Write writes a GGUF version 3 file of kvs and tensors to w.
func Write(w io.Writer, kvs []KV, tensors []Tensor) error {
	bw := bufio.NewWriter(w)
	var e encoder
	e.b = append(e.b, Magic...)
	e.u32(Version)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		e.str(kv.Key)
		e.u32(uint32(kv.Type))
		e.b = append(e.b, kv.Raw...)
	}
	var offset uint64
	for _, t := range tensors {
		n, err := t.size()
		if err != nil {
			return err
		}
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(offset)
		offset += pad(n)
	}
	e.b = append(e.b, make([]byte, pad(uint64(len(e.b)))-uint64(len(e.b)))...)
	if _, err := bw.Write(e.b); err != nil {
		return err
	}
	var zeros [Alignment]byte
	for _, t := range tensors {
		if _, err := bw.Write(t.Data); err != nil {
			return err
		}
		n := uint64(len(t.Data))
		if _, err := bw.Write(zeros[:pad(n)-n]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// pad rounds n up to the alignment.
func pad(n uint64) uint64 { return (n + Alignment - 1) / Alignment * Alignment }

type encoder struct{ b []byte }

func (e *encoder) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) str(s string) { e.u64(uint64(len(s))); e.b = append(e.b, s...) }
