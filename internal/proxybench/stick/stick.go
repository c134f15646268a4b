// Package stick reads the arguments proxybench gives every proxy it runs
// (`serve --listen ADDR --static-instances id=URL,...`; the others are
// ignored), for the measuring-stick proxies beside the router
// (internal/proxybench/minproxy and rawfloor).
package stick

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"strings"
)

// Args is what a measuring stick needs of proxybench's arguments.
type Args struct {
	Listen   string
	Backends []*url.URL
}

// Parse reads args (os.Args without the program name).
func Parse(args []string) (Args, error) {
	if len(args) < 1 || args[0] != "serve" {
		return Args{}, fmt.Errorf("usage: serve --listen ADDR --static-instances id=URL,...")
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "listen address")
	static := fs.String("static-instances", "", "backends: id=URL,...")
	for _, ignored := range []string{"admin-listen", "prefix-length", "log-level"} {
		fs.String(ignored, "", "ignored")
	}
	fs.Bool("pprof", false, "ignored")
	if err := fs.Parse(args[1:]); err != nil {
		return Args{}, err
	}
	a := Args{Listen: *listen}
	for _, kv := range strings.Split(*static, ",") {
		_, raw, _ := strings.Cut(kv, "=")
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return Args{}, fmt.Errorf("backend %q: not id=http://host:port", kv)
		}
		a.Backends = append(a.Backends, u)
	}
	return a, nil
}

// Listen reads args as Parse does and opens the listener on Args.Listen:
// the start every measuring stick shares.
func Listen(args []string) (net.Listener, Args, error) {
	a, err := Parse(args)
	if err != nil {
		return nil, Args{}, err
	}
	ln, err := net.Listen("tcp", a.Listen)
	if err != nil {
		return nil, Args{}, err
	}
	return ln, a, nil
}

// MustListen is Listen on the command's own arguments for a stick's main:
// an error ends the process, prefixed with the stick's name.
func MustListen(name string) (net.Listener, Args) {
	ln, a, err := Listen(os.Args[1:])
	if err != nil {
		log.Fatal(name+": ", err)
	}
	return ln, a
}
