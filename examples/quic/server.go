package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"

	"github.com/quic-go/quic-go"

	"github.com/goverbs/rdma"
)

// server is a QUIC echo server on a PacketConn; roots trusts its
// certificate.
type server struct {
	pc    *rdma.PacketConn
	tr    *quic.Transport
	ln    *quic.Listener
	roots *x509.CertPool
}

func startServer(addr, host string) (*server, error) {
	cert, err := selfSigned(host)
	if err != nil {
		return nil, err
	}
	pc, err := rdma.ListenPacket("rdma", addr)
	if err != nil {
		return nil, err
	}
	tr := &quic.Transport{Conn: pc}
	ln, err := tr.Listen(&tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{alpn}}, nil)
	if err != nil {
		return nil, errors.Join(err, tr.Close(), pc.Close())
	}
	go serve(ln)
	s := &server{pc: pc, tr: tr, ln: ln, roots: x509.NewCertPool()}
	s.roots.AddCert(cert.Leaf)
	return s, nil
}

// close ends the server's connections (and their goroutines), then closes
// the PacketConn, which quic-go leaves to its owner.
func (s *server) close() error {
	return errors.Join(s.ln.Close(), s.tr.Close(), s.pc.Close())
}

// serve echoes every stream of every connection ln accepts, until ln (or
// its transport) is closed.
func serve(ln *quic.Listener) {
	for {
		conn, err := ln.Accept(context.Background())
		if err != nil {
			return
		}
		go func() {
			for {
				s, err := conn.AcceptStream(context.Background())
				if err != nil {
					return // the connection is over
				}
				go func() {
					if _, err := io.Copy(s, s); err != nil {
						s.CancelWrite(1)
						return
					}
					s.Close()
				}()
			}
		}()
	}
}
