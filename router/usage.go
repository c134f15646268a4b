package router

import (
	"bytes"
	"strconv"

	"github.com/prefixrouter/prefixrouter/engine"
)

// usageScanner finds OpenAI's usage object in a response as it streams
// through the proxy: the whole JSON of a non-streamed answer, or the SSE
// chunks of a streamed one (the last chunk carries usage when the client
// asked for stream_options.include_usage; llama-server sends it always).
// It looks at the bytes the proxy copies anyway; it neither buffers the
// body nor delays it, and keeps at most one object (maxUsageBytes). A
// `"usage"` byte sequence can only be a key: inside a JSON string its
// quotes would be escaped. When usage appears more than once (vLLM's
// continuous usage stats), the last one wins: its counts are cumulative.
//
// Cached prompt tokens come from where the instance's engine reports them
// (engine.Profile.Cached, set in from by forEngine): OpenAI's
// usage.prompt_tokens_details.cached_tokens, or llama-server's "timings"
// object (issue 20: its cache was never counted), read only when the
// answer has no prompt_tokens_details.
type usageScanner struct {
	from  engine.Cached // where to read cached tokens; 0 means every known place
	match [numKeys]int8 // bytes of each key matched at the end of the last chunk
	state int8          // scanIdle, scanValue (before the object), scanObject
	key   int8          // the key whose object is being captured
	depth int
	inStr bool
	esc   bool
	n     int
	buf   [maxUsageBytes]byte

	found  bool
	prompt int64
	cached int64

	// What the objects said so far; -1 when absent.
	details         int64 // usage.prompt_tokens_details.cached_tokens
	promptN, cacheN int64 // timings.prompt_n, timings.cache_n
	timingsSeen     bool
}

const (
	scanIdle int8 = iota
	scanValue
	scanObject
)

// The keys whose objects the scanner captures.
const (
	keyUsage int8 = iota
	keyTimings
	numKeys
)

var scanKeys = [numKeys][]byte{[]byte(`"usage"`), []byte(`"timings"`)}

// maxUsageBytes bounds the object kept; vLLM's usage is about 150 bytes,
// llama-server's timings about 260.
const maxUsageBytes = 512

// keys returns how many of scanKeys to look for: llama-server's timings
// only when the engine may report its cache there, and only after a usage
// object (llama-server writes timings after usage in every answer that
// has both: server.cpp appends them to the finished object), so that the
// chunks before the last cost one search, not two.
func (u *usageScanner) keys() int8 {
	if u.found && (u.from == 0 || u.from&engine.CachedTimings != 0) {
		return numKeys
	}
	return keyUsage + 1
}

// feed scans the next bytes of the body.
func (u *usageScanner) feed(p []byte) {
	for len(p) > 0 {
		nk := u.keys()
		switch {
		case u.state != scanIdle:
			p = u.capture(p)
		case u.partial():
			// Continue the matches that straddle two reads, a byte at a
			// time. A byte that fails every match is scanned again: it may
			// start a key (only '"' can, and no key has one inside).
			c, advanced := p[0], false
			for k := range nk {
				switch m := u.match[k]; {
				case m == 0:
				case scanKeys[k][m] != c:
					u.match[k] = 0
				default:
					u.match[k]++
					advanced = true
					if int(u.match[k]) == len(scanKeys[k]) {
						u.match = [numKeys]int8{}
						u.state, u.key = scanValue, k
					}
				}
			}
			if advanced {
				p = p[1:]
			}
		default:
			at, k := bytes.Index(p, scanKeys[keyUsage]), keyUsage
			if nk > keyTimings {
				if j := bytes.Index(p, scanKeys[keyTimings]); j >= 0 && (at < 0 || j < at) {
					at, k = j, keyTimings
				}
			}
			if at >= 0 {
				p = p[at+len(scanKeys[k]):]
				u.state, u.key = scanValue, k
				continue
			}
			u.match[keyUsage] = int8(suffixPrefix(p, scanKeys[keyUsage]))
			if nk > keyTimings {
				u.match[keyTimings] = int8(suffixPrefix(p, scanKeys[keyTimings]))
			}
			return
		}
	}
}

// partial reports whether a key's match straddles the last read (a key
// not looked for has no match: nk only grows).
func (u *usageScanner) partial() bool { return u.match != [numKeys]int8{} }

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

// capture consumes the value: whitespace and the colon, then an object
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
				u.state = scanIdle // null, or a key that is not the engine's
				return p[i:]
			}
		}
		if u.n == len(u.buf) {
			u.state = scanIdle // too large to be what we look for
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
				u.parsed(u.buf[:u.n])
				return p[i+1:]
			}
		}
	}
	return nil
}

// parsed records one captured object and recomputes the counts.
func (u *usageScanner) parsed(b []byte) {
	switch u.key {
	case keyUsage:
		prompt, details, ok := parseUsage(b)
		if !ok {
			return
		}
		u.found, u.prompt, u.details = true, prompt, details
	case keyTimings:
		promptN, cacheN, ok := parseTimings(b)
		if !ok {
			return
		}
		u.timingsSeen, u.promptN, u.cacheN = true, promptN, cacheN
	}
	u.cached = u.cachedTokens()
}

// cachedTokens is what the answer reports the prefix cache served, from
// the places the engine uses: OpenAI's details first; else llama-server's
// timings, cache_n where present, else the prompt tokens it did not
// evaluate (prompt_n counts those it did). A count that does not fit the
// prompt is dropped (0).
func (u *usageScanner) cachedTokens() int64 {
	from := u.from
	if from == 0 {
		from = engine.CachedUsage | engine.CachedTimings
	}
	if !u.found {
		return 0
	}
	var c int64
	switch {
	case from&engine.CachedUsage != 0 && u.details >= 0:
		c = u.details
	case from&engine.CachedTimings != 0 && u.timingsSeen && u.cacheN >= 0:
		c = u.cacheN
	case from&engine.CachedTimings != 0 && u.timingsSeen && u.promptN >= 0:
		c = u.prompt - u.promptN
	}
	if c < 0 || c > u.prompt {
		return 0
	}
	return c
}

// parseUsage reads prompt_tokens and prompt_tokens_details.cached_tokens
// (-1 when absent or null) from a usage object.
func parseUsage(b []byte) (prompt, cached int64, ok bool) {
	s := scanner{b: b}
	cached = -1
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
					v, null, err := nullableInt(&s)
					if !null {
						cached = v
					}
					return err
				}
				return s.skip(2)
			})
		}
		return s.skip(1)
	})
	if err != nil || prompt < 0 || cached > prompt {
		return 0, -1, false
	}
	return prompt, cached, ok
}

// parseTimings reads prompt_n and cache_n (-1 when absent) from
// llama-server's timings object.
func parseTimings(b []byte) (promptN, cacheN int64, ok bool) {
	s := scanner{b: b}
	promptN, cacheN = -1, -1
	err := s.object(func(name []byte) error {
		var dst *int64
		switch string(name) {
		case "prompt_n":
			dst = &promptN
		case "cache_n":
			dst = &cacheN
		default:
			return s.skip(1)
		}
		v, null, err := nullableInt(&s)
		if !null {
			*dst = v
		}
		return err
	})
	if err != nil || promptN < -1 || cacheN < -1 || (promptN < 0 && cacheN < 0) {
		return -1, -1, false
	}
	return promptN, cacheN, true
}

// intValue reads an integer, or null as 0.
func intValue(s *scanner) (int64, error) {
	v, _, err := nullableInt(s)
	return v, err
}

// nullableInt reads an integer, or null (null true, v 0).
func nullableInt(s *scanner) (v int64, null bool, err error) {
	if s.peek() == 'n' {
		return 0, true, s.literal("null")
	}
	start := s.i
	if err := s.number(); err != nil {
		return 0, false, err
	}
	v, err = strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
	return v, false, err
}
