package router

import (
	"fmt"
	"strings"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// ParseStaticInstances parses "id=url,id=url" (the --static-instances flag)
// into validated instances. Blank entries are ignored; ids must be unique.
// An entry may declare the LoRA adapters loaded on the instance, which
// then form the adapters' sticky sets as in an etcd fleet:
// "id=url;adapters=a+b" (adapter names separated by '+').
func ParseStaticInstances(s string) ([]fleet.Instance, error) {
	var out []fleet.Instance
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		part, opts, _ := strings.Cut(part, ";")
		id, addr, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("router: static instance %q is not id=url", part)
		}
		in := fleet.Instance{ID: strings.TrimSpace(id), Addr: strings.TrimSpace(addr)}
		if opts != "" {
			list, ok := strings.CutPrefix(strings.TrimSpace(opts), "adapters=")
			if !ok {
				return nil, fmt.Errorf("router: static instance %q: %q is not adapters=a+b", in.ID, opts)
			}
			for _, a := range strings.Split(list, "+") {
				if err := (fleet.Adapter{Name: strings.TrimSpace(a), Source: "-"}).Validate(); err != nil {
					return nil, fmt.Errorf("router: static instance %q: %w", in.ID, err)
				}
				in.Adapters = append(in.Adapters, strings.TrimSpace(a))
			}
		}
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
