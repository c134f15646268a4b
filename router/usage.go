package router

import (
	"bytes"
	"strconv"
)

// usageScanner finds OpenAI's usage object in a response as it streams
// through the proxy: the whole JSON of a non-streamed answer, or the SSE
// chunks of a streamed one (the last chunk carries usage when the client
// asked for stream_options.include_usage). It looks at the bytes the proxy
// copies anyway; it neither buffers the body nor delays it, and keeps at
// most one usage object (maxUsageBytes). A `"usage"` byte sequence can
// only be a key: inside a JSON string its quotes would be escaped. When
// usage appears more than once (vLLM's continuous usage stats), the last
// one wins: its counts are cumulative.
type usageScanner struct {
	match  int  // bytes of usageKey matched at the end of the last chunk
	state  int8 // scanIdle, scanValue (before the object), scanObject
	depth  int
	inStr  bool
	esc    bool
	n      int
	buf    [maxUsageBytes]byte
	found  bool
	prompt int64
	cached int64
}

const (
	scanIdle int8 = iota
	scanValue
	scanObject
)

// maxUsageBytes bounds the usage object kept; vLLM's is about 150 bytes.
const maxUsageBytes = 512

var usageKey = []byte(`"usage"`)

// feed scans the next bytes of the body.
func (u *usageScanner) feed(p []byte) {
	for len(p) > 0 {
		switch {
		case u.state != scanIdle:
			p = u.capture(p)
		case u.match > 0:
			// Continue a match that straddles two reads.
			for u.match < len(usageKey) && len(p) > 0 && p[0] == usageKey[u.match] {
				u.match++
				p = p[1:]
			}
			switch {
			case u.match == len(usageKey):
				u.match, u.state = 0, scanValue
			case len(p) > 0:
				u.match = 0 // mismatch: rescan p from here
			}
		default:
			i := bytes.Index(p, usageKey)
			if i >= 0 {
				p = p[i+len(usageKey):]
				u.state = scanValue
				continue
			}
			u.match = suffixPrefix(p, usageKey)
			return
		}
	}
}

// suffixPrefix is the length of the longest suffix of p that is a proper
// prefix of key.
func suffixPrefix(p, key []byte) int {
	for k := min(len(key)-1, len(p)); k > 0; k-- {
		if bytes.HasSuffix(p, key[:k]) {
			return k
		}
	}
	return 0
}

// capture consumes the usage value: whitespace and the colon, then an object
// kept in buf until its braces balance (null or anything else is skipped).
func (u *usageScanner) capture(p []byte) []byte {
	for i, c := range p {
		if u.state == scanValue {
			switch c {
			case ' ', '\t', '\r', '\n', ':':
				continue
			case '{':
				u.state, u.depth, u.n, u.inStr, u.esc = scanObject, 0, 0, false, false
			default:
				u.state = scanIdle // null, or a "usage" that is not OpenAI's
				return p[i:]
			}
		}
		if u.n == len(u.buf) {
			u.state = scanIdle // too large to be OpenAI's usage
			return p[i:]
		}
		u.buf[u.n] = c
		u.n++
		switch {
		case u.inStr:
			switch {
			case u.esc:
				u.esc = false
			case c == '\\':
				u.esc = true
			case c == '"':
				u.inStr = false
			}
		case c == '"':
			u.inStr = true
		case c == '{':
			u.depth++
		case c == '}':
			u.depth--
			if u.depth == 0 {
				u.state = scanIdle
				if prompt, cached, ok := parseUsage(u.buf[:u.n]); ok {
					u.found, u.prompt, u.cached = true, prompt, cached
				}
				return p[i+1:]
			}
		}
	}
	return nil
}

// parseUsage reads prompt_tokens and prompt_tokens_details.cached_tokens
// (0 when absent or null) from a usage object.
func parseUsage(b []byte) (prompt, cached int64, ok bool) {
	s := scanner{b: b}
	err := s.object(func(name []byte) error {
		switch string(name) {
		case "prompt_tokens":
			v, err := intValue(&s)
			prompt, ok = v, err == nil
			return err
		case "prompt_tokens_details":
			if s.peek() != '{' {
				return s.skip(1)
			}
			return s.object(func(name []byte) error {
				if string(name) == "cached_tokens" {
					v, err := intValue(&s)
					cached = v
					return err
				}
				return s.skip(2)
			})
		}
		return s.skip(1)
	})
	if err != nil || prompt < 0 || cached < 0 || cached > prompt {
		return 0, 0, false
	}
	return prompt, cached, ok
}

// intValue reads an integer, or null as 0.
func intValue(s *scanner) (int64, error) {
	if s.peek() == 'n' {
		return 0, s.literal("null")
	}
	start := s.i
	if err := s.number(); err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
}
