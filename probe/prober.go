package probe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// DefaultConcurrency bounds the probes in flight at once when
// Options.Concurrency is zero.
const DefaultConcurrency = 32

// Options are a Prober's schedule, the same for every kind of probe.
type Options struct {
	// Interval between the starts of two rounds; required (> 0). A round
	// that takes longer delays the next one, which then starts at once.
	Interval time.Duration
	// Timeout bounds each probe (through its context); zero means
	// Interval. It is real time, like the network I/O it bounds.
	Timeout time.Duration
	// Concurrency bounds the probes in flight at once; zero means
	// DefaultConcurrency.
	Concurrency int
	// Clock paces the rounds; nil means the real clock. Tests pass a
	// clockwork.FakeClock and Advance it by Interval to run a round.
	Clock clockwork.Clock
}

// Validate reports negative or missing values.
func (o Options) Validate() error {
	if o.Interval <= 0 {
		return fmt.Errorf("probe: interval %v must be positive", o.Interval)
	}
	if o.Timeout < 0 || o.Concurrency < 0 {
		return fmt.Errorf("probe: timeout %v and concurrency %d must not be negative", o.Timeout, o.Concurrency)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Timeout == 0 {
		o.Timeout = o.Interval
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	return o
}

// Prober owns the goroutine that probes a changing set of targets round
// after round; Close stops it.
type Prober struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start validates o and starts probing: a first round at once, then one
// every Interval. Each round calls targets once, probes every target with
// probe (at most Concurrency at a time, each within Timeout) and hands each
// outcome to observe. Rounds never overlap, so observe is never called
// concurrently for a target that appears once per round; it is not called
// for probes cut short by Close.
func Start[T, R any](o Options, targets func() []T, probe func(ctx context.Context, target T) (R, error), observe func(target T, result R, err error)) (*Prober, error) {
	r, err := newRounds(o, targets, probe, observe)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prober{cancel: cancel}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		r.run(ctx)
	}()
	return p, nil
}

// Close stops the prober, cancelling the probes in flight, and waits for
// its goroutines.
func (p *Prober) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

// rounds is one prober's loop and what it calls.
type rounds[T, R any] struct {
	opts    Options
	targets func() []T
	probe   func(context.Context, T) (R, error)
	observe func(T, R, error)
}

func newRounds[T, R any](o Options, targets func() []T, probe func(context.Context, T) (R, error), observe func(T, R, error)) (*rounds[T, R], error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if targets == nil || probe == nil || observe == nil {
		return nil, errors.New("probe: a prober needs targets, probe and observe")
	}
	return &rounds[T, R]{opts: o.withDefaults(), targets: targets, probe: probe, observe: observe}, nil
}

func (r *rounds[T, R]) run(ctx context.Context) {
	clock := r.opts.Clock
	for {
		start := clock.Now()
		r.round(ctx)
		// A timer from the end of the round rather than a ticker: with a
		// fake clock, a pending timer means "round done" to a test's
		// BlockUntilContext.
		t := clock.NewTimer(r.opts.Interval - clock.Since(start))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		}
	}
}

// round probes every target once and returns when all probes are done.
func (r *rounds[T, R]) round(ctx context.Context) {
	sem := make(chan struct{}, r.opts.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, tg := range r.targets() {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			pctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
			res, err := r.probe(pctx, tg)
			cancel()
			if ctx.Err() != nil {
				return // shutting down: not the target's fault
			}
			r.observe(tg, res, err)
		}()
	}
}
