# prefixrouter — the two commands a fresh machine needs are `make demo` and `make test`.
GO      ?= go
PKGS    ?= ./...
BIN     ?= bin/prefixrouter
# The full test run must stay under 15 minutes on a 2-core machine.
TEST_TIMEOUT ?= 14m

.PHONY: all build test test-models test-threshold test-etcd-partition test-short vet bench fuzz demo chaos chaos-long matrix proxybench swarm llamacpp-kit test-llamacpp bench-llamacpp clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/prefixrouter

vet:
	$(GO) vet $(PKGS)

# The test command CI runs (see README.md and .ci/run).
test: vet
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

# The load-free models behind docs/balance.md's adaptive-key tables (issue 21):
# tens of thousands of requests through the real router, too slow under -race
# for make test's budget, so they run here, without it (a few minutes).
test-models:
	$(GO) test -count=1 -timeout 30m -run 'TestAdaptiveKeysIdle|TestAdaptiveDepth|TestAdaptiveSeeds' -v ./internal/bench

# The threshold shared by 32 router replicas, measured in real time (issue
# 22 part 4; docs/concurrency.md): about 40 s alone under -race. Too
# sensitive to CPU starvation to share make test's 2 cores with the other
# packages, so it runs here, alone.
test-threshold:
	PREFIXROUTER_E2E_THRESHOLD=1 $(GO) test -race -count=1 -timeout 10m -run 'TestThresholdAtManyReplicas' -v ./e2e

# Each member of a 3-member etcd cut off from the fleet's clients in turn,
# connections open and silent (docs/operations.md, "Losing etcd members"):
# the watchers wait three progress intervals (6 s) before they move, so a
# run takes 15 to 45 s.
test-etcd-partition:
	PREFIXROUTER_E2E_PARTITION=1 $(GO) test -race -count=1 -timeout 10m -run 'TestEtcdMemberPartitioned' -v ./e2e

test-short:
	$(GO) test -short -count=1 $(PKGS)

# Micro-benchmarks of the hot path (ring lookup, key extraction, the whole pick).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./ring ./lora ./overload ./router

# Every parser that reads untrusted input, fuzzed FUZZTIME each (issue 12;
# results in docs/security.md). Seeds are the f.Add calls and the committed
# corpora in each package's testdata/fuzz/<FuzzName>; a new crasher lands in
# the package's testdata/fuzz and then runs in every `make test`.
FUZZTIME ?= 60s
# Minimizing one new input may take the default 60 s, all of a target's
# FUZZTIME, during which nothing is fuzzed (FuzzParseRoutingConfig counted no
# execution after its 12th second); 5 s leaves the time to fuzzing.
FUZZMINIMIZETIME ?= 5s
FUZZ_TARGETS = ./router:FuzzParseOpenAI ./router:FuzzInvokeKey ./fleet:FuzzParseStaticInstances \
	./membership:FuzzParseRoutingConfig ./membership:FuzzParseInstance \
	./probe:FuzzParseMetrics ./probe:FuzzParseModels
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "== $$fn ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) -parallel 1 $$pkg; \
	done

# The main job: embedded etcd, 7 simulated model servers, 2 router replicas,
# three workloads under three strategies; prints the comparison and writes a report.
demo:
	$(GO) run ./cmd/prefixrouter demo

# Scale and fault scenarios (short), and the long soak version.
chaos:
	$(GO) run ./cmd/prefixrouter chaos

chaos-long:
	$(GO) run ./cmd/prefixrouter chaos --long

# Membership at fleet scale (issue 22): one etcd in a child process, N
# instances registered through membership.RegisterInstance, R router
# replicas' watchers, joins, graceful leaves and crashes; a Markdown report
# (docs/operations.md, "Fleet size limits"). About 2 minutes with the
# defaults below on 2 cores; not part of make test.
SWARM_FLAGS ?= -instances 10000 -replicas 100
swarm:
	$(GO) run ./internal/swarm/cmd/swarm $(SWARM_FLAGS)

# The seed's 16 configurations (model/adapters × invoke/OpenAI × shared-8k/
# sharegpt-like × streamed/not), PREFIX_AWARE against RANDOM: one table.
matrix:
	$(GO) run ./cmd/prefixrouter matrix

# What a proxy hop costs (issue 9): direct vs prefixrouter vs HAProxy 2.6 on
# loopback, 3 body sizes x 3 client counts, alternating rounds; about 3.5 min
# with the defaults (PROXYBENCH_FLAGS=--duration 1s halves it). Installs
# Debian's haproxy when missing and run as root; otherwise the HAProxy
# column is skipped with a message.
PROXYBENCH_FLAGS ?=
proxybench: build
	@command -v haproxy >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "proxybench: installing haproxy (apt-get)"; \
			apt-get install -y haproxy >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y haproxy >/dev/null 2>&1; } || \
			echo "proxybench: could not install haproxy; its column is skipped"; \
		else echo "proxybench: haproxy is not installed (apt-get install haproxy as root); its column is skipped"; fi; }
	$(abspath $(BIN)) proxybench $(PROXYBENCH_FLAGS)

# A real inference engine (issue 20): llama.cpp's llama-server from the kit in
# ../shared/engines (see its README), unpacked once into $(LLAMA_DIR); the
# tests and the bench generate their own tiny random-weight model. Set
# PREFIXROUTER_LLAMA_SERVER to use another llama-server build instead.
LLAMA_KIT ?= ../shared/engines/llamacpp-kit.tar.xz
LLAMA_DIR ?= .cache/llamacpp
llamacpp-kit: $(LLAMA_DIR)/llama-server
$(LLAMA_DIR)/llama-server: $(LLAMA_KIT)
	mkdir -p $(LLAMA_DIR)
	tar -C $(LLAMA_DIR) -xJf $(LLAMA_KIT)
	touch $@
$(LLAMA_KIT):
	@echo "no llama.cpp kit at $(LLAMA_KIT): set PREFIXROUTER_LLAMA_SERVER to a llama-server binary"; exit 1

# with-llama runs its arguments with PREFIXROUTER_LLAMA_SERVER set: as given,
# else the kit's binary.
with-llama = server="$${PREFIXROUTER_LLAMA_SERVER:-}"; \
	if [ -z "$$server" ]; then $(MAKE) --no-print-directory llamacpp-kit && server="$(abspath $(LLAMA_DIR))/llama-server"; fi; \
	PREFIXROUTER_LLAMA_SERVER="$$server"

# The real-engine tests alone (make test runs them too when the engine is set;
# .ci/run sets it when the kit is there).
test-llamacpp:
	@$(with-llama) $(GO) test -race -count=1 -v -run 'TestLlamaCpp|TestStartServesAndStops' ./e2e ./internal/llamacpp

# RANDOM vs LEAST_OUTSTANDING_REQUESTS vs PREFIX_AWARE on 4 real llama-server
# instances (fresh ones per strategy), the llamacpp-tiny workload through a
# router replica; about 5 minutes on a busy 2-core machine. Results in
# docs/benchmarks.md ("Real engine: llama.cpp").
LLAMABENCH_FLAGS ?=
bench-llamacpp:
	@$(with-llama) $(GO) run ./internal/llamacpp/llamabench $(LLAMABENCH_FLAGS)

clean:
	rm -rf bin demo-report chaos-report llamacpp-report .cache
