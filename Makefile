# make test: formatting and static checks, host unit tests, then the device
# tests inside a Soft-RoCE VM (testbed/vm.sh). make demo: the echo example in
# the VM. make bench: the benchmark table. All of them install what they need
# on a Debian machine (as root).

GO          ?= go
OUT         := .testbed-out
VM          := testbed/vm.sh
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
VMTIMEOUT   ?= 1500

.PHONY: all deps check unit vmtest test demo bench microbench clean

all: test

# Debian packages (cgo headers and libraries, qemu, rdma-core, perftest),
# the VM's kernel and initramfs (cached), and the Go modules.
deps:
	$(VM) --prepare
	$(GO) mod download

check: deps
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

unit: deps
	$(GO) test -count=1 ./...

# Test binaries are built on the host and run in the VM: same libraries.
vmtest: deps
	mkdir -p $(OUT)
	$(GO) test -c -o $(OUT)/rdma.test .
	$(GO) test -race -c -o $(OUT)/rdma.race.test .
	$(VM) --timeout $(VMTIMEOUT) -- sh -c '$(OUT)/rdma.test -test.v -test.count=1 -test.timeout 20m && \
		echo "=== the same tests under the race detector (-short)" && \
		$(OUT)/rdma.race.test -test.v -test.count=1 -test.short -test.timeout 20m'

test: check unit vmtest

demo: deps
	mkdir -p $(OUT)
	$(GO) build -o $(OUT)/echo ./examples/echo
	$(VM) --timeout 600 -- $(OUT)/echo

clean:
	rm -rf $(OUT)

bench: deps
	bench/bench.sh

# The testing.B benchmarks of the data path (round trips per poll mode,
# streaming per write size), in the VM.
microbench: deps
	mkdir -p $(OUT)
	$(GO) test -c -o $(OUT)/rdma.test .
	$(VM) --timeout 900 -- $(OUT)/rdma.test -test.run '^$$' -test.bench . -test.benchtime 2s
