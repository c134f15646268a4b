package router

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Boundary markers written into the prefix digest. They are bytes that never
// occur in UTF-8 text, so no prompt text can forge a boundary: "ab"+"c" and
// "a"+"bc" hash differently. They do not count towards PrefixLength.
const (
	markRole  = 0xFF // before each chat message, around its role
	markPart  = 0xFE // between text parts of one message / strings of a prompt list
	markToken = 0xFD // before each non-string prompt element (token ids)
)

// MaxTenantIDLength bounds the tenant id (SageMaker's limit).
const MaxTenantIDLength = 64

// validTenant reports whether id is 1..64 printable ASCII characters.
func validTenant(id string) bool {
	if len(id) == 0 || len(id) > MaxTenantIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// routingKey is hash(tenant, model, prefix digest), each field length-framed
// so that no two different (tenant, model) pairs share a byte stream.
func routingKey(tenant, model string, prefix uint64) uint64 {
	var d xxhash.Digest
	d.Reset()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(tenant)))
	_, _ = d.Write(n[:])
	_, _ = d.WriteString(tenant)
	binary.LittleEndian.PutUint64(n[:], uint64(len(model)))
	_, _ = d.Write(n[:])
	_, _ = d.WriteString(model)
	binary.LittleEndian.PutUint64(n[:], prefix)
	_, _ = d.Write(n[:])
	return d.Sum64()
}

// The depths of a prompt (issue 21): its prefixes are digested at
// firstDepth units, doubling up to the endpoint's PrefixLength, and at
// PrefixLength itself, in the one pass that hashes the prompt. Units are
// those of PrefixLength: bytes on invoke paths, code points of message
// text on OpenAI paths. The ladder starts at SageMaker's default
// PrefixLength, so that a request nobody made hot routes on the key a
// fixed-length endpoint of today gives it (the same instance, the same
// movement on scale events). On chat paths the ends of the first
// messageDepths messages past messageFloor units are depths too: a
// conversation's first messages (a system prompt, a session's first turn
// or task) end at the same place in every turn, while the ladder's next
// depth may fall beyond a short first turn and move the session once
// (measured on the agent preset: most second turns moved before these
// depths were added; on chat, whose first turns are shorter than 4,096
// characters, the fixed key moved every session after its first turn).
const (
	firstDepth    = 4096
	ladderDepths  = 5 // 4 Ki ... 64 Ki: the ladder of the largest PrefixLength
	messageFloor  = 512
	messageDepths = 4
	maxLevels     = ladderDepths + messageDepths
)

// depthAt is the ladder's i-th depth for prefixLen.
func depthAt(i, prefixLen int) int { return min(firstDepth<<i, prefixLen) }

// prefixDigests are the digests of a prompt's prefixes at its depths,
// shallowest first, ending with the digest of the whole prefix
// (PrefixLength units, or the whole prompt when it is shorter). Depths past
// the prompt's end would repeat that last digest and are left out: n counts
// the distinct ones. The last one is the fixed-length key's digest.
type prefixDigests struct {
	d  [maxLevels]uint64
	at [maxLevels]int32 // units hashed at each depth
	n  int
}

// add appends digest v of the first at units unless it repeats the last
// one (nothing was written since).
func (p *prefixDigests) add(v uint64, at int) {
	if p.n > 0 && p.d[p.n-1] == v {
		return
	}
	p.d[p.n], p.at[p.n] = v, int32(at)
	p.n++
}

// last is the digest of the whole prefix.
func (p *prefixDigests) last() uint64 { return p.d[p.n-1] }

// invokeDigests digests the first prefixLen bytes of a raw body at the
// ladder's depths.
func invokeDigests(body []byte, prefixLen int) prefixDigests {
	var out prefixDigests
	var d xxhash.Digest
	d.Reset()
	at := 0
	for i := 0; at < min(len(body), prefixLen); i++ {
		next := min(depthAt(i, prefixLen), len(body))
		_, _ = d.Write(body[at:next])
		at = next
		out.add(d.Sum64(), at)
	}
	if out.n == 0 {
		out.add(d.Sum64(), 0) // an empty body
	}
	return out
}

// prefixHasher streams decoded prompt text into a digest until prefixLen
// code points have been written, without building the prefix string, and
// takes the digest at each depth of the ladder on the way (Sum64 does not
// disturb the running state).
type prefixHasher struct {
	d         xxhash.Digest
	prefixLen int
	left      int // code points still to hash
	next      int // code points to the ladder's next depth (≤ left)
	level     int // the ladder's next depth's index
	sums      prefixDigests
	// spent, when set, is asked after each message or prompt element once
	// the budget is spent: true ends the walk there (errKeyKnown).
	spent func() bool
}

// errKeyKnown ends a walk of a body's head once the key's inputs are known
// (parseOpenAIHead).
var errKeyKnown = errors.New("router: routing key known")

// done reports whether the walk may end here: the budget is spent and the
// caller knows the rest of the key.
func (h *prefixHasher) done() bool { return h.left <= 0 && h.spent != nil && h.spent() }

func (h *prefixHasher) reset(prefixLen int) {
	h.d.Reset()
	h.prefixLen, h.left, h.level, h.sums = prefixLen, prefixLen, 0, prefixDigests{}
	h.next = depthAt(0, prefixLen)
}

// advance counts n code points just written (n ≤ h.next) and takes the
// digest when they reach the ladder's next depth.
func (h *prefixHasher) advance(n int) {
	h.left -= n
	h.next -= n
	if h.next > 0 {
		return
	}
	h.sums.add(h.d.Sum64(), h.prefixLen-h.left)
	h.level++
	if h.left > 0 {
		h.next = depthAt(h.level, h.prefixLen) - (h.prefixLen - h.left)
	}
}

// digests returns the digests of the walk so far: those taken at the
// ladder's depths and, when the prompt ended before PrefixLength, the
// digest of all of it.
func (h *prefixHasher) digests() prefixDigests {
	out := h.sums
	if h.left > 0 || out.n == 0 {
		out.add(h.d.Sum64(), h.prefixLen-h.left)
	}
	return out
}

// messageEnd takes the digest at the end of a chat message: a depth when
// it is one of the first messageDepths messages and past messageFloor
// units (a short system prompt shared by unrelated requests is no prefix
// worth keying them on).
func (h *prefixHasher) messageEnd(msg int) {
	if at := h.prefixLen - h.left; msg < messageDepths && h.left > 0 && at >= messageFloor {
		h.sums.add(h.d.Sum64(), at)
	}
}

func (h *prefixHasher) mark(m byte, label []byte) {
	if h.left <= 0 {
		return
	}
	var b [1]byte
	b[0] = m
	_, _ = h.d.Write(b[:])
	if label != nil {
		_, _ = h.d.Write(label)
		_, _ = h.d.Write(b[:])
	}
}

// text hashes the decoded contents of a raw JSON string, up to the budget.
func (h *prefixHasher) text(raw []byte) error {
	for len(raw) > 0 && h.left > 0 {
		run := raw
		k := bytes.IndexByte(raw, '\\')
		if k >= 0 {
			run = raw[:k]
		}
		for len(run) > 0 {
			n, cut := cutCodePoints(run, h.next)
			_, _ = h.d.Write(run[:cut])
			h.advance(n)
			if h.left <= 0 {
				return nil // budget spent
			}
			run = run[cut:] // past a depth of the ladder, or all of it
		}
		if k < 0 {
			// The budget can end exactly before an escape (above): it
			// must not take one more code point than the plain text
			// would (found by FuzzParseOpenAI's canonical-form oracle).
			return nil
		}
		r, size, err := unescape(raw[k:])
		if err != nil {
			return err
		}
		var enc [utf8.UTFMax]byte
		_, _ = h.d.Write(enc[:utf8.EncodeRune(enc[:], r)])
		h.advance(1)
		raw = raw[k+size:]
	}
	return nil
}

// value hashes the text of the JSON string at the scanner.
func (h *prefixHasher) value(s *scanner) error {
	raw, err := s.str()
	if err != nil {
		return err
	}
	return h.text(raw)
}

// cutCodePoints counts the code points at the start of b, up to left, as the
// bytes that are not UTF-8 continuation bytes (10xxxxxx), eight at a time.
// It returns the count and the length of the prefix of b that holds exactly
// them (with the continuation bytes of the last). For valid UTF-8 this is
// the number of Unicode code points; invalid bytes count deterministically.
func cutCodePoints(b []byte, left int) (n, cut int) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		// Bit 7 of each byte of cont is set for a continuation byte: bit 7
		// set and bit 6 (shifted into bit 7) clear.
		cont := x &^ (x << 1) & 0x8080808080808080
		starts := 8 - bits.OnesCount64(cont)
		if n+starts > left {
			break
		}
		n += starts
	}
	for ; i < len(b); i++ {
		if b[i]&0xC0 != 0x80 {
			if n == left {
				return n, i
			}
			n++
		}
	}
	return n, len(b)
}

// openAIRequest holds the fields of an OpenAI request that routing needs.
type openAIRequest struct {
	model       string
	tenant      string
	hasTenant   bool
	prefix      uint64
	digests     prefixDigests // prefix at the ladder's depths; last is prefix
	hasMessages bool
	// stream is the body's "stream": true, as far as the walk read: a
	// head walk (parseOpenAIHead) ends where the key is known, and a
	// stream member after that point is not seen.
	stream bool
}

// parseOpenAI walks a chat (chat=true) or completions body once: it takes
// model and prompt_cache_key, and hashes the first prefixLen code points of
// the prompt text (messages or prompt) into prefix.
func parseOpenAI(body []byte, chat bool, prefixLen int) (openAIRequest, error) {
	return walkOpenAI(body, chat, prefixLen, false)
}

// parseOpenAIHead walks the start of a body and reports whether it holds
// the key's inputs, so that the rest need not be read before the pick: the
// model and prompt_cache_key members (null counts), and the prompt's first
// prefixLen code points or all of it, all before the end of head. The key
// is then the one parseOpenAI gives for the whole body, unless the rest
// repeats one of those members (JSON decoders take the last; the router
// does not read that far). A head that does not (yet) hold them, or is
// malformed, gives ok false: read more, and parse the whole body at its
// end.
func parseOpenAIHead(head []byte, chat bool, prefixLen int) (openAIRequest, bool) {
	out, err := walkOpenAI(head, chat, prefixLen, true)
	return out, errors.Is(err, errKeyKnown)
}

// walkOpenAI is parseOpenAI; with head it ends with errKeyKnown as soon as
// the key's inputs are known (parseOpenAIHead).
func walkOpenAI(body []byte, chat bool, prefixLen int, head bool) (openAIRequest, error) {
	var out openAIRequest
	var hasModel, tenantSeen, promptDone bool
	var h prefixHasher
	h.reset(prefixLen)
	if head {
		h.spent = func() bool { return hasModel && tenantSeen }
	}
	known := func() error {
		if head && hasModel && tenantSeen && promptDone {
			out.digests = h.digests()
			out.prefix = out.digests.last()
			return errKeyKnown
		}
		return nil
	}
	s := scanner{b: body}
	if s.peek() != '{' {
		return out, s.errorf("the body must be a JSON object")
	}
	err := s.object(func(name []byte) error {
		switch {
		case string(name) == "model":
			raw, err := s.str()
			if err != nil {
				return fmt.Errorf("%w: model must be a string", err)
			}
			out.model, err = unquote(raw)
			hasModel = err == nil
			if err != nil {
				return err
			}
			return known()
		case string(name) == "prompt_cache_key":
			tenantSeen = true
			if s.peek() == 'n' {
				out.tenant, out.hasTenant = "", false
				if err := s.literal("null"); err != nil {
					return err
				}
				return known()
			}
			raw, err := s.str()
			if err != nil {
				return fmt.Errorf("%w: prompt_cache_key must be a string", err)
			}
			out.tenant, err = unquote(raw)
			out.hasTenant = err == nil
			if err != nil {
				return err
			}
			return known()
		case chat && string(name) == "messages":
			h.reset(prefixLen) // a repeated key replaces the earlier one, as in encoding/json
			out.hasMessages = true
			return promptKnown(messages(&s, &h), &promptDone, known)
		case !chat && string(name) == "prompt":
			h.reset(prefixLen)
			out.hasMessages = true
			return promptKnown(prompt(&s, &h), &promptDone, known)
		case string(name) == "stream":
			// The answer streams: the first-byte timeout applies to it
			// (proxy.go). A value that is not a boolean is the model
			// server's to refuse.
			out.stream = s.peek() == 't'
			if out.stream {
				return s.literal("true")
			}
		}
		return s.skip(1)
	})
	if err != nil {
		return out, err
	}
	if err := s.end(); err != nil {
		return out, err
	}
	out.digests = h.digests()
	out.prefix = out.digests.last()
	return out, nil
}

// promptKnown finishes the walk of a prompt member: the walk inside it
// ended (errKeyKnown) or it was read whole, and then the key may be known.
func promptKnown(err error, done *bool, known func() error) error {
	switch {
	case errors.Is(err, errKeyKnown):
		*done = true
		return known()
	case err != nil:
		return err
	}
	*done = true
	return known()
}

// messages hashes a chat messages array: for each message its role as a
// boundary, then its text.
func messages(s *scanner, h *prefixHasher) error {
	if s.peek() == 'n' {
		return s.literal("null") // no messages: the model server will say so
	}
	if s.peek() != '[' {
		return s.errorf("messages must be an array")
	}
	return s.array(func(msg int) error {
		if s.peek() != '{' {
			return s.errorf("each message must be an object")
		}
		var role []byte
		cStart, cEnd := -1, -1
		err := s.object(func(name []byte) error {
			switch string(name) {
			case "role":
				// A repeated member replaces the earlier one, as in every
				// JSON decoder the model server may use.
				role = nil
				if s.peek() != '"' {
					return s.skip(2) // not a role; the model server will judge
				}
				raw, err := s.str()
				role = decoded(raw)
				return err
			case "content":
				cStart = s.i
				err := s.skip(2)
				cEnd = s.i
				return err
			}
			return s.skip(2)
		})
		if err != nil {
			return err
		}
		// Role and content may come in either order: hash once the message
		// is complete, and only while the budget lasts.
		if h.left > 0 {
			h.mark(markRole, role)
			if cStart >= 0 {
				if err := content(&scanner{b: s.b[cStart:cEnd], checked: true}, h); err != nil {
					return err
				}
			}
			h.messageEnd(msg)
		}
		if h.done() {
			return errKeyKnown
		}
		return nil
	})
}

// errBudgetSpent ends the walk of a content array once the prefix budget is
// spent: the rest cannot change the key, and the message around it was
// checked already.
var errBudgetSpent = errors.New("router: prefix budget spent")

// content hashes a message's content: a string, or the text of the "text"
// parts of an array (image, audio and other parts are skipped).
func content(s *scanner, h *prefixHasher) error {
	switch s.peek() {
	case '"':
		return h.value(s)
	case '[':
	default:
		return nil // null (tool calls) or a shape the model server will judge
	}
	parts := 0
	err := s.array(func(int) error {
		if h.left <= 0 {
			return errBudgetSpent
		}
		if s.peek() != '{' {
			return s.skip(4)
		}
		var typ, text []byte
		hasText := false
		// A repeated member replaces the earlier one.
		err := s.object(func(name []byte) error {
			switch string(name) {
			case "type":
				typ = nil
				if s.peek() != '"' {
					return s.skip(4)
				}
				raw, err := s.str()
				typ = decoded(raw)
				return err
			case "text":
				text, hasText = nil, false
				if s.peek() != '"' {
					return s.skip(4)
				}
				var err error
				text, err = s.str()
				hasText = err == nil
				return err
			}
			return s.skip(4)
		})
		if err != nil || !hasText || string(typ) != "text" {
			return err
		}
		if parts > 0 {
			h.mark(markPart, nil)
		}
		parts++
		return h.text(text)
	})
	if err == errBudgetSpent {
		return nil
	}
	return err
}

// prompt hashes a completions prompt: a string, or a list whose strings are
// joined with a boundary and whose other elements (token ids, token lists)
// are hashed raw, one unit each.
func prompt(s *scanner, h *prefixHasher) error {
	switch s.peek() {
	case '"':
		return h.value(s)
	case '[':
	default:
		return s.skip(1)
	}
	return s.array(func(n int) error {
		if s.peek() == '"' {
			raw, err := s.str()
			if err != nil {
				return err
			}
			if n > 0 {
				h.mark(markPart, nil)
			}
			if err := h.text(raw); err != nil {
				return err
			}
		} else {
			start := s.i
			if err := s.skip(2); err != nil {
				return err
			}
			if h.left > 0 {
				h.mark(markToken, nil)
				_, _ = h.d.Write(s.b[start:s.i])
				h.advance(1)
			}
		}
		if h.done() {
			return errKeyKnown
		}
		return nil
	})
}
