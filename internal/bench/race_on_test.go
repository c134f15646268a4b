//go:build race

package bench

// raceEnabled: the race detector slows the load-free models' tens of
// thousands of routed requests past the whole suite's time budget.
const raceEnabled = true
