package router

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"sync"
)

// Tenant cache isolation (issue 8). vLLM's prefix cache hashes cache_salt
// into the first block of a request, so requests with different salts never
// share cached blocks. With TenantCacheSalt on, an OpenAI request that
// carries a tenant id (prompt_cache_key) gets cache_salt = a keyed hash of
// the endpoint and tenant: one tenant's requests share their cache on every
// replica (same key), two tenants never do, even on one instance, and a
// client cannot pick another tenant's salt (a cache_salt it sent itself is
// overridden: JSON decoders take the last of repeated keys).

// defaultSaltKey is the key when Options.CacheSaltKey is empty.
const defaultSaltKey = "prefixrouter tenant cache salt v1"

// saltLen is the salt's length in hex characters (128 bits).
const saltLen = 32

// salter computes tenant salts. Its MACs are pooled: the request path
// allocates only the new body.
type salter struct{ pool sync.Pool }

func newSalter(key string) *salter {
	if key == "" {
		key = defaultSaltKey
	}
	k := []byte(key)
	return &salter{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, k) }}}
}

// salt returns the hex salt of tenant on endpoint, appended to dst.
func (s *salter) salt(dst []byte, endpoint, tenant string) []byte {
	m := s.pool.Get().(hash.Hash)
	m.Reset()
	_, _ = m.Write([]byte(endpoint))
	_, _ = m.Write([]byte{0})
	_, _ = m.Write([]byte(tenant))
	var sum [sha256.Size]byte
	m.Sum(sum[:0])
	s.pool.Put(m)
	return hex.AppendEncode(dst, sum[:saltLen/2])
}

// withCacheSalt returns body, a JSON object the scanner has accepted, with
// "cache_salt" set last: a new slice; body is not modified.
func (s *salter) withCacheSalt(body []byte, endpoint, tenant string) []byte {
	end := len(body) - 1
	for end > 0 && body[end] != '}' {
		end-- // trailing whitespace
	}
	start := 0
	for start < end && body[start] != '{' {
		start++ // leading whitespace
	}
	empty := len(bytes.TrimSpace(body[start+1:end])) == 0
	out := make([]byte, 0, end+saltRoom)
	out = append(out, body[:end]...)
	if !empty {
		out = append(out, ',')
	}
	return s.member(out, endpoint, tenant)
}

// member appends the object's last member and its closing brace to dst:
// `"cache_salt":"<salt>"}`.
func (s *salter) member(dst []byte, endpoint, tenant string) []byte {
	dst = append(dst, `"cache_salt":"`...)
	dst = s.salt(dst, endpoint, tenant)
	return append(dst, `"}`...)
}

// A salted body that streams (issue 19: salted endpoints read every body
// whole, outside the body arena). Its key is decided on its head like any
// OpenAI body's, and the rest streams to the instance through a
// tailSalter: it holds back only a last closing brace and the whitespace
// after it, and at the body's end sends `,"cache_salt":"…"}` in their
// place. The salt stays the object's last member, as withCacheSalt puts it.
// The head held a member (the tenant's prompt_cache_key), so the comma is
// always due.

// maxTailSpace bounds the whitespace held back after a closing brace: a
// salted body with more after one (its end, or inside a string) fails.
const maxTailSpace = 4 << 10

var errTailSpace = fmt.Errorf("router: more than %d bytes of whitespace after a closing brace in a salted body", maxTailSpace)

// tailSalter rewrites a streamed body's end. It belongs to the goroutine
// that sends the body.
type tailSalter struct {
	member []byte // `,"cache_salt":"<salt>"}`
	held   []byte // a closing brace and the whitespace after it; empty when none
	ended  bool
}

// streamed trims head of what a tailSalter must hold back and returns
// the trimmed head and the tailSalter that sends the rest.
func (s *salter) streamed(head []byte, endpoint, tenant string) ([]byte, *tailSalter) {
	t := &tailSalter{member: s.member(append(make([]byte, 0, saltRoom), ','), endpoint, tenant)}
	i := lastNonSpace(head)
	if i < 0 || head[i] != '}' || len(head)-i > maxTailSpace+1 {
		return head, t
	}
	t.held = append(t.held, head[i:]...)
	return head[:i], t
}

// next appends to dst what of b can go on now: all of it but a last
// closing brace and the whitespace after it, which it holds back (and
// sends before b when b shows they were not the body's end).
func (t *tailSalter) next(dst, b []byte) ([]byte, error) {
	i := lastNonSpace(b)
	if i < 0 {
		if len(t.held) == 0 {
			return append(dst, b...), nil
		}
		if len(t.held)+len(b) > maxTailSpace+1 {
			return dst, errTailSpace
		}
		t.held = append(t.held, b...)
		return dst, nil
	}
	dst = append(dst, t.held...)
	t.held = t.held[:0]
	if b[i] != '}' {
		return append(dst, b...), nil
	}
	if len(b)-i > maxTailSpace+1 {
		return dst, errTailSpace
	}
	t.held = append(t.held, b[i:]...)
	return append(dst, b[:i]...), nil
}

// end appends the body's end to dst: the salt member in place of the held
// brace. A body that did not end with one is no JSON object: it went on as
// it was, for the model server to refuse.
func (t *tailSalter) end(dst []byte) []byte {
	if t.ended {
		return dst
	}
	t.ended = true
	if len(t.held) == 0 {
		return dst
	}
	t.held = t.held[:0]
	return append(dst, t.member...)
}

// lastNonSpace is the index of b's last byte that is not JSON whitespace,
// -1 when there is none.
func lastNonSpace(b []byte) int {
	i := len(b) - 1
	for i >= 0 && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i--
	}
	return i
}

// saltedRest is the rest of a salted body, streamed through its
// tailSalter; r is nil when the head was all of the body.
type saltedRest struct {
	r   io.Reader
	t   *tailSalter
	out []byte // rewritten bytes not yet read
	off int
	eof bool
}

// reader returns the reader of rest through t. The rest of a body held in
// the arena stays a *heldRest (its buffer goes back once the head is sent);
// t rewrites the client's reader inside it.
func (t *tailSalter) reader(rest io.Reader) io.Reader {
	if hr, ok := rest.(*heldRest); ok {
		hr.r = &saltedRest{r: hr.r, t: t}
		return hr
	}
	return &saltedRest{r: rest, t: t}
}

func (s *saltedRest) Read(p []byte) (int, error) {
	for s.off == len(s.out) {
		if s.eof {
			return 0, io.EOF
		}
		n, err := 0, error(io.EOF)
		if s.r != nil {
			n, err = s.r.Read(p)
		}
		var terr error
		if s.out, terr = s.t.next(s.out[:0], p[:n]); terr != nil {
			return 0, terr
		}
		s.off = 0
		switch {
		case err == io.EOF:
			s.out, s.eof = s.t.end(s.out), true
		case err != nil:
			return 0, err
		}
	}
	n := copy(p, s.out[s.off:])
	s.off += n
	return n, nil
}
