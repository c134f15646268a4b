package replica

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
)

// Request framing as a trusted proxy checks it (issue 19, RFC 9112 §6.1,
// §6.3). net/http lets Transfer-Encoding override Content-Length and deletes
// the length, and ignores Transfer-Encoding on HTTP/1.0, both as RFC 9112
// permits; but a proxy in front that framed the request the other way saw
// one request where the router served two: the second, hidden in the first
// one's body, reached a model server that no proxy in front had seen. Envoy
// and HAProxy refuse such requests. The handler no longer sees the deleted
// headers, so the data listener reads every request head on its way to
// net/http (framingConn) and the handler refuses a connection that carried
// an ambiguous one: 400, and the connection closes.
//
// The reader follows the framing of the requests it lets through: a
// Content-Length body is skipped by count; after a chunked request it stops
// reading, and the handler closes that connection after the answer (a
// chunked upload costs its connection's keep-alive, nothing else).

// framingListener wraps each accepted connection in a framingConn.
type framingListener struct {
	net.Listener
	maxHead int // the longest head net/http accepts, with room to spare
}

func (l framingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &framingConn{Conn: c, s: headSniffer{maxHead: l.maxHead}}, nil
}

// framingConn reads request heads as net/http reads the connection. Reads
// are serialized by net/http; refused is read by handlers.
type framingConn struct {
	net.Conn
	s       headSniffer // touched only by Read
	refused atomic.Bool // an ambiguous head passed: refuse every request from now on
}

func (c *framingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.s.done && !c.s.feed(p[:n]) {
		c.refused.Store(true)
	}
	return n, err
}

type framingConnKey struct{}

// framingContext is the data server's ConnContext: it hands the connection
// to the handler.
func framingContext(ctx context.Context, c net.Conn) context.Context {
	if fc, ok := c.(*framingConn); ok {
		return context.WithValue(ctx, framingConnKey{}, fc)
	}
	return ctx
}

// framed refuses the requests of a connection that carried an ambiguous
// head, and closes a connection after a chunked request (its reader
// stopped there). A refused connection may have had good requests
// pipelined before the bad one; they are refused too: the connection is
// not trusted from the moment its bytes are not.
func framed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fc, _ := req.Context().Value(framingConnKey{}).(*framingConn)
		if fc != nil && fc.refused.Load() {
			w.Header().Set("Connection", "close")
			refuse(w, http.StatusBadRequest, "ambiguous_framing", "a request with both Content-Length and Transfer-Encoding, or with Transfer-Encoding on HTTP/1.0, is refused (RFC 9112 §6.1); the connection is closed")
			return
		}
		if len(req.TransferEncoding) > 0 {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, req)
	})
}

// refuse writes a listener-level refusal: plain text, as net/http's own
// 400 and 431 are, with the router's error code header.
func refuse(w http.ResponseWriter, status int, code, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Prefixrouter-Error", code)
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}

// headSniffer is the state of one connection's byte stream: in a head (line
// by line), in a body of known length, or done (after a chunked head, or
// when a head is not one net/http would serve on).
type headSniffer struct {
	maxHead int
	done    bool
	body    int64 // bytes of the current body still to come; -1 in a head

	started   bool // the head's first byte arrived
	headBytes int
	lines     int    // complete lines of the head
	line      []byte // the current line's first lineKeep bytes
	lineLen   int
	last      [10]byte // the current line's last bytes: the request line's version
	cont      bool     // the line is a continuation (starts with a space or tab)
	prevFrame bool     // the previous header line was Content-Length or Transfer-Encoding

	old, te, cl bool // HTTP/1.0 or older; Transfer-Encoding seen; Content-Length seen
	length      string
	lineBuf     [lineKeep]byte
}

// lineKeep is how much of a header line is kept: its name and a
// Content-Length value fit. A Content-Length line longer than that is
// refused (net/http would accept surrounding spaces; no client sends them).
const lineKeep = 64

// feed reads p; false means the connection must be refused.
func (s *headSniffer) feed(p []byte) bool {
	for len(p) > 0 && !s.done {
		if s.body > 0 {
			k := int64(len(p))
			if k > s.body {
				k = s.body
			}
			s.body -= k
			p = p[k:]
			continue
		}
		if !s.started {
			// net/http skips the CR and LF bytes a client sends after a
			// POST's body before the next request line.
			if p[0] == '\r' || p[0] == '\n' {
				p = p[1:]
				continue
			}
			s.started = true
			s.line = s.lineBuf[:0]
		}
		i := bytes.IndexByte(p, '\n')
		seg := p
		if i >= 0 {
			seg = p[:i]
		}
		s.headBytes += len(seg)
		if s.headBytes > s.maxHead {
			// net/http answers 431 and closes before this.
			s.done = true
			return true
		}
		s.take(seg)
		if i < 0 {
			return true
		}
		p = p[i+1:]
		if !s.endLine() {
			s.done = true
			return false
		}
	}
	return true
}

// take appends seg to the current line.
func (s *headSniffer) take(seg []byte) {
	if s.lineLen == 0 && len(seg) > 0 {
		s.cont = seg[0] == ' ' || seg[0] == '\t'
	}
	s.lineLen += len(seg)
	if room := lineKeep - len(s.line); room > 0 {
		s.line = append(s.line, seg[:min(room, len(seg))]...)
	}
	if len(seg) >= len(s.last) {
		copy(s.last[:], seg[len(seg)-len(s.last):])
	} else {
		copy(s.last[:], s.last[len(seg):])
		copy(s.last[len(s.last)-len(seg):], seg)
	}
}

// endLine handles a complete line; false refuses the connection.
func (s *headSniffer) endLine() bool {
	line := bytes.TrimSuffix(s.line, []byte{'\r'})
	n := s.lineLen
	if n > 0 && s.last[len(s.last)-1] == '\r' {
		n--
	}
	first := s.lines == 0
	s.lines++
	cont, full := s.cont, n <= lineKeep
	s.line, s.lineLen, s.cont = s.lineBuf[:0], 0, false
	switch {
	case first:
		// The version is the request line's last token, " HTTP/M.m";
		// net/http refuses a line that ends otherwise.
		v := bytes.TrimSuffix(s.last[:], []byte{'\r'})
		if len(v) >= 9 && bytes.HasPrefix(v[len(v)-9:], []byte(" HTTP/")) {
			major, minor := v[len(v)-3], v[len(v)-1]
			s.old = major < '1' || (major == '1' && minor == '0')
		}
		return true
	case n == 0:
		return s.endHead()
	case cont:
		// A folded line belongs to the previous field: never let one
		// extend a framing field.
		return !s.prevFrame
	}
	name, value, _ := bytes.Cut(line, []byte{':'})
	s.prevFrame = false
	switch {
	case equalFold(name, "Transfer-Encoding"):
		s.te, s.prevFrame = true, true
	case equalFold(name, "Content-Length"):
		if !full {
			return false
		}
		v := string(bytes.TrimSpace(value))
		if s.cl && v != s.length {
			return false // net/http refuses differing lengths; so do we
		}
		s.cl, s.length, s.prevFrame = true, v, true
	}
	return true
}

// endHead decides the head that just ended and what follows it.
func (s *headSniffer) endHead() bool {
	te, cl, old, length := s.te, s.cl, s.old, s.length
	*s = headSniffer{maxHead: s.maxHead}
	switch {
	case te && (cl || old):
		return false
	case te:
		s.done = true // chunked: the handler closes the connection after it
	case cl:
		n, err := strconv.ParseInt(length, 10, 64)
		if err != nil || n < 0 {
			// net/http answers 400 and closes.
			s.done = true
			return true
		}
		s.body = n
	}
	return true
}

func equalFold(b []byte, s string) bool {
	return len(b) == len(s) && bytes.EqualFold(b, []byte(s))
}
