package rdma

import (
	"context"
	"net"
	"net/netip"
	"strconv"
)

// Addr is the address of an RDMA connection end point: an IP address of an
// RDMA-capable interface (an IPoIB or RoCE netdev) and an rdma_cm port.
type Addr struct {
	IP   net.IP // the interface's address
	Port int    // the rdma_cm port number
	Zone string // IPv6 scoped addressing zone
}

// Network returns "rdma".
func (a *Addr) Network() string { return "rdma" }

// String returns "host:port".
func (a *Addr) String() string {
	if a == nil {
		return "<nil>"
	}
	host := ""
	if len(a.IP) > 0 {
		host = a.IP.String()
		if a.Zone != "" {
			host += "%" + a.Zone
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(a.Port))
}

// AddrPort returns the address as a netip.AddrPort.
func (a *Addr) AddrPort() netip.AddrPort {
	if a == nil {
		return netip.AddrPort{}
	}
	ip, _ := netip.AddrFromSlice(a.IP)
	if a.Zone != "" {
		ip = ip.WithZone(a.Zone)
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(a.Port))
}

func addrFrom(ap netip.AddrPort) *Addr {
	// The Addr and its IP's bytes in one allocation: ReadFrom makes one
	// per datagram.
	a := new(struct {
		Addr
		ip [16]byte
	})
	ip := ap.Addr()
	a.Port, a.Zone = int(ap.Port()), ip.Zone()
	switch {
	case ip.Is4():
		b := ip.As4()
		copy(a.ip[:], b[:])
		a.IP = net.IP(a.ip[:4:4])
	case ip.IsValid():
		a.ip = ip.As16()
		a.IP = net.IP(a.ip[:])
	}
	return &a.Addr
}

// ResolveAddr parses and resolves address ("host:port") for network
// "rdma", "rdma4" or "rdma6", like net.ResolveTCPAddr.
func ResolveAddr(network, address string) (*Addr, error) {
	ap, err := resolve(context.Background(), network, address)
	if err != nil {
		return nil, err
	}
	return addrFrom(ap), nil
}

// resolve turns "host:port" into one IP address of the family the network
// allows: the first one the resolver returns.
func resolve(ctx context.Context, network, address string) (netip.AddrPort, error) {
	switch network {
	case "rdma", "rdma4", "rdma6":
	default:
		return netip.AddrPort{}, net.UnknownNetworkError(network)
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, &net.AddrError{Err: "missing port in address", Addr: address}
	}
	port, err := net.LookupPort("tcp", portStr)
	if err != nil {
		return netip.AddrPort{}, &net.AddrError{Err: "invalid port", Addr: address}
	}
	var ips []netip.Addr
	if host == "" {
		if network == "rdma6" {
			ips = []netip.Addr{netip.IPv6Unspecified()}
		} else {
			ips = []netip.Addr{netip.IPv4Unspecified()}
		}
	} else if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip.Unmap()}
	} else {
		addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return netip.AddrPort{}, err
		}
		ips = addrs
	}
	for _, ip := range ips {
		ip = ip.Unmap()
		switch {
		case network == "rdma4" && !ip.Is4():
		case network == "rdma6" && !ip.Is6():
		default:
			return netip.AddrPortFrom(ip, uint16(port)), nil
		}
	}
	return netip.AddrPort{}, &net.AddrError{Err: "no suitable address found", Addr: address}
}
