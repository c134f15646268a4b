package router

import (
	"encoding/json"
	"strings"
	"testing"
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
