package router

import (
	"bytes"
	"io"
	"net/http"

	"github.com/prefixrouter/prefixrouter/engine"
	"github.com/prefixrouter/prefixrouter/fleet"
)

// forEngine adapts one upstream call to the engine of the instance it goes
// to (issue 20), returning out itself when nothing changes:
//
//   - the usage scanner reads cached prompt tokens where that engine
//     reports them (engine.Profile.Cached);
//   - an OpenAI request gets the member the engine needs to serve the
//     adapter the request names in "model" (engine.Profile.RequestField):
//     SGLang's "lora_path", llama-server's "lora" with the adapter's
//     position, or for llama-server "lora": [] on a base-model request
//     (it applies every adapter loaded at start to a request that names
//     none). The member goes first in the body's object, so a streamed
//     body is adapted without reading it; a member the client sent itself
//     comes later and wins (JSON decoders keep the last).
//
// It runs before each call, so a retry on another instance is adapted to
// that one.
func (a *attempt) forEngine(out *http.Request) *http.Request {
	in := a.cur.iv.inst
	p, _ := engine.Lookup(in.Engine)
	a.usage.from = p.Cached
	if p.Adapters.Select == engine.ByModel || !a.kind.openAI() || out.Body == nil || out.Body == http.NoBody {
		return out
	}
	adapter, index := "", 0
	if a.model != "" && in.HasAdapter(a.model) {
		adapter = a.model
		if p.Adapters.Select == engine.ByIndex {
			i, ok := in.AdapterIndex[adapter]
			if !ok {
				return out // fleet.Instance.Validate requires one: not reached
			}
			index = i
		}
	}
	field := p.RequestField(adapter, index, len(in.AdapterIndex) > 0)
	if field == nil {
		return out
	}
	if !emptyObject(a.body) {
		field = append(field, ',')
	}
	o := *out
	o.Body = &insertReader{r: out.Body, ins: field}
	if out.ContentLength > 0 {
		o.ContentLength += int64(len(field))
	}
	if get := out.GetBody; get != nil {
		o.GetBody = func() (io.ReadCloser, error) {
			b, err := get()
			if err != nil {
				return nil, err
			}
			return &insertReader{r: b, ins: field}, nil
		}
	}
	return &o
}

// emptyObject reports whether head, the start of a JSON object, is "{}".
func emptyObject(head []byte) bool {
	i := bytes.IndexByte(head, '{')
	if i < 0 {
		return false
	}
	rest := bytes.TrimLeft(head[i+1:], " \t\r\n")
	return len(rest) > 0 && rest[0] == '}'
}

// insertReader reads r with ins inserted right after its first '{'.
type insertReader struct {
	r    io.ReadCloser
	ins  []byte
	rest []byte // to send before reading r again: ins, then what followed '{' in that read
	done bool   // '{' has passed
	err  error  // r's error from that read, held back until rest is sent
}

func (x *insertReader) Read(p []byte) (int, error) {
	if len(x.rest) > 0 {
		n := copy(p, x.rest)
		x.rest = x.rest[n:]
		if len(x.rest) == 0 && x.err != nil {
			return n, x.err
		}
		return n, nil
	}
	if x.err != nil {
		return 0, x.err
	}
	if x.done {
		return x.r.Read(p)
	}
	n, err := x.r.Read(p)
	i := bytes.IndexByte(p[:n], '{')
	if i < 0 {
		return n, err
	}
	x.done = true
	x.rest = append(append(make([]byte, 0, len(x.ins)+n-i-1), x.ins...), p[i+1:n]...)
	x.err = err
	return i + 1, nil
}

func (x *insertReader) Close() error { return x.r.Close() }

// serverErrors is what an HTTP 500 from in says, for its breaker
// (overload.State.SetServerErrors): a failure when the engine its record
// names has a known profile that says so (engine.Fault500: vLLM,
// SGLang, TGI); never a failure when the profile says the engine answers
// 500 to requests it cannot take and fails otherwise (engine.Client500:
// llama.cpp); and for an engine of no known profile (a record without
// one, a name this build does not know), which may do either, a failure
// only when 500s repeat across different routing keys
// (overload.Classify). engine.Generic's Unclear500 is its guess for an
// unknown engine; a guess cannot let a client's bad requests eject an
// instance (issue 20).
func serverErrors(in *fleet.Instance) engine.Server500 {
	p, _ := engine.Lookup(in.Engine) // Generic for an unknown engine: Unclear500
	return p.Server500
}
