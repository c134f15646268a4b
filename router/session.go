package router

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"strings"
)

// Stateful sessions carry their instance in the id the client sees, so
// that every replica routes a session's requests to the instance that
// opened it with no state shared between replicas (or kept in one). Issue
// 19: those ids were base64(instance) "." container-id, so a client could
// make one up for any instance (one outside its adapter's set included),
// and with --hide-instance-id learn which instance ids exist from the
// answers to made-up ids. Now the router seals the instance: the id is
//
//	base64url(tag ‖ ciphertext) "." container-id
//
// where tag = HMAC-SHA256(macKey, endpoint, instance, container-id)
// truncated to 16 bytes and ciphertext = AES-256-CTR(encKey, iv = tag) of
// the instance id: a deterministic authenticated encryption (the SIV
// construction of RFC 5297, with HMAC for its MAC). Deterministic: the
// container's closing answer gives the client back the id it sent. Both
// keys derive from the endpoint's session key, which every replica of the
// endpoint shares (--session-key-file, or etcd: the replica's
// Options.SessionKeys). A tampered, forged or foreign (other endpoint, other
// key) id fails the tag before anything is looked up: every one gets the
// same ValidationError, whether its instance exists or not.

// MinSessionKeyBytes is the shortest session key accepted.
const MinSessionKeyBytes = 32

// sessionTagBytes is the length of an id's tag.
const sessionTagBytes = 16

var sessionEncoding = base64.RawURLEncoding

// sessionKeys finds an endpoint's session key.
type sessionKeys struct {
	// fixed is Options.SessionKey, or a random key of this process.
	fixed []byte
	// per is Options.SessionKeys; nil when not set.
	per func(endpoint string) []byte
}

// newSessionKeys returns the keys of opts; without a fixed key it makes a
// random one, with which sessions work through this replica only.
func newSessionKeys(fixed []byte, per func(string) []byte) sessionKeys {
	if len(fixed) == 0 {
		fixed = make([]byte, MinSessionKeyBytes)
		_, _ = rand.Read(fixed)
	}
	return sessionKeys{fixed: fixed, per: per}
}

// secrets derives the MAC and encryption keys of endpoint.
func (k sessionKeys) secrets(endpoint string) (mac, enc []byte) {
	key := k.fixed
	if k.per != nil {
		if b := k.per(endpoint); len(b) > 0 {
			key = b
		}
	}
	derive := func(label string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(label))
		h.Write([]byte{0})
		h.Write([]byte(endpoint))
		return h.Sum(nil)
	}
	return derive("prefixrouter session id mac"), derive("prefixrouter session id enc")
}

// tag authenticates instance and sid.
func sessionTag(mac []byte, instance, sid string) []byte {
	h := hmac.New(sha256.New, mac)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(instance)))
	h.Write(n[:])
	h.Write([]byte(instance))
	h.Write([]byte(sid))
	return h.Sum(nil)[:sessionTagBytes]
}

// xorCTR encrypts (or decrypts) b in place with AES-256-CTR under enc with
// iv.
func xorCTR(enc, iv, b []byte) {
	block, err := aes.NewCipher(enc)
	if err != nil {
		panic(err) // enc is a SHA-256 sum: always 32 bytes
	}
	cipher.NewCTR(block, iv).XORKeyStream(b, b)
}

// seal is the id the client sees for the container's session id sid on
// instance.
func (k sessionKeys) seal(endpoint, instance, sid string) string {
	mac, enc := k.secrets(endpoint)
	tag := sessionTag(mac, instance, sid)
	b := append(append(make([]byte, 0, sessionTagBytes+len(instance)), tag...), instance...)
	xorCTR(enc, tag, b[sessionTagBytes:])
	return sessionEncoding.EncodeToString(b) + "." + sid
}

// open returns the instance and the container's id of a client's id, ok
// false unless this endpoint's key sealed it.
func (k sessionKeys) open(endpoint, id string) (instance, sid string, ok bool) {
	enc64, sid, found := strings.Cut(id, ".")
	if !found || sid == "" || len(enc64) > 4*(sessionTagBytes+256)/3+4 {
		return "", "", false
	}
	b, err := sessionEncoding.DecodeString(enc64)
	if err != nil || len(b) <= sessionTagBytes {
		return "", "", false
	}
	mac, enc := k.secrets(endpoint)
	tag, ct := b[:sessionTagBytes], b[sessionTagBytes:]
	xorCTR(enc, tag, ct)
	if subtle.ConstantTimeCompare(tag, sessionTag(mac, string(ct), sid)) != 1 {
		return "", "", false
	}
	return string(ct), sid, true
}

// rewrite turns the container's session id at the start of header h
// (SageMaker's "<id>; Expires=<time>" for a new session) into the client's.
func (k sessionKeys) rewrite(hdr http.Header, h, endpoint, instance string) {
	v := hdr.Get(h)
	if v == "" {
		return
	}
	sid, rest, _ := strings.Cut(v, ";")
	if rest != "" {
		rest = ";" + rest
	}
	hdr.Set(h, k.seal(endpoint, instance, strings.TrimSpace(sid))+rest)
}
