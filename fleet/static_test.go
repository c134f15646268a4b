package fleet

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseStaticInstances(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{"a=http://127.0.0.1:8001,b=http://127.0.0.1:8002", []string{"a@http://127.0.0.1:8001", "b@http://127.0.0.1:8002"}, false},
		{" a = http://h:1 , ", []string{"a@http://h:1"}, false},
		{"", nil, true},
		{"a", nil, true},
		{"a=127.0.0.1:1", nil, true},
		{"a=http://h:1,a=http://h:2", nil, true},
		{"a/b=http://h:1", nil, true},
		{"a=http://h:1;adapters=x+y,b=http://h:2", []string{"a@http://h:1[x y]", "b@http://h:2"}, false},
		{"a=http://h:1;adapters=", nil, true},
		{"a=http://h:1;adapters=x/y", nil, true},
		{"a=http://h:1;model=x", nil, true},
	}
	for _, tc := range tests {
		got, err := ParseStaticInstances(tc.in)
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseStaticInstances(%q) err = %v, not wrapping ErrInvalid", tc.in, err)
		}
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseStaticInstances(%q) err = %v", tc.in, err)
			continue
		}
		var s []string
		for _, in := range got {
			if len(in.Adapters) > 0 {
				s = append(s, fmt.Sprintf("%s@%s%v", in.ID, in.Addr, in.Adapters))
			} else {
				s = append(s, in.ID+"@"+in.Addr)
			}
		}
		if strings.Join(s, ",") != strings.Join(tc.want, ",") {
			t.Errorf("ParseStaticInstances(%q) = %v, want %v", tc.in, s, tc.want)
		}
	}
}

// FuzzParseStaticInstances: the --static-instances flag never panics, and
// what it accepts validates.
func FuzzParseStaticInstances(f *testing.F) {
	for _, s := range []string{"a=http://127.0.0.1:1,b=http://127.0.0.1:2", "a=http://x;adapters=l1+l2", ",,", "a", "a=b=c", "a=http://x;weird"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		insts, err := ParseStaticInstances(s)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, in := range insts {
			if err := in.Validate(); err != nil {
				t.Fatalf("accepted an invalid instance %+v: %v", in, err)
			}
			if seen[in.ID] {
				t.Fatalf("accepted duplicate id %q", in.ID)
			}
			seen[in.ID] = true
		}
	})
}
