package agent

import (
	"context"
	"slices"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/probe"
)

// engineNames lists the engines --engine takes.
func engineNames() []string {
	var out []string
	for _, p := range engine.Profiles() {
		out = append(out, p.Name)
	}
	return out
}

// detect returns the profile of Options.Engine, or of the engine the
// server shows: its /metrics families (when it exports them), its
// /v1/models owned_by and its Server header. A server that shows none of
// the known engines gets engine.Generic.
func (a *agent) detect(ctx context.Context) engine.Profile {
	if a.cfg.Engine != "" {
		p, _ := engine.Lookup(a.cfg.Engine)
		a.log.Info("agent: engine set", "engine", p.Name)
		return p
	}
	var e engine.Evidence
	if m, err := probe.Scrape(ctx, a.cfg.HTTPClient, a.url(a.cfg.MetricsPath)); err == nil {
		for name := range m {
			e.Metrics = append(e.Metrics, name)
		}
	}
	if m, err := probe.FetchModels(ctx, a.cfg.HTTPClient, a.url(a.cfg.ModelsPath)); err == nil {
		e.OwnedBy, e.Server = m.OwnedBy, m.Server
	}
	p, ok := engine.Detect(e)
	if !ok {
		a.log.Warn("agent: engine not recognized (no known /metrics names, owned_by or Server header); using vLLM's ways (set --engine to choose)", "owned_by", e.OwnedBy, "server", e.Server)
		return p
	}
	a.log.Info("agent: engine detected", "engine", p.Name)
	return p
}

// setProfile makes p the agent's engine and fills the runtime LoRA paths
// left unset from it.
func (a *agent) setProfile(p engine.Profile) {
	a.profile = p
	if a.cfg.LoadPath == "" {
		a.cfg.LoadPath = p.Adapters.LoadPath
	}
	if a.cfg.UnloadPath == "" {
		a.cfg.UnloadPath = p.Adapters.UnloadPath
	}
}

// listing is what the server says it serves: its model list and, for an
// engine that selects adapters by position, each adapter's position.
type listing struct {
	probe.Models
	index map[string]int
}

// list reads what the server serves, the way its engine lists it: the
// adapters /v1/models lists with "parent" set (vLLM, SGLang), or
// llama-server's /lora-adapters, each adapter named by its file
// (engine.AdapterName). An adapter whose name no request could use (not
// a valid adapter name, or two files of one name) is left out, with a
// warning.
func (a *agent) list(ctx context.Context) (listing, error) {
	m, err := probe.FetchModels(ctx, a.cfg.HTTPClient, a.url(a.cfg.ModelsPath))
	if err != nil {
		return listing{}, err
	}
	switch a.profile.Adapters.List {
	case engine.ListModels:
		return listing{Models: m}, nil
	case engine.ListNone:
		m.Adapters = nil
		return listing{Models: m}, nil
	}
	listed, err := probe.FetchIndexedAdapters(ctx, a.cfg.HTTPClient, a.url(a.profile.Adapters.ListPath))
	if err != nil {
		return listing{}, err
	}
	l := listing{Models: m, index: map[string]int{}}
	l.Adapters = nil
	paths := map[string][]string{}
	for _, x := range listed {
		name := engine.AdapterName(x.Path)
		paths[name] = append(paths[name], x.Path)
		if err := (fleet.Adapter{Name: name, Source: x.Path}).Validate(); err != nil {
			a.log.Warn("agent: adapter left out: its file name is not an adapter name", "path", x.Path, "err", err)
			continue
		}
		l.index[name] = x.ID
	}
	for name, ps := range paths {
		if len(ps) > 1 {
			a.log.Warn("agent: adapters left out: files of one name", "name", name, "paths", ps)
			delete(l.index, name)
		}
	}
	for name := range l.index {
		l.Adapters = append(l.Adapters, name)
	}
	slices.Sort(l.Adapters)
	if len(l.index) == 0 {
		l.index = nil
	}
	return l, nil
}
