package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
)

// Models is what a model server's OpenAI model list (/v1/models) says it
// serves.
type Models struct {
	// Base is the base model's id ("" if none is listed).
	Base string
	// Adapters are the LoRA adapters' ids, sorted and distinct.
	Adapters []string
	// OwnedBy are the entries' owned_by values, sorted and distinct: the
	// engine's name for vLLM, SGLang and llama-server (engine.Detect).
	OwnedBy []string
	// Server is the answer's Server header (FetchModels only).
	Server string
}

// MaxModelsBytes bounds the model list FetchModels reads.
const MaxModelsBytes = 8 << 20

// FetchModels GETs url (a /v1/models) and parses it with ParseModels; any
// status but 2xx is an error, and so is a list longer than MaxModelsBytes.
func FetchModels(ctx context.Context, c *http.Client, url string) (Models, error) {
	return FetchModelsUpTo(ctx, c, url, MaxModelsBytes)
}

// FetchModelsUpTo is FetchModels with a list of at most limit bytes.
func FetchModelsUpTo(ctx context.Context, c *http.Client, url string, limit int64) (Models, error) {
	resp, err := getResponse(ctx, c, url, "application/json", func(code int) bool { return code/100 == 2 })
	if err != nil {
		return Models{}, err
	}
	defer resp.Body.Close()
	lr := &io.LimitedReader{R: resp.Body, N: limit + 1}
	m, err := ParseModels(lr)
	if lr.N == 0 {
		return Models{}, fmt.Errorf("probe: GET %s: the model list exceeds %d bytes", url, limit)
	}
	m.Server = resp.Header.Get("Server")
	return m, err
}

// IndexedAdapter is one entry of llama-server's GET /lora-adapters: the
// adapters loaded at start (--lora), in the order requests address them.
type IndexedAdapter struct {
	ID    int     `json:"id"`
	Path  string  `json:"path"`
	Scale float64 `json:"scale"`
}

// FetchIndexedAdapters GETs url (llama-server's /lora-adapters) and
// returns its entries; any status but 2xx, or an entry whose id is not
// its position, is an error.
func FetchIndexedAdapters(ctx context.Context, c *http.Client, url string) ([]IndexedAdapter, error) {
	body, err := get(ctx, c, url, "application/json", func(code int) bool { return code/100 == 2 })
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return ParseIndexedAdapters(io.LimitReader(body, 8<<20))
}

// ParseIndexedAdapters reads llama-server's adapter list,
// [{"id":0,"path":"a.gguf","scale":1.0},...].
func ParseIndexedAdapters(r io.Reader) ([]IndexedAdapter, error) {
	var list []IndexedAdapter
	if err := json.NewDecoder(r).Decode(&list); err != nil {
		return nil, fmt.Errorf("probe: decode adapter list: %w", err)
	}
	for i, a := range list {
		if a.ID != i || a.Path == "" {
			return nil, fmt.Errorf("probe: adapter list entry %d has id %d and path %q: want its position and a path", i, a.ID, a.Path)
		}
	}
	return list, nil
}

// ParseModels reads an OpenAI model list as vLLM serves it: LoRA adapters
// carry the id of their base model in "parent", the base model has
// "parent": null (or none). The first base model listed is Base.
func ParseModels(r io.Reader) (Models, error) {
	var list struct {
		Data []struct {
			ID      string  `json:"id"`
			Parent  *string `json:"parent"`
			OwnedBy string  `json:"owned_by"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r).Decode(&list); err != nil {
		return Models{}, fmt.Errorf("probe: decode model list: %w", err)
	}
	var m Models
	for _, e := range list.Data {
		if e.OwnedBy != "" {
			m.OwnedBy = append(m.OwnedBy, e.OwnedBy)
		}
		if e.ID == "" {
			continue
		}
		if e.Parent == nil || *e.Parent == "" {
			if m.Base == "" {
				m.Base = e.ID
			}
			continue
		}
		m.Adapters = append(m.Adapters, e.ID)
	}
	slices.Sort(m.Adapters)
	m.Adapters = slices.Compact(m.Adapters)
	slices.Sort(m.OwnedBy)
	m.OwnedBy = slices.Compact(m.OwnedBy)
	return m, nil
}
