# make test: formatting and static checks, host unit tests and fuzzing, then
# the device tests inside a Soft-RoCE VM (testbed/vm.sh) with the interop
# module's (interop/: quic-go and miekg/dns over PacketConn) and its
# application benchmarks (gRPC, HTTP/2, TLS, a relay: RDMA beside Go TCP)
# for a few iterations each, the object store example's tests and
# benchmarks (examples/objectstore: the token pattern) and the feature examples' tests
# (examples/: HTTP, a block store, fallback, gRPC, QUIC, DNS), the fault sweep there (a test binary built
# with -tags faultinject that makes each call into the kernel's RDMA
# interface fail in turn: faults_test.go), the device tests again on
# soft-iWARP (testbed/vm.sh --provider siw), the scale test in a VM with
# more memory, then the two-host tests on a pair of them (testbed/vm.sh
# --pair). make demo: the echo example in the VM. make bench: the
# zero-cost rows on the host (make zerocost), then in the test bed the
# Soft-RoCE table (bench/bench.sh), the soft-iWARP rows, the two-host
# rows, the application rows (bench/apps.sh) and the many-clients rows
# (bench/clients.sh --table), then draws the charts (bench/plot: make
# charts); bench/README.md says what each measures.
# Those install what they need on a Debian machine (as root). make check
# and make unit need neither root nor the VM: without the verbs headers
# they check the portable build only.

GO          ?= go
CC          ?= cc
# Whether cgo can build against libibverbs and librdmacm here (make deps
# installs their headers).
HAVE_VERBS  := $(shell printf '\043include <infiniband/verbs.h>\n\043include <rdma/rdma_cma.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 && echo yes)
OUT         := .testbed-out
VM          := testbed/vm.sh
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# The examples with third-party dependencies (gRPC, quic-go, miekg/dns),
# the Prometheus adapter and the chart renderer (gonum's plot): each a
# module of its own, so that the library's go.mod gains nothing.
EXAMPLE_MODULES := examples/grpc examples/quic examples/dns
MODULES         := $(EXAMPLE_MODULES) metrics/prometheus bench/plot
VMTIMEOUT   ?= 1500

.PHONY: all deps check unit fuzz verbs-note vmtest test info demo bench microbench zerocost apps clients charts clean

all: test

# Debian packages (cgo headers and libraries, qemu, rdma-core, perftest),
# the VM's kernel and initramfs (cached), and the Go modules, the interop
# module's too.
deps:
	$(VM) --prepare
	$(GO) mod download
	cd interop && $(GO) mod download
	for m in $(MODULES); do (cd $$m && $(GO) mod download) || exit 1; done

# The API is declared once for every platform: the builds without cgo, for
# darwin and for 32-bit targets must vet too (api_test.go calls every
# export). The interop module (its own go.mod, so that quic-go and
# miekg/dns stay out of the library's dependencies) is checked as well.
check: verbs-note
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
ifeq ($(HAVE_VERBS),yes)
	$(GO) vet ./...
	$(GO) vet -tags faultinject ./...
	$(GO) run $(STATICCHECK) ./...
	cd interop && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	for m in $(MODULES); do (cd $$m && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...) || exit 1; done
	# The C measurement programs build warning-free (make bench runs them).
	for c in postrate srqcost; do $${CC:-cc} -O2 -Wall -Werror -o /dev/null bench/$$c.c -lrdmacm -libverbs || exit 1; done
endif
	CGO_ENABLED=0 $(GO) vet ./...
	cd interop && CGO_ENABLED=0 $(GO) vet ./...
	for m in $(MODULES); do (cd $$m && CGO_ENABLED=0 $(GO) vet ./...) || exit 1; done
	CGO_ENABLED=0 GOARCH=386 $(GO) vet ./...
	CGO_ENABLED=0 GOARCH=arm $(GO) vet ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...

# Host tests: the pure types and the data path over fakes; device tests
# skip here with their reason.
unit: verbs-note
ifeq ($(HAVE_VERBS),yes)
	$(GO) test -count=1 ./...
	cd metrics/prometheus && $(GO) test -count=1 ./...
endif
	CGO_ENABLED=0 $(GO) test -count=1 ./...
	for m in $(MODULES); do (cd $$m && CGO_ENABLED=0 $(GO) test -count=1 ./...) || exit 1; done
	@echo "=== every benchmark, a small fixed count (device ones skip here; vmtest runs them)"
	CGO_ENABLED=0 $(GO) test -count=1 -run '^$$' -bench . -benchtime 200x ./...
ifeq ($(HAVE_VERBS),yes)
	@echo "=== the zero-cost rows, Go and C, with cgo (no device needed)"
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkZeroCost$$' -benchtime 200x .
endif
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME)

# Every parser of peer-supplied bytes is fuzzed (internal/wire's, and the root's fuzz_test.go and
# remotekey_test.go), each target in the package it lives in (FUZZ_TARGETS: package:target
# pairs). Within make test each target runs a fixed count of inputs, about 10 s here (the
# completion paths, FuzzConn* and FuzzPacket*, are ten times slower per input than the
# parsers): a wall-clock -fuzztime races Go's fuzz coordinator at its deadline (golang/go#75804,
# unfixed before Go 1.27) and fails the run with a bare "context deadline exceeded", no input at
# fault. Longer by hand: make fuzz FUZZTIME=10m.
FUZZTIME        ?=
FUZZ_EXECS      ?= 150000x
FUZZ_SLOW_EXECS ?= 50000x
FUZZ_TARGETS     = ./internal/wire:FuzzParseHello ./internal/wire:FuzzParseReject ./internal/wire:FuzzParseRingDesc \
                   ./internal/wire:FuzzParseDatagram \
                   .:FuzzConnCompletions .:FuzzConnHeaders .:FuzzRemoteKey .:FuzzRemoteKeyText .:FuzzPacketCompletions
fuzz:
	@for pf in $(FUZZ_TARGETS); do \
		p=$${pf%%:*}; f=$${pf#*:}; \
		t="$(FUZZTIME)"; \
		if [ -z "$$t" ]; then \
			case $$f in FuzzConn*|FuzzPacket*) t=$(FUZZ_SLOW_EXECS) ;; *) t=$(FUZZ_EXECS) ;; esac; \
		fi; \
		echo "fuzz $$f in $$p for $$t"; \
		CGO_ENABLED=0 $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $$t -fuzzminimizetime 5s $$p || exit 1; \
	done

verbs-note:
ifneq ($(HAVE_VERBS),yes)
	@echo "note: no libibverbs/librdmacm headers: checking the portable build only (make deps installs them)"
endif

# Test binaries are built on the host and run in the VM: same libraries.
# The interop tests run on Soft-RoCE only: iWARP has no datagrams.
vmtest: deps
	mkdir -p $(OUT)
	$(GO) test -c -o $(OUT)/rdma.test .
	$(GO) test -race -c -o $(OUT)/rdma.race.test .
	$(GO) test -c -o $(OUT)/rdmaperf.test ./cmd/rdmaperf
	$(GO) test -c -o $(OUT)/rdmainfo.test ./cmd/rdmainfo
	$(GO) test -tags faultinject -c -o $(OUT)/rdma.faults.test .
	cd interop && $(GO) test -c -o $(abspath $(OUT))/interop.test .
	cd metrics/prometheus && $(GO) test -c -o $(abspath $(OUT))/promadapter.test .
	$(GO) test -c -o $(OUT)/objstore.test ./examples/objectstore
	for e in http blockstore fallback; do $(GO) test -c -o $(OUT)/ex-$$e.test ./examples/$$e || exit 1; done
	for m in $(EXAMPLE_MODULES); do (cd $$m && $(GO) test -c -o $(abspath $(OUT))/ex-$${m#examples/}.test .) || exit 1; done
	$(VM) --timeout $(VMTIMEOUT) -- sh -c '$(OUT)/rdma.test -test.v -test.count=1 -test.timeout 20m && $(OUT)/rdmaperf.test -test.v -test.count=1 && $(OUT)/rdmainfo.test -test.v -test.count=1 && \
		echo "=== quic-go and miekg/dns over PacketConn (interop/)" && \
		$(OUT)/interop.test -test.v -test.count=1 -test.timeout 5m && \
		echo "=== the applications as benchmarks, RDMA beside Go TCP, a small fixed count (interop/apps_test.go)" && \
		$(OUT)/interop.test -test.count=1 -test.run "^$$" -test.bench . -test.benchtime 5x -test.timeout 5m && \
		echo "=== the Prometheus adapter scraped over a real connection (metrics/prometheus)" && \
		$(OUT)/promadapter.test -test.v -test.count=1 -test.timeout 5m && \
		echo "=== the token pattern: an object store over HTTP with its bodies by one-sided RDMA, beside HTTP bodies (examples/objectstore)" && \
		$(OUT)/objstore.test -test.v -test.count=1 -test.timeout 10m && \
		$(OUT)/objstore.test -test.count=1 -test.run "^$$" -test.bench . -test.benchtime 3x -test.timeout 10m && \
		echo "=== the feature examples (examples/: http, blockstore, fallback, grpc, quic, dns)" && \
		for e in http blockstore fallback grpc quic dns; do $(OUT)/ex-$$e.test -test.v -test.count=1 -test.timeout 3m || exit 1; done && \
		echo "=== the random test again, sends posted with the lock held as on a NIC (RDMA_TEST_POST_HELD)" && \
		env RDMA_TEST_POST_HELD=1 $(OUT)/rdma.test -test.v -test.count=1 -test.run "^TestRandomConcurrentOps$$" -test.timeout 5m && \
		echo "=== every benchmark, a small fixed count" && \
		$(OUT)/rdma.test -test.count=1 -test.run "^$$" -test.bench . -test.benchtime 20x -test.timeout 5m && \
		echo "=== the same tests under the race detector (-short)" && \
		$(OUT)/rdma.race.test -test.v -test.count=1 -test.short -test.timeout 20m'
	@echo "=== every call into the kernel's RDMA interface made to fail in turn (faults_test.go)"
	$(VM) --timeout $(VMTIMEOUT) -- $(OUT)/rdma.faults.test -test.v -test.count=1 -test.run '^TestFault' -test.timeout 20m
	@echo "=== the device suite again on soft-iWARP (siw0 instead of rxe0: testbed/vm.sh --provider siw)"
	$(VM) --provider siw --timeout $(VMTIMEOUT) -- sh -c '$(OUT)/rdma.test -test.v -test.count=1 -test.timeout 20m && \
		$(OUT)/rdma.test -test.count=1 -test.run "^$$" -test.bench . -test.benchtime 20x -test.timeout 5m'
	@echo "=== scale: 10,000 connection pairs (20,000 ends) at once (or as many as the VM's memory holds) in a VM of 8 GiB"
	$(VM) --mem 8192 --timeout $(VMTIMEOUT) -- env RDMA_TEST_SCALE_PAIRS=10000 $(OUT)/rdma.test -test.v -test.count=1 -test.run '^TestScale$$' -test.timeout 15m
	@echo "=== two hosts: the same binary on a pair of VMs (testbed/vm.sh --pair), the peer killed last"
	$(VM) --pair --timeout $(VMTIMEOUT) -- sh -c '$(OUT)/rdma.test -test.v -test.count=1 -test.run TwoHost -test.skip PeerKilled -test.timeout 15m && \
		$(OUT)/rdma.test -test.v -test.count=1 -test.run TwoHostPeerKilled -test.timeout 5m'

test: deps check unit vmtest

# What the test bed's machine has: devices, ports, GIDs, memlock, what fits.
info: deps
	mkdir -p $(OUT)
	$(GO) build -o $(OUT)/rdmainfo ./cmd/rdmainfo
	$(VM) --timeout 300 -- $(OUT)/rdmainfo

demo: deps
	mkdir -p $(OUT)
	$(GO) build -o $(OUT)/echo ./examples/echo
	$(VM) --timeout 600 -- $(OUT)/echo

clean:
	rm -rf $(OUT)

# The table on Soft-RoCE, then its latency, streaming and one-sided rows on
# soft-iWARP (bench/results-siw.*), then the latency, stream, setup and HTTP
# rows across the test bed's two VMs (bench/results-pair.*), then the
# applications against Go TCP (bench/results-apps.*), then many clients
# against Go TCP (bench/results-clients.*).
bench: deps zerocost
	bench/bench.sh
	BENCH_ONLY=siw bench/bench.sh
	BENCH_ONLY=pair bench/bench.sh
	bench/apps.sh
	bench/clients.sh --table
	$(MAKE) charts

# The SVG charts in bench/ from the results files there (bench/plot).
charts:
	cd bench/plot && $(GO) run . -in .. -out ..

# The library against C per message over the zero-cost provider, on this
# host: bench/results-zerocost.md.
zerocost:
	bench/zerocost.sh

# The applications (interop/apps_test.go) over RDMA and over Go TCP in one
# Soft-RoCE VM run: bench/results-apps.md.
apps: deps
	bench/apps.sh

# 100, 1,000 and 10,000 clients of one echo server over RDMA and over Go
# TCP in one Soft-RoCE VM run: bench/results-clients.md.
clients: deps
	bench/clients.sh --table
	$(MAKE) charts

# The testing.B benchmarks of the data path (round trips per poll mode,
# streaming per write size), in the VM.
microbench: deps
	mkdir -p $(OUT)
	$(GO) test -c -o $(OUT)/rdma.test .
	$(VM) --timeout 900 -- $(OUT)/rdma.test -test.run '^$$' -test.bench . -test.benchtime 2s
