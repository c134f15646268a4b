// Command rawfloor is a measuring stick for `prefixrouter proxybench`, not
// a product: the least a Go proxy with a goroutine per connection can do
// per request, with no net/http at all. Each client connection's
// goroutine reads a request (head and Content-Length body) into one
// buffer, hashes the body's first 4096 bytes onto the backends (modulo),
// writes the request unchanged in one write on a connection of its own to
// that backend, reads the answer (Content-Length only) and writes it back
// in one write. No allocation per request once a connection is warm; no
// chunked bodies, no header rewriting, no errors answered, no timeouts.
//
// Beside minproxy (net/http's server and the router's upstream client) it
// tells what net/http costs from what the goroutine-per-connection model
// costs; eventloopfloor (a module of its own) does the same work on an
// event loop (docs/benchmarks.md, "What a proxy in Go can reach"):
//
//	go build -o /tmp/rawfloor ./internal/proxybench/rawfloor
//	prefixrouter proxybench --baseline /tmp/rawfloor --sizes 16384 --clients 16 --rounds 7
package main

import (
	"bufio"
	"bytes"
	"hash/maphash"
	"io"
	"log"
	"net"
	"strconv"

	"github.com/prefixrouter/prefixrouter/internal/proxybench/stick"
)

func main() {
	ln, args := stick.MustListen("rawfloor")
	var hosts []string
	for _, u := range args.Backends {
		hosts = append(hosts, u.Host)
	}
	seed := maphash.MakeSeed()
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go serve(c, hosts, seed)
	}
}

var contentLength = []byte("content-length:")

// readMessage reads one head and its Content-Length body into buf[:0] and
// returns the message and the head's length.
func readMessage(br *bufio.Reader, buf []byte) (msg []byte, head int, err error) {
	buf = buf[:0]
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return nil, 0, err
		}
		buf = append(buf, line...)
		if len(line) <= 2 {
			break
		}
		if len(line) > len(contentLength) && bytes.EqualFold(line[:len(contentLength)], contentLength) {
			if n, err = strconv.Atoi(string(bytes.TrimSpace(line[len(contentLength):]))); err != nil {
				return nil, 0, err
			}
		}
	}
	head = len(buf)
	buf = append(buf, make([]byte, n)...)
	_, err = io.ReadFull(br, buf[head:])
	return buf, head, err
}

type backendConn struct {
	c  net.Conn
	br *bufio.Reader
}

func serve(c net.Conn, hosts []string, seed maphash.Seed) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 8<<10)
	ups := make([]*backendConn, len(hosts))
	defer func() {
		for _, u := range ups {
			if u != nil {
				u.c.Close()
			}
		}
	}()
	req, answer := make([]byte, 0, 64<<10), make([]byte, 0, 8<<10)
	for {
		var head int
		var err error
		if req, head, err = readMessage(br, req); err != nil {
			return
		}
		body := req[head:]
		i := maphash.Bytes(seed, body[:min(len(body), 4096)]) % uint64(len(hosts))
		if ups[i] == nil {
			uc, err := net.Dial("tcp", hosts[i])
			if err != nil {
				return
			}
			ups[i] = &backendConn{c: uc, br: bufio.NewReaderSize(uc, 8<<10)}
		}
		if _, err := ups[i].c.Write(req); err != nil {
			return
		}
		if answer, _, err = readMessage(ups[i].br, answer); err != nil {
			return
		}
		if _, err := c.Write(answer); err != nil {
			return
		}
	}
}
