package router

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// Data-plane API keys (issue 12), for deployments without a gateway in
// front. Off unless Options.APIKeys lists some. A request presents its key
// as OpenAI's clients do, "Authorization: Bearer <key>", or in
// HeaderAPIKey: AWS SDKs sign every request with SigV4 and so own
// Authorization; they add the header through a middleware
// (docs/security.md shows how). Only SHA-256 digests of the keys are kept,
// compared in constant time; the key never goes upstream and is never
// logged.

// HeaderAPIKey carries a data-plane API key where Authorization is taken
// (AWS SDKs sign it with SigV4).
const HeaderAPIKey = "X-Prefixrouter-Api-Key"

// MinAPIKeyBytes is the shortest API key accepted: 128 bits of printable
// ASCII at the very least.
const MinAPIKeyBytes = 16

// digestPrefix marks an entry that is a key's SHA-256 digest, not the key.
const digestPrefix = "sha256:"

// Codes and types of a refused key.
const (
	codeInvalidAPIKey = "invalid_api_key"
	// errUnrecognizedClient is what AWS answers a request whose
	// credentials it does not know; AWS SDKs surface it as an API error
	// with that code.
	errUnrecognizedClient = "UnrecognizedClientException"
)

// ParseAPIKeys reads an API-keys file (--api-keys-file): one entry per
// line, either a key (MinAPIKeyBytes or more printable ASCII characters
// without spaces) or "sha256:" and the hex SHA-256 digest of one, so that
// the file need not hold keys in clear. Blank lines and lines starting
// with '#' are skipped. It returns the entries as digests ("sha256:…"),
// the form Options.APIKeys keeps; errors name the line, never the key,
// and wrap fleet.ErrInvalid.
func ParseAPIKeys(data []byte) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if !strings.HasPrefix(line, digestPrefix) {
			if err := checkAPIKey(line); err != nil {
				return nil, fmt.Errorf("router: %w API key on line %d: %w", fleet.ErrInvalid, n, err)
			}
			sum := sha256.Sum256([]byte(line))
			line = digestPrefix + hex.EncodeToString(sum[:])
		}
		if _, err := parseDigest(line); err != nil {
			return nil, fmt.Errorf("router: %w API key on line %d: %w", fleet.ErrInvalid, n, err)
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("router: %w API keys: %w", fleet.ErrInvalid, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("router: %w API keys: the file lists no key", fleet.ErrInvalid)
	}
	return out, nil
}

// checkAPIKey checks a key in clear without quoting it.
func checkAPIKey(k string) error {
	if len(k) < MinAPIKeyBytes {
		return fmt.Errorf("a key must have at least %d characters, this one has %d", MinAPIKeyBytes, len(k))
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("a key must be printable ASCII without spaces (byte %d is not)", i)
		}
	}
	return nil
}

// parseDigest decodes a "sha256:<hex>" entry.
func parseDigest(e string) ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	h, ok := strings.CutPrefix(e, digestPrefix)
	if !ok {
		return d, fmt.Errorf("an entry must be a key or %s followed by %d hex digits", digestPrefix, 2*sha256.Size)
	}
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != sha256.Size {
		return d, fmt.Errorf("%s must be followed by %d hex digits", digestPrefix, 2*sha256.Size)
	}
	copy(d[:], b)
	return d, nil
}

// apiKeys is the set of accepted keys, as digests. Immutable.
type apiKeys struct{ digests [][sha256.Size]byte }

// newAPIKeys builds the set from validated Options.APIKeys; nil when
// there are none (keys off).
func newAPIKeys(entries []string) *apiKeys {
	if len(entries) == 0 {
		return nil
	}
	k := &apiKeys{}
	for _, e := range entries {
		d, _ := parseDigest(e) // validated in Options.Validate
		k.digests = append(k.digests, d)
	}
	return k
}

// allows reports whether key is one of the set's. It compares the key's
// digest with every entry, whichever matches, so its time tells nothing
// about which entry came close.
func (k *apiKeys) allows(key string) bool {
	if key == "" {
		return false
	}
	d := sha256.Sum256([]byte(key))
	match := 0
	for i := range k.digests {
		match |= subtle.ConstantTimeCompare(d[:], k.digests[i][:])
	}
	return match == 1
}

// presentedKey returns the key a request carries: HeaderAPIKey, else the
// token of "Authorization: Bearer …" (a SigV4 Authorization is not one).
func presentedKey(h http.Header) string {
	if k := h.Get(HeaderAPIKey); k != "" {
		return k
	}
	auth := h.Get("Authorization")
	if len(auth) > len("Bearer ") && strings.EqualFold(auth[:len("Bearer ")], "Bearer ") {
		return strings.TrimSpace(auth[len("Bearer "):])
	}
	return ""
}

// withAPIKeys asks every request but the probes' (/ping, /healthz,
// /readyz) for a key in keys, answering 401 in the shape of the path's API
// without one. Unknown paths are refused too, so that the router's paths
// cannot be mapped without a key. An accepted request goes on without its
// key and without Authorization, so neither reaches an instance.
func withAPIKeys(keys *apiKeys, next http.Handler) http.Handler {
	if keys == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/ping", "/healthz", "/readyz":
			next.ServeHTTP(w, req)
			return
		}
		ok := keys.allows(presentedKey(req.Header))
		req.Header.Del(HeaderAPIKey)
		req.Header.Del("Authorization")
		if !ok {
			refuseKey(w, req.URL.Path)
			return
		}
		next.ServeHTTP(w, req)
	})
}

// refuseKey answers 401: OpenAI's invalid_api_key on OpenAI paths, AWS's
// UnrecognizedClientException on invoke paths.
func refuseKey(w http.ResponseWriter, path string) {
	h := w.Header()
	h.Set("WWW-Authenticate", `Bearer realm="prefixrouter"`)
	if strings.HasSuffix(path, "/invocations") || strings.HasSuffix(path, "/invocations-response-stream") {
		msg := "The API key included in the request is missing or invalid: send it in " + HeaderAPIKey + "."
		h.Set("Content-Type", "application/json")
		h.Set(HeaderError, codeInvalidAPIKey)
		h.Set(HeaderErrorType, errUnrecognizedClient)
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(sageMakerError{ErrorCode: errUnrecognizedClient, Message: msg, LowerMessage: msg})
		return
	}
	writeError(w, kindChat, http.StatusUnauthorized, codeInvalidAPIKey, "Incorrect or missing API key: send it as Authorization: Bearer <key>.")
}
