//go:build linux && cgo

package ibv

// What the host's devices are, for a deployment check (cmd/rdmainfo): each
// device is opened, queried and closed again, in a context of its own
// (not one of those librdmacm keeps for connections).

/*
#cgo LDFLAGS: -libverbs
#include <endian.h>
#include <net/if.h>
#include <stdlib.h>
#include <infiniband/verbs.h>

// ibv_query_port is a macro and ibv_query_gid_table an inline function:
// cgo calls neither directly.
static int gv_dev_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	return ibv_query_port(ctx, port, attr);
}

// gv_dev_gid_table fills entries with the valid GIDs of every port (type
// and netdev included; rdma-core reads sysfs when the kernel has no ioctl
// for it). Returns their number, or a negative errno value.
static ssize_t gv_dev_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t n) {
	return ibv_query_gid_table(ctx, entries, n, 0);
}

// gv_dev_ifname names the netdev of an ifindex, or leaves name empty.
static void gv_dev_ifname(uint32_t ifindex, char *name) {
	if (!ifindex || !if_indextoname(ifindex, name))
		name[0] = 0;
}

static uint64_t gv_dev_be64(uint64_t v) { return be64toh(v); }
*/
import "C"

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// PortState is a port's logical state (enum ibv_port_state).
type PortState int

// Port states.
const (
	PortNop    PortState = 0 // IBV_PORT_NOP
	PortDown   PortState = 1 // IBV_PORT_DOWN
	PortInit   PortState = 2 // IBV_PORT_INIT
	PortArmed  PortState = 3 // IBV_PORT_ARMED
	PortActive PortState = 4 // IBV_PORT_ACTIVE
	// PortActiveDefer is active, with traffic held back for a while.
	PortActiveDefer PortState = 5 // IBV_PORT_ACTIVE_DEFER
)

// String is libibverbs' description of the state (ibv_port_state_str),
// e.g. "active".
func (s PortState) String() string {
	return C.GoString(C.ibv_port_state_str(C.enum_ibv_port_state(s)))
}

// Link layers of a port (ibv_port_attr.link_layer).
const (
	LinkLayerUnspecified = 0 // IBV_LINK_LAYER_UNSPECIFIED: InfiniBand, from old providers
	LinkLayerInfiniBand  = 1 // IBV_LINK_LAYER_INFINIBAND
	LinkLayerEthernet    = 2 // IBV_LINK_LAYER_ETHERNET
)

// GIDType is how a GID is used on the wire (enum ibv_gid_type).
type GIDType int

// GID types.
const (
	GIDTypeIB     GIDType = 0 // IBV_GID_TYPE_IB
	GIDTypeRoCEv1 GIDType = 1 // IBV_GID_TYPE_ROCE_V1
	GIDTypeRoCEv2 GIDType = 2 // IBV_GID_TYPE_ROCE_V2
)

// Compile-time checks that the constants above equal libibverbs' (see
// ibv.go).
var (
	_ [PortNop - C.IBV_PORT_NOP]struct{}
	_ [C.IBV_PORT_NOP - PortNop]struct{}
	_ [PortDown - C.IBV_PORT_DOWN]struct{}
	_ [C.IBV_PORT_DOWN - PortDown]struct{}
	_ [PortInit - C.IBV_PORT_INIT]struct{}
	_ [C.IBV_PORT_INIT - PortInit]struct{}
	_ [PortArmed - C.IBV_PORT_ARMED]struct{}
	_ [C.IBV_PORT_ARMED - PortArmed]struct{}
	_ [PortActive - C.IBV_PORT_ACTIVE]struct{}
	_ [C.IBV_PORT_ACTIVE - PortActive]struct{}
	_ [PortActiveDefer - C.IBV_PORT_ACTIVE_DEFER]struct{}
	_ [C.IBV_PORT_ACTIVE_DEFER - PortActiveDefer]struct{}
	_ [LinkLayerUnspecified - C.IBV_LINK_LAYER_UNSPECIFIED]struct{}
	_ [C.IBV_LINK_LAYER_UNSPECIFIED - LinkLayerUnspecified]struct{}
	_ [LinkLayerInfiniBand - C.IBV_LINK_LAYER_INFINIBAND]struct{}
	_ [C.IBV_LINK_LAYER_INFINIBAND - LinkLayerInfiniBand]struct{}
	_ [LinkLayerEthernet - C.IBV_LINK_LAYER_ETHERNET]struct{}
	_ [C.IBV_LINK_LAYER_ETHERNET - LinkLayerEthernet]struct{}
	_ [GIDTypeIB - C.IBV_GID_TYPE_IB]struct{}
	_ [C.IBV_GID_TYPE_IB - GIDTypeIB]struct{}
	_ [GIDTypeRoCEv1 - C.IBV_GID_TYPE_ROCE_V1]struct{}
	_ [C.IBV_GID_TYPE_ROCE_V1 - GIDTypeRoCEv1]struct{}
	_ [GIDTypeRoCEv2 - C.IBV_GID_TYPE_ROCE_V2]struct{}
	_ [C.IBV_GID_TYPE_ROCE_V2 - GIDTypeRoCEv2]struct{}
	// mtuBytes maps enum ibv_mtu 1 (IBV_MTU_256) to 5 (IBV_MTU_4096).
	_ [C.IBV_MTU_256 - 1]struct{}
	_ [1 - C.IBV_MTU_256]struct{}
	_ [C.IBV_MTU_4096 - 5]struct{}
	_ [5 - C.IBV_MTU_4096]struct{}
)

// DeviceInfo is what ibv_query_device, ibv_query_port and the GID table
// say of one device.
type DeviceInfo struct {
	Name     string // e.g. "rxe0", "mlx5_0"
	NodeType string // ibv_node_type_str: "InfiniBand channel adapter", "iWARP", ...
	// Transport is "InfiniBand" (also RoCE: the link layer tells them
	// apart), "iWARP", or another ibv_transport_type's name.
	Transport string
	// Err is why the device could not be opened or queried (the fields
	// below are then zero), e.g. a /dev/infiniband file the user may not
	// open.
	Err error

	NodeGUID     uint64 // host order
	SysImageGUID uint64
	FWVersion    string
	VendorID     uint32 // IEEE OUI
	VendorPartID uint32
	HWVersion    uint32
	MaxMRSize    uint64 // the largest region one registration may cover, bytes
	MaxQP        int
	MaxQPWR      int // work requests per queue
	MaxCQ        int
	MaxCQE       int // entries per CQ
	MaxMR        int
	MaxPD        int
	Ports        []PortInfo // ports 1 to phys_port_cnt
}

// PortInfo is one port (ibv_query_port) and its valid GIDs.
type PortInfo struct {
	Num       int
	Err       error // why ibv_query_port failed; the fields below are then zero
	State     PortState
	PhysState int // ibv_port_attr.phys_state: 5 is LinkUp, 3 Disabled, 2 Polling
	MaxMTU    int // bytes
	ActiveMTU int // bytes
	LinkLayer int // LinkLayerInfiniBand, LinkLayerEthernet
	// ActiveWidth and ActiveSpeed are the IB encodings (1X=1 4X=2 8X=4
	// 12X=8 2X=16; SDR=1 DDR=2 QDR=4 FDR10=8 FDR=16 EDR=32 HDR=64 NDR=128).
	ActiveWidth int
	ActiveSpeed int
	LID         uint16
	GIDTableLen int
	GIDs        []GIDEntry
}

// GIDEntry is one valid entry of a port's GID table.
type GIDEntry struct {
	Index   int
	GID     [16]byte
	Type    GIDType
	IfIndex int    // the netdev it belongs to (RoCE), 0 for none
	Netdev  string // its name, when it still exists
}

// Devices opens each RDMA device of the host (ibv_get_device_list) and
// queries it, its ports and their GID tables. Only listing the devices
// fails the call: a device that cannot be opened or queried is returned
// with Err set.
func Devices() ([]DeviceInfo, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, os.NewSyscallError("ibv_get_device_list", errnoOr(err))
	}
	defer C.ibv_free_device_list(list)
	var infos []DeviceInfo
	for _, d := range unsafe.Slice(list, int(n)) {
		infos = append(infos, queryDevice(d))
	}
	return infos, nil
}

func queryDevice(d *C.struct_ibv_device) DeviceInfo {
	info := DeviceInfo{
		Name:     C.GoString(C.ibv_get_device_name(d)),
		NodeType: C.GoString(C.ibv_node_type_str(d.node_type)),
	}
	switch d.transport_type {
	case C.IBV_TRANSPORT_IB:
		info.Transport = "InfiniBand"
	case C.IBV_TRANSPORT_IWARP:
		info.Transport = "iWARP"
	case C.IBV_TRANSPORT_USNIC, C.IBV_TRANSPORT_USNIC_UDP:
		info.Transport = "usNIC"
	default:
		info.Transport = fmt.Sprintf("transport %d", int(d.transport_type))
	}
	ctx, err := C.ibv_open_device(d)
	if ctx == nil {
		info.Err = os.NewSyscallError("ibv_open_device", errnoOr(err))
		return info
	}
	defer C.ibv_close_device(ctx)
	var a C.struct_ibv_device_attr
	if r := C.ibv_query_device(ctx, &a); r != 0 {
		info.Err = os.NewSyscallError("ibv_query_device", syscall.Errno(r))
		return info
	}
	info.NodeGUID = uint64(C.gv_dev_be64(C.uint64_t(a.node_guid)))
	info.SysImageGUID = uint64(C.gv_dev_be64(C.uint64_t(a.sys_image_guid)))
	info.FWVersion = C.GoString(&a.fw_ver[0])
	info.VendorID = uint32(a.vendor_id)
	info.VendorPartID = uint32(a.vendor_part_id)
	info.HWVersion = uint32(a.hw_ver)
	info.MaxMRSize = uint64(a.max_mr_size)
	info.MaxQP = int(a.max_qp)
	info.MaxQPWR = int(a.max_qp_wr)
	info.MaxCQ = int(a.max_cq)
	info.MaxCQE = int(a.max_cqe)
	info.MaxMR = int(a.max_mr)
	info.MaxPD = int(a.max_pd)

	gids := 0
	for p := 1; p <= int(a.phys_port_cnt); p++ {
		port := PortInfo{Num: p}
		var pa C.struct_ibv_port_attr
		if r := C.gv_dev_query_port(ctx, C.uint8_t(p), &pa); r != 0 {
			port.Err = os.NewSyscallError("ibv_query_port", syscall.Errno(r))
		} else {
			port.State = PortState(pa.state)
			port.PhysState = int(pa.phys_state)
			port.MaxMTU = mtuBytes(pa.max_mtu)
			port.ActiveMTU = mtuBytes(pa.active_mtu)
			port.LinkLayer = int(pa.link_layer)
			port.ActiveWidth = int(pa.active_width)
			port.ActiveSpeed = int(pa.active_speed)
			port.LID = uint16(pa.lid)
			port.GIDTableLen = int(pa.gid_tbl_len)
			gids += port.GIDTableLen
		}
		info.Ports = append(info.Ports, port)
	}
	if gids == 0 {
		return info
	}
	entries, err := gidTable(ctx, gids)
	if err != nil {
		info.Err = err
		return info
	}
	for _, e := range entries {
		if p := int(e.port_num); p >= 1 && p <= len(info.Ports) {
			info.Ports[p-1].GIDs = append(info.Ports[p-1].GIDs, gidEntry(&e))
		}
	}
	return info
}

// gidTable returns up to n valid GID entries of the context's ports.
func gidTable(ctx *C.struct_ibv_context, n int) ([]C.struct_ibv_gid_entry, error) {
	buf := (*C.struct_ibv_gid_entry)(C.calloc(C.size_t(n), C.sizeof_struct_ibv_gid_entry))
	if buf == nil {
		return nil, os.NewSyscallError("ibv_query_gid_table", syscall.ENOMEM)
	}
	defer C.free(unsafe.Pointer(buf))
	got := int(C.gv_dev_gid_table(ctx, buf, C.size_t(n)))
	if got < 0 {
		return nil, os.NewSyscallError("ibv_query_gid_table", syscall.Errno(-got))
	}
	// A copy in Go memory: the C array is freed on return.
	return append([]C.struct_ibv_gid_entry(nil), unsafe.Slice(buf, got)...), nil
}

func gidEntry(e *C.struct_ibv_gid_entry) GIDEntry {
	g := GIDEntry{Index: int(e.gid_index), Type: GIDType(e.gid_type), IfIndex: int(e.ndev_ifindex),
		GID: *(*[16]byte)(unsafe.Pointer(&e.gid))}
	var name [C.IF_NAMESIZE]C.char
	C.gv_dev_ifname(e.ndev_ifindex, &name[0])
	g.Netdev = C.GoString(&name[0])
	return g
}

// mtuBytes converts an enum ibv_mtu to bytes (0 for an unknown value).
func mtuBytes(m C.enum_ibv_mtu) int {
	if m < C.IBV_MTU_256 || m > C.IBV_MTU_4096 {
		return 0
	}
	return 256 << (m - C.IBV_MTU_256)
}

// ActiveMTU is the active MTU of the context's port (1-based), in bytes,
// or 0 when it cannot be queried.
func (c *Context) ActiveMTU(port uint8) int {
	var pa C.struct_ibv_port_attr
	if C.gv_dev_query_port(c.c, C.uint8_t(port), &pa) != 0 {
		return 0
	}
	return mtuBytes(pa.active_mtu)
}
