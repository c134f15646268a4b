package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
)

// serveLoop serves h with a hand-written HTTP/1.1 connection loop instead
// of net/http's server (MINPROXY_SERVER=loop): a goroutine per
// connection that parses each request with http.ReadRequest, calls h and
// writes the answer through one buffer. No background read per request,
// no per-request context or cancellation, no chunked answers (an answer
// without Content-Length closes the connection). It measures what
// net/http's server machinery costs around the same handler
// (docs/benchmarks.md, "What a proxy in Go can reach").
func serveLoop(ln net.Listener, h http.Handler) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveConn(c, h)
	}
}

func serveConn(c net.Conn, h http.Handler) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 4096)
	bw := bufio.NewWriterSize(c, 4096)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		w := &loopWriter{h: http.Header{}, bw: bw}
		h.ServeHTTP(w, req)
		if !w.wrote {
			w.WriteHeader(http.StatusOK)
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if bw.Flush() != nil || w.close || req.Close {
			return
		}
	}
}

// loopWriter is serveConn's http.ResponseWriter.
type loopWriter struct {
	h     http.Header
	wrote bool
	close bool
	bw    *bufio.Writer
}

func (w *loopWriter) Header() http.Header { return w.h }

func (w *loopWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	if w.h.Get("Content-Length") == "" {
		w.close = true
		w.h.Set("Connection", "close")
	}
	fmt.Fprintf(w.bw, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	_ = w.h.Write(w.bw)
	_, _ = w.bw.WriteString("\r\n")
}

func (w *loopWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.bw.Write(p)
}
