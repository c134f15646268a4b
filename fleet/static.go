package fleet

import (
	"fmt"
	"strings"
)

// ParseStaticInstances parses "id=url,id=url" (the --static-instances flag)
// into validated instances: a fixed fleet without etcd. Blank entries are
// ignored; ids must be unique. Every error wraps ErrInvalid.
// An entry may declare the LoRA adapters loaded on the instance, which
// then form the adapters' sticky sets as in an etcd fleet:
// "id=url;adapters=a+b" (adapter names separated by '+').
func ParseStaticInstances(s string) ([]Instance, error) {
	var out []Instance
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		part, opts, _ := strings.Cut(part, ";")
		id, addr, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("fleet: %w static instance %q: not id=url", ErrInvalid, part)
		}
		in := Instance{ID: strings.TrimSpace(id), Addr: strings.TrimSpace(addr)}
		if opts != "" {
			list, ok := strings.CutPrefix(strings.TrimSpace(opts), "adapters=")
			if !ok {
				return nil, fmt.Errorf("fleet: %w static instance %q: %q is not adapters=a+b", ErrInvalid, in.ID, opts)
			}
			for _, a := range strings.Split(list, "+") {
				if err := (Adapter{Name: strings.TrimSpace(a), Source: "-"}).Validate(); err != nil {
					return nil, fmt.Errorf("fleet: %w static instance %q: %w", ErrInvalid, in.ID, err)
				}
				in.Adapters = append(in.Adapters, strings.TrimSpace(a))
			}
		}
		if err := in.Validate(); err != nil {
			return nil, fmt.Errorf("fleet: %w static instance: %w", ErrInvalid, err)
		}
		if !strings.HasPrefix(in.Addr, "http://") && !strings.HasPrefix(in.Addr, "https://") {
			return nil, fmt.Errorf("fleet: %w static instance %q: addr %q must be an http:// or https:// URL", ErrInvalid, in.ID, in.Addr)
		}
		if seen[in.ID] {
			return nil, fmt.Errorf("fleet: %w static instance id %q: repeated", ErrInvalid, in.ID)
		}
		seen[in.ID] = true
		out = append(out, in)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("fleet: %w static instances %q: none", ErrInvalid, s)
	}
	return out, nil
}
