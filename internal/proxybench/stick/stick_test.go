package stick

import "testing"

func TestParse(t *testing.T) {
	a, err := Parse([]string{"serve", "--listen", "127.0.0.1:9", "--static-instances", "a=http://127.0.0.1:1,b=http://127.0.0.1:2", "--prefix-length", "4096", "--pprof"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Listen != "127.0.0.1:9" || len(a.Backends) != 2 || a.Backends[1].Host != "127.0.0.1:2" {
		t.Fatalf("got %+v", a)
	}
	for _, bad := range [][]string{nil, {"run"}, {"serve", "--static-instances", "a=nohost"}, {"serve", "--bogus"}} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) took it", bad)
		}
	}
}

// TestListen: the listener is open on --listen; bad arguments or an address
// that cannot be listened on are errors.
func TestListen(t *testing.T) {
	ln, a, err := Listen([]string{"serve", "--listen", "127.0.0.1:0", "--static-instances", "a=http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if a.Listen != "127.0.0.1:0" || len(a.Backends) != 1 || ln.Addr().String() == "127.0.0.1:0" {
		t.Fatalf("got %+v on %s", a, ln.Addr())
	}
	for _, bad := range [][]string{{"run"}, {"serve", "--listen", "127.0.0.1:-1", "--static-instances", "a=http://127.0.0.1:1"}} {
		if ln, _, err := Listen(bad); err == nil {
			ln.Close()
			t.Errorf("Listen(%q) took it", bad)
		}
	}
}
