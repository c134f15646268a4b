package membership_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/internal/testsupport"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/membership/etcdtest"
)

func TestParseSessionKey(t *testing.T) {
	k32 := bytes.Repeat([]byte{7}, 32)
	for _, tt := range []struct {
		value string
		ok    bool
	}{
		{base64.StdEncoding.EncodeToString(k32), true},
		{" " + base64.StdEncoding.EncodeToString(k32) + "\n", true},
		{base64.StdEncoding.EncodeToString(k32[:31]), false},
		{"not base64 !", false},
		{"", false},
		{base64.RawURLEncoding.EncodeToString(append(k32, 0xff, 0xfe)), false},
	} {
		k, err := membership.ParseSessionKey([]byte(tt.value))
		if (err == nil) != tt.ok {
			t.Errorf("ParseSessionKey(%q) = %v, want ok=%v", tt.value, err, tt.ok)
		}
		if err != nil && (!errors.Is(err, fleet.ErrInvalid) || (tt.value != "" && bytes.Contains([]byte(err.Error()), []byte(tt.value)))) {
			t.Errorf("ParseSessionKey(%q): error %v must wrap ErrInvalid and not quote the value", tt.value, err)
		}
		if err == nil && !bytes.Equal(k, k32) {
			t.Errorf("ParseSessionKey(%q) = %x", tt.value, k)
		}
	}
}

// TestEnsureSessionKeyOneWinner: replicas creating an endpoint's key at
// once all get the one key that was written.
func TestEnsureSessionKeyOneWinner(t *testing.T) {
	e := etcdtest.Start(t)
	cli := etcdtest.Client(t, e)
	ctx := testsupport.Context(t, 20*time.Second)
	l := membership.Layout{}
	const n = 8
	keys := make([][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			k, err := membership.EnsureSessionKey(ctx, cli, l, "chat")
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	resp, err := cli.Get(ctx, l.SessionKeyKey("chat"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get: %v", err)
	}
	stored, err := membership.ParseSessionKey(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if !bytes.Equal(k, stored) {
			t.Fatalf("caller %d got another key than the one stored", i)
		}
	}
	if _, err := membership.EnsureSessionKey(ctx, cli, l, "bad name"); err == nil {
		t.Fatalf("an invalid endpoint name: %v", err)
	}
}
