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
