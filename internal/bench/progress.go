package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// isTerminal reports whether w is a character device (a terminal), where a
// redrawn bar makes sense; files and pipes get periodic lines instead.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// startProgress reports r's progress to w until the returned stop is
// called; stop waits for the reporter to exit and prints a last line.
func startProgress(w io.Writer, r *runner) (stop func()) {
	if w == nil {
		return func() {}
	}
	tty := isTerminal(w)
	every := 5 * time.Second
	if tty {
		every = 200 * time.Millisecond
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				writeProgress(w, r, tty, false)
			}
		}
	}()
	return func() {
		close(quit)
		wg.Wait()
		writeProgress(w, r, tty, true)
	}
}

func writeProgress(w io.Writer, r *runner, tty, last bool) {
	sent, done, failed := r.sent.Load(), r.finished.Load(), r.failed.Load()
	el := time.Since(r.start).Truncate(100 * time.Millisecond)
	status := fmt.Sprintf("sent %d, done %d, failed %d, %s", sent, done, failed, el)
	if r.total > 0 {
		frac := float64(done) / float64(r.total)
		if frac > 1 {
			frac = 1
		}
		const width = 30
		n := int(frac * width)
		status = fmt.Sprintf("[%s%s] %3.0f%% %s", strings.Repeat("=", n), strings.Repeat(" ", width-n), frac*100, status)
	}
	switch {
	case tty && last:
		fmt.Fprintf(w, "\r%s\n", status)
	case tty:
		fmt.Fprintf(w, "\r%s", status)
	default:
		fmt.Fprintf(w, "bench: %s\n", status)
	}
}
