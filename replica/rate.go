package replica

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/router"
)

// DefaultRateInterval is how often a replica measures its request rate and
// decides whether to write it into its record under routers/
// (--rate-interval; router.RateReport decides).
const DefaultRateInterval = time.Second

// ratePublisher measures the router's request rate every interval and
// writes it into the replica's record when router.RateReport says so (the
// router's ShareTraffic weighs it against the rates the others wrote). It
// owns one goroutine; Close stops it and waits.
type ratePublisher struct {
	reg      *membership.Registration
	router   *router.Router
	info     membership.RouterInfo // the record without its rate
	report   router.RateReport     // owned by run
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
	now := time.Now()
	p.report.Next(now, rt.Requests(), rt.MeasureRate(now)) // starts both counts
	p.wg.Add(1)
	go p.run(ctx)
	return p
}

func (p *ratePublisher) run(ctx context.Context) {
	defer p.wg.Done()
	// The real clock: the ticks pace writes to etcd.
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			rate, ok := p.report.Next(now, p.router.Requests(), p.router.MeasureRate(now))
			if !ok {
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
		}
	}
}

// Close stops the publisher and waits for its goroutine.
func (p *ratePublisher) Close() {
	p.cancel()
	p.wg.Wait()
}
