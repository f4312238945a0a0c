package main

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/goverbs/rdma"
)

// server is a grpc.Server with the health service, on an RDMA listener.
type server struct {
	ln     *rdma.Listener
	grpc   *grpc.Server
	health *health.Server
	served chan error
}

func startServer(addr string) (*server, error) {
	ln, err := rdma.Listen("rdma", addr)
	if err != nil {
		return nil, err
	}
	s := &server{ln: ln, grpc: grpc.NewServer(), health: health.NewServer(), served: make(chan error, 1)}
	s.health.SetServingStatus(service, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	go func() { s.served <- s.grpc.Serve(ln) }()
	return s, nil
}

// stop waits for the calls in progress and closes the listener.
func (s *server) stop() error {
	s.grpc.GracefulStop()
	return <-s.served
}
