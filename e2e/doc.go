// Package e2e proves the acceptance end to end: router replicas on a real embedded etcd, real HTTP, and httptest backends as model-server instances.
//
// The package has no API; run it with `go test -race -count=1 ./e2e/...`.
// Environment variables widen what the default run checks:
//
//	PREFIXROUTER_E2E_OUTAGE=30s  length of the etcd outage window (default 5s)
//	PREFIXROUTER_E2E_SWEEP=1     TestConcurrencyOptions sweeps every option and
//	                             T in {2, 8, 32} and prints the table of
//	                             docs/concurrency.md (default: option b, T=8)
package e2e
