//go:build linux && cgo

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/goverbs/rdma"
	"github.com/goverbs/rdma/internal/ibv"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the command with its arguments (without the program name); it
// returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	var opts rdma.Options
	var asJSON bool
	fs := flag.NewFlagSet("rdmainfo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&asJSON, "json", false, "print one JSON document (its schema: go doc github.com/goverbs/rdma/cmd/rdmainfo)")
	fs.IntVar(&opts.BufferSize, "buffer", 0, "Options.BufferSize in bytes (0: library default)")
	fs.IntVar(&opts.SendDepth, "send-depth", 0, "Options.SendDepth, data messages in flight per connection (0: library default)")
	fs.IntVar(&opts.RecvDepth, "recv-depth", 0, "Options.RecvDepth, receives posted per connection (0: library default)")
	fs.IntVar(&opts.SendDepth, "sdepth", 0, "alias of -send-depth (rdmaperf)")
	fs.IntVar(&opts.RecvDepth, "rdepth", 0, "alias of -recv-depth (rdmaperf)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: rdmainfo [-json] [-buffer bytes] [-send-depth n] [-recv-depth n]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rdmainfo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	r, err := collect(opts)
	if err != nil {
		fmt.Fprintf(stderr, "rdmainfo: %v\n", err)
		return 2
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else {
		err = r.writeText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rdmainfo: %v\n", err)
		return 1
	}
	if !r.anyActive() {
		return 1
	}
	return 0
}

// collect asks the devices and the process; it fails only for Options the
// library would refuse.
func collect(opts rdma.Options) (*Report, error) {
	per, err := perConnection(opts)
	if err != nil {
		return nil, err
	}
	r := &Report{Devices: []Device{}, Options: per}
	devs, err := ibv.Devices()
	if errors.Is(err, syscall.ENOSYS) {
		r.DevicesError = err.Error() + " (this kernel has no RDMA support: no /sys/class/infiniband)"
	} else if err != nil {
		r.DevicesError = err.Error()
	}
	for _, d := range devs {
		r.Devices = append(r.Devices, device(d, per.CQEntries))
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return nil, os.NewSyscallError("getrlimit", err)
	}
	r.Memlock = Memlock{Soft: rlimit(lim.Cur), Hard: rlimit(lim.Max), CapIPCLock: hasCapIPCLock()}
	r.Memlock.Connections = memlockFit(r.Memlock.Soft, r.Memlock.CapIPCLock, per.RegisteredBytes)
	return r, nil
}

func device(d ibv.DeviceInfo, cqEntries int) Device {
	out := Device{Name: d.Name, NodeType: d.NodeType, Ports: []Port{}}
	if d.Err != nil {
		out.Error = d.Err.Error()
		return out
	}
	out.VendorID, out.VendorPartID = d.VendorID, d.VendorPartID
	out.NodeGUID = formatGUID(d.NodeGUID)
	out.Firmware = d.FWVersion
	out.MaxQP, out.MaxQPWR, out.MaxCQ, out.MaxCQE, out.MaxMR, out.MaxPD, out.MaxMRSize = d.MaxQP, d.MaxQPWR, d.MaxCQ, d.MaxCQE, d.MaxMR, d.MaxPD, d.MaxMRSize
	out.Connections, _ = deviceFit(out, cqEntries)
	for _, p := range d.Ports {
		out.Ports = append(out.Ports, port(p))
	}
	out.Transport, out.Implies = transport(d.Transport, out.Ports)
	return out
}

// transport names a device's transport as users know it, and says what it
// implies for this library.
func transport(t string, ports []Port) (name, implies string) {
	switch {
	case t == "iWARP":
		return t, "iWARP: no immediate data, so message headers travel as SENDs (a page more registered per connection); " +
			"memory RDMA READs land in is writable by the peer; the RDMA port is a TCP port, so FallbackTCP cannot share it"
	case t == "InfiniBand" && len(ports) > 0 && ports[0].LinkLayer == "Ethernet":
		return "RoCE", ""
	}
	return t, ""
}

func port(p ibv.PortInfo) Port {
	out := Port{Port: p.Num, GIDs: []GID{}}
	if p.Err != nil {
		out.Error = p.Err.Error()
		return out
	}
	out.State = portStates[p.State]
	if out.State == "" {
		out.State = p.State.String()
	}
	out.PhysState = physStates[p.PhysState]
	out.LinkLayer = "InfiniBand"
	if p.LinkLayer == ibv.LinkLayerEthernet {
		out.LinkLayer = "Ethernet"
	} else {
		out.LID = p.LID
	}
	out.ActiveMTU, out.MaxMTU = p.ActiveMTU, p.MaxMTU
	out.ActiveWidth, out.ActiveSpeed = widths[p.ActiveWidth], speeds[p.ActiveSpeed]
	for _, g := range p.GIDs {
		if g.GID == [16]byte{} {
			continue
		}
		typ := "IB"
		switch g.Type {
		case ibv.GIDTypeRoCEv1:
			typ = "RoCE v1"
		case ibv.GIDTypeRoCEv2:
			typ = "RoCE v2"
		}
		roce := g.Type != ibv.GIDTypeIB
		out.GIDs = append(out.GIDs, GID{Index: g.Index, GID: gidString(g.GID), Type: typ, Netdev: g.Netdev, IP: gidIP(g.GID, roce)})
	}
	return out
}

// portStates are the states' names as ibv_devinfo prints them, without its
// PORT_ prefix.
var portStates = map[ibv.PortState]string{ibv.PortNop: "NOP", ibv.PortDown: "DOWN", ibv.PortInit: "INIT",
	ibv.PortArmed: "ARMED", ibv.PortActive: "ACTIVE", ibv.PortActiveDefer: "ACTIVE_DEFER"}

func rlimit(v uint64) Limit {
	if v == unix.RLIM_INFINITY {
		return unlimited
	}
	return Limit{N: v}
}

// capIPCLock is CAP_IPC_LOCK's bit in the capability sets
// (linux/capability.h).
const capIPCLock = 14

// hasCapIPCLock says whether the process's effective capabilities (CapEff
// in /proc/self/status) include CAP_IPC_LOCK: registrations are then not
// counted against RLIMIT_MEMLOCK.
func hasCapIPCLock() bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<capIPCLock) != 0
		}
	}
	return false
}
