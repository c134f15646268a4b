package router

import (
	"fmt"
	"strings"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// ParseStaticInstances parses "id=url,id=url" (the --static-instances flag)
// into validated instances. Blank entries are ignored; ids must be unique.
func ParseStaticInstances(s string) ([]fleet.Instance, error) {
	var out []fleet.Instance
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("router: static instance %q is not id=url", part)
		}
		in := fleet.Instance{ID: strings.TrimSpace(id), Addr: strings.TrimSpace(addr)}
		if err := in.Validate(); err != nil {
			return nil, err
		}
		if !strings.HasPrefix(in.Addr, "http://") && !strings.HasPrefix(in.Addr, "https://") {
			return nil, fmt.Errorf("router: static instance %q: addr %q must be an http:// or https:// URL", in.ID, in.Addr)
		}
		if seen[in.ID] {
			return nil, fmt.Errorf("router: static instance id %q repeated", in.ID)
		}
		seen[in.ID] = true
		out = append(out, in)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("router: no static instances in %q", s)
	}
	return out, nil
}
