package router

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is a small JSON walker specialised for routing: it finds the few
// fields the key needs and skips everything else without decoding it.
// encoding/json (Unmarshal into a typed struct with json.RawMessage content)
// took 89–125 µs per 16 KiB chat body (BenchmarkChatKeyStdlib), twenty times
// the 5 µs pick budget, because it validates and decodes every byte; this
// walker takes ~3 µs on the same body (BenchmarkChatKey). The walker checks the structure of the whole body (objects,
// arrays, strings, literals; numbers loosely) so malformed JSON still gets a
// 400, finds string ends with bytes.IndexByte, and decodes escapes only in
// the strings it reads. A raw control character (U+0000..U+001F) inside any
// string it walks is a 400, as RFC 8259 §7 requires them escaped (issue 19:
// three such bodies reached the model server); the check reads eight bytes
// at a time.

// errMalformed is wrapped by every syntax error of the walker.
var errMalformed = errors.New("malformed JSON")

const maxDepth = 512

type scanner struct {
	b []byte
	i int
	// checked says that b was walked already, its strings checked for
	// control characters (a message's content, walked again once its
	// role is known).
	checked bool
}

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at offset %d: %s", errMalformed, s.i, fmt.Sprintf(format, args...))
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		if s.i >= len(s.b) {
			return s.errorf("unexpected end, want %q", c)
		}
		return s.errorf("got %q, want %q", s.b[s.i], c)
	}
	s.i++
	return nil
}

// str scans a string starting at the opening quote and returns its raw
// contents (between the quotes, escapes undecoded).
func (s *scanner) str() ([]byte, error) {
	if s.peek() != '"' {
		return nil, s.errorf("want a string")
	}
	start := s.i + 1
	j := start
	for {
		k := bytes.IndexByte(s.b[j:], '"')
		if k < 0 {
			s.i = len(s.b)
			return nil, s.errorf("unterminated string")
		}
		j += k
		// The quote ends the string unless an odd run of backslashes
		// precedes it.
		bs := 0
		for p := j - 1; p >= start && s.b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			if !s.checked {
				if k := controlAt(s.b[start:j]); k >= 0 {
					s.i = start + k
					return nil, s.errorf("unescaped control character %U in a string", rune(s.b[s.i]))
				}
			}
			s.i = j + 1
			return s.b[start:j], nil
		}
		j++
	}
}

// skip scans one value of any type.
func (s *scanner) skip(depth int) error {
	if depth > maxDepth {
		return s.errorf("nested too deep")
	}
	switch c := s.peek(); c {
	case '"':
		_, err := s.str()
		return err
	case '{':
		s.i++
		if s.peek() == '}' {
			s.i++
			return nil
		}
		for {
			if _, err := s.str(); err != nil {
				return err
			}
			if err := s.expect(':'); err != nil {
				return err
			}
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			if done, err := s.next('}'); done || err != nil {
				return err
			}
		}
	case '[':
		s.i++
		if s.peek() == ']' {
			s.i++
			return nil
		}
		for {
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			if done, err := s.next(']'); done || err != nil {
				return err
			}
		}
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	case 0:
		return s.errorf("unexpected end")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return s.number()
		}
		return s.errorf("unexpected %q", c)
	}
}

// next consumes the separator after a member or element: it reports done at
// the closing byte, continues at a comma, and fails otherwise.
func (s *scanner) next(closing byte) (done bool, err error) {
	switch s.peek() {
	case ',':
		s.i++
		return false, nil
	case closing:
		s.i++
		return true, nil
	}
	return false, s.errorf("want ',' or %q", closing)
}

// object walks the JSON object at the scanner, calling member with each
// member's name (escapes decoded, so "m\u006fdel" is "model", as the model
// server's decoder reads it) and the scanner at its value; member must
// consume the value. A repeated name is passed again: callers let the later
// member replace the earlier one, as every JSON decoder does.
func (s *scanner) object(member func(name []byte) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		name, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := member(decoded(name)); err != nil {
			return err
		}
		if done, err := s.next('}'); done || err != nil {
			return err
		}
	}
}

// array walks the JSON array at the scanner, calling elem with each
// element's index and the scanner at the element; elem must consume it, or
// return an error, which ends the walk and is returned.
func (s *scanner) array(elem func(i int) error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for i := 0; ; i++ {
		if err := elem(i); err != nil {
			return err
		}
		if done, err := s.next(']'); done || err != nil {
			return err
		}
	}
}

func (s *scanner) literal(word string) error {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return s.errorf("bad literal")
	}
	s.i += len(word)
	return nil
}

func (s *scanner) number() error {
	start := s.i
	for s.i < len(s.b) && isNumberByte(s.b[s.i]) {
		s.i++
	}
	if s.i == start || s.b[s.i-1] == '-' {
		return s.errorf("bad number")
	}
	return nil
}

func isNumberByte(c byte) bool {
	return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// end checks that only whitespace follows the top-level value.
func (s *scanner) end() error {
	if s.peek() != 0 {
		return s.errorf("data after the top-level value")
	}
	return nil
}

// decoded returns the decoded contents of a raw JSON string: raw itself when
// it has no escape (no allocation), else its unescaped bytes. Member names
// and the values compared against constants go through it, so that
// "mod\u0065l" is the model field here as it is for the model server
// (issue 12: comparing raw bytes routed {"model":"base","mod\u0065l":"x"}
// as base while x was served). A malformed escape returns raw, which then
// matches nothing; the model server rejects such a body.
func decoded(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw
	}
	s, err := unquote(raw)
	if err != nil {
		return raw
	}
	return []byte(s)
}

// unquote decodes the raw contents of a string as encoding/json does:
// escapes decoded, and each byte of invalid UTF-8 read as U+FFFD (a
// model name of "\xff" is "\ufffd" to an exact decoder, issue 12's seed
// corpus found).
func unquote(raw []byte) (string, error) {
	if bytes.IndexByte(raw, '\\') < 0 {
		if utf8.Valid(raw) {
			return string(raw), nil
		}
		return string(appendValidUTF8(nil, raw)), nil
	}
	out := make([]byte, 0, len(raw))
	for len(raw) > 0 {
		if raw[0] != '\\' {
			k := bytes.IndexByte(raw, '\\')
			if k < 0 {
				k = len(raw)
			}
			out = appendValidUTF8(out, raw[:k])
			raw = raw[k:]
			continue
		}
		r, n, err := unescape(raw)
		if err != nil {
			return "", err
		}
		out = utf8.AppendRune(out, r)
		raw = raw[n:]
	}
	return string(out), nil
}

// appendValidUTF8 appends b to out with each byte of an invalid UTF-8
// sequence replaced by U+FFFD, as encoding/json decodes strings.
func appendValidUTF8(out, b []byte) []byte {
	if utf8.Valid(b) {
		return append(out, b...)
	}
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

// unescape decodes the escape sequence at the start of raw (raw[0] == '\\')
// and returns the rune and the bytes it took. Lone surrogates decode to
// U+FFFD, as encoding/json does.
func unescape(raw []byte) (rune, int, error) {
	if len(raw) < 2 {
		return 0, 0, fmt.Errorf("%w: truncated escape", errMalformed)
	}
	switch raw[1] {
	case '"', '\\', '/':
		return rune(raw[1]), 2, nil
	case 'b':
		return '\b', 2, nil
	case 'f':
		return '\f', 2, nil
	case 'n':
		return '\n', 2, nil
	case 'r':
		return '\r', 2, nil
	case 't':
		return '\t', 2, nil
	case 'u':
		r, ok := hex4(raw[2:])
		if !ok {
			return 0, 0, fmt.Errorf("%w: bad \\u escape", errMalformed)
		}
		if utf16.IsSurrogate(r) {
			if len(raw) >= 12 && raw[6] == '\\' && raw[7] == 'u' {
				if r2, ok := hex4(raw[8:]); ok {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						return d, 12, nil
					}
				}
			}
			return utf8.RuneError, 6, nil
		}
		return r, 6, nil
	}
	return 0, 0, fmt.Errorf("%w: bad escape %q", errMalformed, raw[:2])
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// controlAt returns the index of the first byte below 0x20 in b, or -1. It
// tests eight bytes at a time: x-0x20…20 sets a byte's high bit where the
// byte is below 0x20 or borrowed from, and &^x drops bytes whose own high
// bit was set; the first such byte is always a real one.
func controlAt(b []byte) int {
	const lo, hi = 0x2020202020202020, 0x8080808080808080
	i := 0
	for ; i+32 <= len(b); i += 32 {
		w := b[i : i+32 : i+32]
		x0, x1 := binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:])
		x2, x3 := binary.LittleEndian.Uint64(w[16:]), binary.LittleEndian.Uint64(w[24:])
		if ((x0-lo)&^x0|(x1-lo)&^x1|(x2-lo)&^x2|(x3-lo)&^x3)&hi != 0 {
			break
		}
	}
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		if (x-lo)&^x&hi != 0 {
			break
		}
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return i
		}
	}
	return -1
}
