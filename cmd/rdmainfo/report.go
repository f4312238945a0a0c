package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/goverbs/rdma"
)

// Report is the JSON document (see the package comment); its text form is
// writeText's.
type Report struct {
	Devices      []Device    `json:"devices"`
	DevicesError string      `json:"devices_error,omitempty"`
	Memlock      Memlock     `json:"memlock"`
	Options      OptionsInfo `json:"options"`
}

// Device is one RDMA device.
type Device struct {
	Name     string `json:"name"`
	NodeType string `json:"node_type"`
	// Transport is "InfiniBand", "RoCE" (InfiniBand's transport over an
	// Ethernet link layer) or "iWARP"; Implies says what that means for
	// this library.
	Transport    string `json:"transport"`
	Implies      string `json:"implies,omitempty"`
	Error        string `json:"error,omitempty"`
	VendorID     uint32 `json:"vendor_id"`
	VendorPartID uint32 `json:"vendor_part_id"`
	NodeGUID     string `json:"node_guid"`
	Firmware     string `json:"firmware"`
	MaxQP        int    `json:"max_qp"`
	MaxQPWR      int    `json:"max_qp_wr"`
	MaxCQ        int    `json:"max_cq"`
	MaxCQE       int    `json:"max_cqe"`
	MaxMR        int    `json:"max_mr"`
	MaxPD        int    `json:"max_pd"`
	MaxMRSize    uint64 `json:"max_mr_size"`
	Connections  int    `json:"connections"`
	Ports        []Port `json:"ports"`
}

// Port is one port of a device.
type Port struct {
	Port        int    `json:"port"`
	Error       string `json:"error,omitempty"`
	State       string `json:"state"`
	PhysState   string `json:"phys_state,omitempty"`
	LinkLayer   string `json:"link_layer"`
	ActiveMTU   int    `json:"active_mtu"`
	MaxMTU      int    `json:"max_mtu"`
	ActiveWidth string `json:"active_width,omitempty"`
	ActiveSpeed string `json:"active_speed,omitempty"`
	LID         uint16 `json:"lid,omitempty"`
	GIDs        []GID  `json:"gids"`
}

// GID is one valid entry of a port's GID table.
type GID struct {
	Index  int    `json:"index"`
	GID    string `json:"gid"`
	Type   string `json:"type"`
	Netdev string `json:"netdev,omitempty"`
	IP     string `json:"ip,omitempty"`
}

// Memlock is the process's locked-memory limit and what fits in it.
type Memlock struct {
	Soft        Limit `json:"soft"`
	Hard        Limit `json:"hard"`
	CapIPCLock  bool  `json:"cap_ipc_lock"`
	Connections Limit `json:"connections"`
}

// OptionsInfo is the Options asked about and what one connection end with
// them takes.
type OptionsInfo struct {
	BufferSize      int `json:"buffer_size"`
	SendDepth       int `json:"send_depth"`
	RecvDepth       int `json:"recv_depth"`
	RegisteredBytes int `json:"registered_bytes"`       // idle
	GrownBytes      int `json:"grown_registered_bytes"` // while it streams both ways
	CQEntries       int `json:"cq_entries"`
}

// Limit is a number or unlimited; in JSON the number or the string
// "unlimited", as ulimit prints it.
type Limit struct {
	N         uint64
	Unlimited bool
}

var unlimited = Limit{Unlimited: true}

func (l Limit) String() string {
	if l.Unlimited {
		return "unlimited"
	}
	return strconv.FormatUint(l.N, 10)
}

// MarshalJSON writes the number, or "unlimited".
func (l Limit) MarshalJSON() ([]byte, error) {
	if l.Unlimited {
		return []byte(`"unlimited"`), nil
	}
	return strconv.AppendUint(nil, l.N, 10), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (l *Limit) UnmarshalJSON(b []byte) error {
	if string(b) == `"unlimited"` {
		*l = unlimited
		return nil
	}
	var n uint64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a number or \"unlimited\": %w", err)
	}
	*l = Limit{N: n}
	return nil
}

// perConnection fills in the defaults of o and says what one connection
// end with these Options takes; it fails for Options Dial and Listen would
// refuse.
func perConnection(o rdma.Options) (OptionsInfo, error) {
	mem, err := o.RegisteredMemory()
	if err != nil {
		return OptionsInfo{}, err
	}
	info := OptionsInfo{BufferSize: o.BufferSize, SendDepth: o.SendDepth, RecvDepth: o.RecvDepth, RegisteredBytes: mem}
	if info.BufferSize == 0 {
		info.BufferSize = rdma.DefaultBufferSize
	}
	if info.SendDepth == 0 {
		info.SendDepth = rdma.DefaultSendDepth
	}
	if info.RecvDepth == 0 {
		info.RecvDepth = rdma.DefaultRecvDepth
	}
	if info.GrownBytes, err = o.GrownRegisteredMemory(); err != nil {
		return OptionsInfo{}, err
	}
	if info.CQEntries, err = o.CompletionQueueEntries(); err != nil {
		return OptionsInfo{}, err
	}
	return info, nil
}

// memlockFit is how many connection ends registering perConn bytes each fit
// in the soft limit: all of them when it is infinite or the process has
// CAP_IPC_LOCK (the kernel then does not count).
func memlockFit(soft Limit, capIPCLock bool, perConn int) Limit {
	if soft.Unlimited || capIPCLock {
		return unlimited
	}
	if perConn <= 0 {
		return Limit{}
	}
	return Limit{N: soft.N / uint64(perConn)}
}

// deviceFit is how many connection ends of one process a device holds, and
// the device limit that binds: each takes CQ entries (a process's
// connections share CQs of at most max_cqe entries each, and the device
// has at most max_cq of them), one QP of max_qp, two memory regions of
// max_mr (its receive ring and its send ring) and one protection domain of
// max_pd (its own, so that no other connection's peer can use its ring's
// key).
func deviceFit(d Device, cqEntries int) (int, string) {
	if cqEntries <= 0 || cqEntries > d.MaxCQE {
		return 0, "max_cqe"
	}
	n, bound := d.MaxCQ*(d.MaxCQE/cqEntries), "max_cq × max_cqe"
	if d.MaxQP < n {
		n, bound = d.MaxQP, "max_qp"
	}
	if d.MaxMR/2 < n {
		n, bound = d.MaxMR/2, "max_mr"
	}
	if d.MaxPD < n {
		n, bound = d.MaxPD, "max_pd"
	}
	return max(0, n), bound
}

// Names of the IB encodings of a port's physical state, width and speed
// (as ibv_devinfo prints them).
var (
	physStates = map[int]string{1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION_TRAINING",
		5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY_TEST"}
	widths = map[int]string{1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
	speeds = map[int]string{1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps", 8: "10.0 Gbps", 16: "14.0 Gbps",
		32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps"}
)

// gidIP is the IP address a RoCE GID stands for: IPv4 when it is an
// IPv4-mapped address. An InfiniBand GID is not an address.
func gidIP(gid [16]byte, roce bool) string {
	if !roce {
		return ""
	}
	return netip.AddrFrom16(gid).Unmap().String()
}

// gidString writes a GID as eight groups of four hex digits (as
// show_gids does).
func gidString(gid [16]byte) string { return netip.AddrFrom16(gid).StringExpanded() }

// formatGUID writes a GUID as ibv_devinfo does: four groups of four hex
// digits.
func formatGUID(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

// bytesIEC writes a byte count in the largest binary unit it fills: exact
// when it is a whole number of that unit or the one below, else to a
// tenth.
func bytesIEC(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	u := 0
	for u+1 < len(units) && n>>(10*(u+1)) > 0 {
		u++
	}
	switch {
	case u == 0:
		return fmt.Sprintf("%d B", n)
	case n%(1<<(10*u)) == 0:
		return fmt.Sprintf("%d %s", n>>(10*u), units[u])
	case n%(1<<(10*(u-1))) == 0 && n>>(10*(u-1)) < 10000:
		return fmt.Sprintf("%d %s", n>>(10*(u-1)), units[u-1])
	}
	return fmt.Sprintf("%.1f %s", float64(n)/math.Pow(1024, float64(u)), units[u])
}

func limitIEC(l Limit) string {
	if l.Unlimited {
		return "unlimited"
	}
	return bytesIEC(l.N)
}

// anyActive says whether some port of some device is ACTIVE.
func (r *Report) anyActive() bool {
	for _, d := range r.Devices {
		for _, p := range d.Ports {
			if p.State == "ACTIVE" {
				return true
			}
		}
	}
	return false
}

// memlockBinds says whether the locked-memory limit, rather than the
// devices, bounds the connections: the advice to raise it is then worth
// its line.
func (r *Report) memlockBinds() bool {
	m := r.Memlock.Connections
	if m.Unlimited {
		return false
	}
	if len(r.Devices) == 0 {
		return true
	}
	for _, d := range r.Devices {
		if m.N < uint64(d.Connections) {
			return true
		}
	}
	return false
}

// writeText writes the report for people: each device with its ports and
// GIDs, then the limit and what fits.
func (r *Report) writeText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if r.DevicesError != "" {
		fmt.Fprintf(tw, "no RDMA devices: %s\n", r.DevicesError)
	} else if len(r.Devices) == 0 {
		fmt.Fprintf(tw, "no RDMA devices\n")
	}
	for _, d := range r.Devices {
		if d.Error != "" {
			fmt.Fprintf(tw, "%s: %s\n", d.Name, d.Error)
			continue
		}
		fmt.Fprintf(tw, "%s: %s (%s), vendor 0x%06x part %d, node GUID %s", d.Name, d.Transport, d.NodeType, d.VendorID, d.VendorPartID, d.NodeGUID)
		if d.Firmware != "" {
			fmt.Fprintf(tw, ", firmware %s", d.Firmware)
		}
		if d.Implies != "" {
			fmt.Fprintf(tw, "\n  %s", d.Implies)
		}
		fmt.Fprintf(tw, "\n  max_qp %d, max_qp_wr %d, max_cq %d, max_cqe %d, max_mr %d, max_pd %d, max_mr_size %s\n",
			d.MaxQP, d.MaxQPWR, d.MaxCQ, d.MaxCQE, d.MaxMR, d.MaxPD, bytesIEC(d.MaxMRSize))
		for _, p := range d.Ports {
			if p.Error != "" {
				fmt.Fprintf(tw, "  port %d: %s\n", p.Port, p.Error)
				continue
			}
			state := p.State
			if p.PhysState != "" {
				state += " (" + p.PhysState + ")"
			}
			fmt.Fprintf(tw, "  port %d: %s, %s, MTU %d (max %d)", p.Port, state, p.LinkLayer, p.ActiveMTU, p.MaxMTU)
			if p.ActiveWidth != "" && p.ActiveSpeed != "" {
				fmt.Fprintf(tw, ", %s %s", p.ActiveWidth, p.ActiveSpeed)
			}
			if p.LinkLayer == "InfiniBand" {
				fmt.Fprintf(tw, ", LID %d", p.LID)
			}
			fmt.Fprintln(tw)
			for _, g := range p.GIDs {
				fmt.Fprintf(tw, "    GID %d\t%s\t%s\t%s\t%s\n", g.Index, g.GID, g.Type, g.Netdev, g.IP)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	o, m := r.Options, r.Memlock
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	capNote := "no"
	if m.CapIPCLock {
		capNote = "yes (the limit does not apply)"
	}
	fmt.Fprintf(tw, "memlock\tsoft %s, hard %s; CAP_IPC_LOCK %s\n", limitIEC(m.Soft), limitIEC(m.Hard), capNote)
	fmt.Fprintf(tw, "options\tbuffer %s, send depth %d, recv depth %d: %s registered (%s while it streams) and %d CQ entries per connection end\n",
		bytesIEC(uint64(o.BufferSize)), o.SendDepth, o.RecvDepth, bytesIEC(uint64(o.RegisteredBytes)), bytesIEC(uint64(o.GrownBytes)), o.CQEntries)
	fits := []string{m.Connections.String() + " within memlock"}
	for _, d := range r.Devices {
		if d.Error == "" {
			_, bound := deviceFit(d, o.CQEntries)
			fits = append(fits, fmt.Sprintf("%d within %s's %s", d.Connections, d.Name, bound))
		}
	}
	fmt.Fprintf(tw, "fit\tconnection ends per process: %s\n", strings.Join(fits, ", "))
	if r.memlockBinds() {
		fmt.Fprintf(tw, "advice\traise the memlock limit: ulimit -l unlimited, or LimitMEMLOCK=infinity for a systemd service; "+
			"each connection registers %d KiB with these Options (%d KiB while it streams)\n", o.RegisteredBytes>>10, o.GrownBytes>>10)
	}
	return tw.Flush()
}
