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
	body, err := get(ctx, c, url, "application/json", func(code int) bool { return code/100 == 2 })
	if err != nil {
		return Models{}, err
	}
	defer body.Close()
	lr := &io.LimitedReader{R: body, N: limit + 1}
	m, err := ParseModels(lr)
	if lr.N == 0 {
		return Models{}, fmt.Errorf("probe: GET %s: the model list exceeds %d bytes", url, limit)
	}
	return m, err
}

// ParseModels reads an OpenAI model list as vLLM serves it: LoRA adapters
// carry the id of their base model in "parent", the base model has
// "parent": null (or none). The first base model listed is Base.
func ParseModels(r io.Reader) (Models, error) {
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r).Decode(&list); err != nil {
		return Models{}, fmt.Errorf("probe: decode model list: %w", err)
	}
	var m Models
	for _, e := range list.Data {
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
	return m, nil
}
