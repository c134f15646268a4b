package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestWithCacheSalt(t *testing.T) {
	s := newSalter("")
	other := newSalter("another key of 16+ bytes")
	for _, body := range []string{
		`{"model":"m","prompt_cache_key":"t1","messages":[]}`,
		" \n{ } \n",
		`{"cache_salt":"chosen by the client","prompt_cache_key":"t1"}`,
		"{\"a\":{}}\t",
	} {
		out := s.withCacheSalt([]byte(body), "ep", "t1")
		var got struct {
			CacheSalt string `json:"cache_salt"` // the last of repeated keys wins
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%q -> %q: %v", body, out, err)
		}
		want := string(s.salt(nil, "ep", "t1"))
		if got.CacheSalt != want || len(want) != saltLen {
			t.Fatalf("%q -> %q: salt %q, want %q", body, out, got.CacheSalt, want)
		}
	}
	a, b := string(s.salt(nil, "ep", "t1")), string(s.salt(nil, "ep", "t2"))
	if a == b || a != string(s.salt(nil, "ep", "t1")) || a == string(s.salt(nil, "ep2", "t1")) || a == string(other.salt(nil, "ep", "t1")) {
		t.Fatal("salts must be distinct per tenant, endpoint and key, and stable")
	}
	if strings.Contains(a, "t1") {
		t.Fatal("the salt shows the tenant id")
	}
}

// TestStreamedSaltMatchesWhole: a salted body that streams (issue 19: it
// was read whole) reaches the instance byte for byte as withCacheSalt
// makes it from the whole body, however the body is cut into chunks; a
// body that does not end with a closing brace goes on as it was; more than
// maxTailSpace bytes of whitespace after a brace fail.
func TestStreamedSaltMatchesWhole(t *testing.T) {
	s := newSalter("k")
	bodies := []string{
		`{"model":"m","prompt_cache_key":"t","messages":[{"role":"user","content":"a } b"}]}`,
		"{\"model\":\"m\",\"prompt_cache_key\":\"t\",\"messages\":[{\"role\":\"user\",\"content\":\"x}  \"}]} \n\t ",
		`{"prompt_cache_key":"t","model":"m","prompt":"p","nested":{"a":{}}  }`,
	}
	for _, body := range bodies {
		want := string(s.withCacheSalt([]byte(body), "ep", "t"))
		for cut := 1; cut < len(body); cut++ {
			for _, step := range []int{1, 3, len(body)} {
				head, tail := s.streamed([]byte(body[:cut]), "ep", "t")
				out := append([]byte(nil), head...)
				for i := cut; i < len(body); i += step {
					var err error
					if out, err = tail.next(out, []byte(body[i:min(i+step, len(body))])); err != nil {
						t.Fatal(err)
					}
				}
				out = tail.end(out)
				if string(out) != want {
					t.Fatalf("cut %d, step %d:\n got %s\nwant %s", cut, step, out, want)
				}
				// The reader over the rest gives the same bytes.
				head, tail = s.streamed([]byte(body[:cut]), "ep", "t")
				rest, err := io.ReadAll(tail.reader(iotest.OneByteReader(strings.NewReader(body[cut:]))))
				if err != nil || string(head)+string(rest) != want {
					t.Fatalf("reader, cut %d: %s%s, %v", cut, head, rest, err)
				}
			}
		}
	}
	if _, tail := s.streamed([]byte(`{"model":"m"`), "ep", "t"); string(tail.end(nil)) != "" {
		t.Fatal("a body with no closing brace was given a salt")
	}
	_, tail := s.streamed([]byte(`{"model":"m"}`), "ep", "t")
	if _, err := tail.next(nil, bytes.Repeat([]byte(" "), maxTailSpace+1)); !errors.Is(err, errTailSpace) {
		t.Fatalf("%d bytes of whitespace after the brace: %v, want errTailSpace", maxTailSpace+1, err)
	}
}

// BenchmarkCacheSalt is what salting costs a request: a body read whole
// (withCacheSalt, a copy of the body) against one that streams (streamed:
// only the salt member is built; the body is not copied).
func BenchmarkCacheSalt(b *testing.B) {
	s := newSalter("")
	body := []byte(`{"model":"m","prompt_cache_key":"tenant-1","messages":[{"role":"user","content":"` + strings.Repeat("x", 16<<10) + `"}]}`)
	b.Run("whole=16KiB", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = s.withCacheSalt(body, "ep", "tenant-1")
		}
	})
	b.Run("streamed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, t := s.streamed(body, "ep", "tenant-1")
			_ = t.end(nil)
		}
	})
}
