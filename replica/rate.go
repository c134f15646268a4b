package replica

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
)

// DefaultRateInterval is how often a replica measures its request rate and,
// when it moved, writes it into its record under routers/
// (--rate-interval).
const DefaultRateInterval = time.Second

// Publishing rule: a measured rate is written when it differs from the
// last written one by more than rateChange of the larger of the two and by
// at least minRateDelta requests/s. A replica writes at most once per
// interval and not at all while its traffic holds steady; the smoothing of
// the measure (router.MeasureRate) keeps Poisson noise below the rule at
// the rates where the threshold's share matters.
const (
	rateChange   = 0.2
	minRateDelta = 1.0
)

// ratePublisher measures the router's request rate every interval and
// writes it into the replica's record when it moved (the router's
// ShareTraffic weighs it against the rates the others wrote). It owns one
// goroutine; Close stops it and waits.
type ratePublisher struct {
	reg      *membership.Registration
	router   *router.Router
	info     membership.RouterInfo // the record without its rate
	interval time.Duration
	log      *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startRatePublisher starts measuring at once: the record holds rate 0
// from registration on.
func startRatePublisher(reg *membership.Registration, rt *router.Router, info membership.RouterInfo, interval time.Duration, log *slog.Logger) *ratePublisher {
	ctx, cancel := context.WithCancel(context.Background())
	p := &ratePublisher{reg: reg, router: rt, info: info, interval: interval, log: log, cancel: cancel}
	rt.MeasureRate(time.Now())
	p.wg.Add(1)
	go p.run(ctx)
	return p
}

func (p *ratePublisher) run(ctx context.Context) {
	defer p.wg.Done()
	// The real clock: the ticks pace writes to etcd.
	t := time.NewTicker(p.interval)
	defer t.Stop()
	published := 0.0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			rate := roundRate(p.router.MeasureRate(now))
			if !rateMoved(published, rate) {
				continue
			}
			info := p.info
			info.Rate = &rate
			data, err := json.Marshal(info)
			if err != nil {
				p.log.Error("replica: encode router record", "err", err)
				continue
			}
			// Put keeps the value and writes it when etcd answers, even
			// after the wait ends: the rate counts as published.
			wctx, cancel := context.WithTimeout(ctx, p.interval)
			if err := p.reg.Put(wctx, data); err != nil && ctx.Err() == nil {
				p.log.Debug("replica: request rate not written yet", "rate", rate, "err", err)
			}
			cancel()
			published = rate
		}
	}
}

// Close stops the publisher and waits for its goroutine.
func (p *ratePublisher) Close() {
	p.cancel()
	p.wg.Wait()
}

// rateMoved reports whether rate differs enough from the published one to
// be written.
func rateMoved(published, rate float64) bool {
	d := math.Abs(rate - published)
	return d >= minRateDelta && d > rateChange*max(rate, published)
}

// roundRate keeps 3 significant digits: the record stays short and the
// share, a ceiling of a ratio, does not need more.
func roundRate(r float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(r, 'g', 3, 64), 64)
	return v
}
