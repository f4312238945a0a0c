package main

import (
	"errors"
	"net"
	"strings"

	"github.com/miekg/dns"

	"github.com/goverbs/rdma"
)

// zone is what the server knows: A records by name. pool.example.'s
// answer takes several KB: more than a packet.
var zone = map[string][]net.IP{
	"db.example.":   {net.IPv4(10, 1, 0, 1)},
	"pool.example.": pool(500),
}

func pool(n int) []net.IP {
	ips := make([]net.IP, n)
	for i := range ips {
		ips[i] = net.IPv4(10, 2, byte(i>>8), byte(i))
	}
	return ips
}

// answer is the server's handler.
func answer(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	if len(r.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		w.WriteMsg(m)
		return
	}
	q := r.Question[0]
	ips, ok := zone[strings.ToLower(q.Name)]
	switch {
	case !ok:
		m.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeA:
		for _, ip := range ips {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: ip})
		}
	}
	// No larger than the query said it takes: 512 bytes without EDNS0,
	// the rest cut off and the answer marked truncated.
	size := dns.MinMsgSize
	if o := r.IsEdns0(); o != nil {
		size = int(o.UDPSize())
		m.SetEdns0(o.UDPSize(), false)
	}
	m.Truncate(size)
	w.WriteMsg(m)
}

// server is a dns.Server on a PacketConn.
type server struct {
	srv    *dns.Server
	served chan error
}

func startServer(addr string) (*server, error) {
	pc, err := rdma.ListenPacket("rdma", addr)
	if err != nil {
		return nil, err
	}
	started := make(chan struct{})
	s := &server{
		srv:    &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(answer), NotifyStartedFunc: func() { close(started) }},
		served: make(chan error, 1),
	}
	go func() { s.served <- s.srv.ActivateAndServe() }()
	select {
	case <-started:
		return s, nil
	case err := <-s.served:
		return nil, errors.Join(err, pc.Close())
	}
}

func (s *server) addr() net.Addr { return s.srv.PacketConn.LocalAddr() }

// shutdown stops the server, which closes its PacketConn.
func (s *server) shutdown() error {
	return errors.Join(s.srv.Shutdown(), <-s.served)
}
