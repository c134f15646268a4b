package router

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
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
	out := make([]byte, 0, end+len(`,"cache_salt":""}`)+saltLen)
	out = append(out, body[:end]...)
	if !empty {
		out = append(out, ',')
	}
	out = append(out, `"cache_salt":"`...)
	out = s.salt(out, endpoint, tenant)
	return append(out, `"}`...)
}
