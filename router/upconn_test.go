package router

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
)

// recordConn records the writes made to it.
type recordConn struct {
	net.Conn
	writes [][]byte
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

// TestUpstreamConnReadFrom: a streamed body's head and the rest that has
// arrived leave in one write; a long body in buffer-sized writes; a failing
// body's bytes read so far are still written, and its error returned.
func TestUpstreamConnReadFrom(t *testing.T) {
	head, rest := bytes.Repeat([]byte("h"), 4097), bytes.Repeat([]byte("r"), 12287)
	c := &recordConn{}
	n, err := upstreamConn{c}.ReadFrom(io.MultiReader(bytes.NewReader(head), bytes.NewReader(rest)))
	if err != nil || n != 16384 || len(c.writes) != 1 || !bytes.Equal(c.writes[0], append(head, rest...)) {
		t.Fatalf("16 KiB body as head + rest: %d bytes, %v, %d writes; want 16384 in 1 write", n, err, len(c.writes))
	}

	long := bytes.Repeat([]byte("x"), 100<<10)
	c = &recordConn{}
	n, err = upstreamConn{c}.ReadFrom(io.MultiReader(bytes.NewReader(head), bytes.NewReader(long)))
	if err != nil || n != int64(len(head)+len(long)) || !bytes.Equal(bytes.Join(c.writes, nil), append(head, long...)) {
		t.Fatalf("long body: %d bytes, %v", n, err)
	}
	for i, w := range c.writes {
		if len(w) > 32<<10 {
			t.Errorf("write %d of %d bytes exceeds the pooled buffer", i, len(w))
		}
	}

	broken := errors.New("client went away")
	c = &recordConn{}
	n, err = upstreamConn{c}.ReadFrom(io.MultiReader(bytes.NewReader(head), &failReader{broken}))
	if !errors.Is(err, broken) || n != int64(len(head)) || len(c.writes) != 1 {
		t.Fatalf("failing body: %d bytes, %v, %d writes; want the head written and the error", n, err, len(c.writes))
	}
}

type failReader struct{ err error }

func (r *failReader) Read([]byte) (int, error) { return 0, r.err }
