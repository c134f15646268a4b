package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/router"
)

// Load bounds: a request that takes longer than loadTimeout is a failure
// ("timeout"); at most loadMaxInFlight requests are outstanding (a tick
// beyond that is skipped and counted, never queued); a window sends at most
// loadMaxRequests.
const (
	loadTimeout      = 30 * time.Second
	loadMaxInFlight  = 256
	loadMaxRequests  = 200_000
	loadPrompts      = 96
	loadOutputTokens = 16
)

// record is one load request's outcome.
type record struct {
	start, end time.Time
	replica    int
	status     int
	kind       string // "" for success, else a failure kind
	msg        string
	instance   string
	decision   string
}

// load sends a bounded stream of real requests through the replicas in
// turn, half of them streamed.
type load struct {
	urls    []string
	rate    float64
	client  *http.Client
	bodies  [][]byte
	streams []bool

	cancel context.CancelFunc
	loop   sync.WaitGroup // the ticker goroutine
	reqs   sync.WaitGroup // requests in flight

	mu       sync.Mutex // guards recs, skipped
	recs     []record
	skipped  int
	started  time.Time
	stopped  time.Time
	inFlight chan struct{}
}

func startLoad(urls []string, rate float64, seed int64) *load {
	return startLoadModels(urls, rate, seed, nil)
}

// startLoadModels is startLoad with the requests spread over models (the
// base model when empty).
func startLoadModels(urls []string, rate float64, seed int64, models []string) *load {
	l := &load{
		urls: urls, rate: rate,
		client: &http.Client{Timeout: loadTimeout, Transport: &http.Transport{
			MaxIdleConnsPerHost: loadMaxInFlight, IdleConnTimeout: 30 * time.Second,
		}},
		inFlight: make(chan struct{}, loadMaxInFlight),
	}
	for i := range loadPrompts {
		// Short distinct prompts: spread over every instance by their keys.
		text := fmt.Sprintf("chaos load %d/%d: summarize the status of shard %d in one sentence.", seed, i, i*7919)
		stream := i%2 == 0
		body := chatBody(text, loadOutputTokens, stream)
		if len(models) > 0 {
			body = chatBodyModel(models[i%len(models)], text, loadOutputTokens, stream)
		}
		l.bodies = append(l.bodies, body)
		l.streams = append(l.streams, stream)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.started = time.Now()
	l.loop.Add(1)
	go l.run(ctx)
	return l
}

func (l *load) run(ctx context.Context) {
	defer l.loop.Done()
	t := time.NewTicker(time.Duration(float64(time.Second) / l.rate))
	defer t.Stop()
	for n := 0; n < loadMaxRequests; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		select {
		case l.inFlight <- struct{}{}:
		default:
			l.mu.Lock()
			l.skipped++
			l.mu.Unlock()
			continue
		}
		l.reqs.Add(1)
		go func(n int) {
			defer l.reqs.Done()
			rec := l.do(n)
			<-l.inFlight
			l.mu.Lock()
			l.recs = append(l.recs, rec)
			l.mu.Unlock()
		}(n)
	}
}

// stop stops sending, waits for every request in flight (each bounded by
// loadTimeout) and returns the records sorted by start time.
func (l *load) stop() ([]record, int) {
	l.cancel()
	l.loop.Wait()
	l.stopped = time.Now()
	l.reqs.Wait()
	l.client.CloseIdleConnections()
	l.mu.Lock()
	defer l.mu.Unlock()
	sort.Slice(l.recs, func(i, j int) bool { return l.recs[i].start.Before(l.recs[j].start) })
	return l.recs, l.skipped
}

func (l *load) do(n int) (rec record) {
	rec.replica = n % len(l.urls)
	body, stream := l.bodies[n%len(l.bodies)], l.streams[n%len(l.bodies)]
	rec.start = time.Now()
	defer func() { rec.end = time.Now() }()
	req, err := http.NewRequest(http.MethodPost, l.urls[rec.replica]+chatPath, bytes.NewReader(body))
	if err != nil {
		rec.kind, rec.msg = "transport", err.Error()
		return rec
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		rec.kind, rec.msg = "transport", err.Error()
		return rec
	}
	defer resp.Body.Close()
	rec.status = resp.StatusCode
	rec.instance = resp.Header.Get(router.HeaderInstance)
	rec.decision = resp.Header.Get(router.HeaderDecision)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		rec.kind, rec.msg = fmt.Sprintf("status %d", resp.StatusCode), string(bytes.TrimSpace(b))
		return rec
	}
	if stream {
		// A complete stream ends with the [DONE] event; a cut one does not.
		done := false
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if bytes.Equal(bytes.TrimSpace(sc.Bytes()), []byte("data: [DONE]")) {
				done = true
			}
		}
		if err := sc.Err(); err != nil || !done {
			rec.kind, rec.msg = "stream cut", fmt.Sprint(err)
		}
		return rec
	}
	var out struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) == 0 {
		rec.kind, rec.msg = "bad body", fmt.Sprint(err)
	}
	return rec
}

// Load counts the background requests sent across one event.
type Load struct {
	// Sent requests, of which OK succeeded and Failed did not.
	Sent   int `json:"sent"`
	OK     int `json:"ok"`
	Failed int `json:"failed"`
	// FailedInFlight are failures of requests that were in flight on a
	// crashed instance at the crash instant (a stream cut mid-way cannot be
	// retried); FailedOther all other failures.
	FailedInFlight int `json:"failed_in_flight"`
	FailedOther    int `json:"failed_other"`
	// ByKind counts failures by kind ("status 502", "stream cut", ...).
	ByKind map[string]int `json:"by_kind,omitempty"`
	// Spilled counts successes answered by another instance than the
	// key's primary (decision spill or fallback), retries included.
	Spilled int `json:"spilled"`
	// Skipped ticks: the in-flight cap was reached (never queued).
	Skipped int `json:"skipped"`
	// Seconds the load ran; Rate achieved.
	Seconds float64 `json:"seconds"`
	// Examples of failures (at most 5).
	Examples []string `json:"examples,omitempty"`
}

// inFlightAt tells whether a failed request counts as in flight at a crash:
// it started before the crash ended (CrashInstance returned), ended after it
// began, and was answered by (or for) the crashed instance.
type inFlightAt struct {
	from, to time.Time
	instance string
}

func (c *inFlightAt) match(r record) bool {
	return c != nil && r.start.Before(c.to) && r.end.After(c.from) && (r.instance == c.instance || r.instance == "")
}

func summarize(recs []record, skipped int, dur time.Duration, crash *inFlightAt) *Load {
	s := &Load{Sent: len(recs), Skipped: skipped, Seconds: dur.Seconds(), ByKind: map[string]int{}}
	for _, r := range recs {
		if r.kind == "" {
			s.OK++
			if r.decision == router.DecisionSpill || r.decision == router.DecisionFallback {
				s.Spilled++
			}
			continue
		}
		s.Failed++
		s.ByKind[r.kind]++
		if crash.match(r) {
			s.FailedInFlight++
		} else {
			s.FailedOther++
		}
		if len(s.Examples) < 5 {
			at := ""
			if crash != nil {
				at = fmt.Sprintf(" (started %+.1f ms, ended %+.1f ms from the crash)", ms64(r.start.Sub(crash.from)), ms64(r.end.Sub(crash.from)))
			}
			s.Examples = append(s.Examples, fmt.Sprintf("+%.3fs %s via replica %d instance %q%s: %.160s",
				r.start.Sub(recs[0].start).Seconds(), r.kind, r.replica, r.instance, at, r.msg))
		}
	}
	return s
}

func ms64(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
