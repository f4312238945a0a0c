package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/goverbs/rdma"
)

// server is an http.Server on an RDMA listener.
type server struct {
	ln     *rdma.Listener
	srv    *http.Server
	served chan error
}

func startServer(addr string) (*server, error) {
	ln, err := rdma.Listen("rdma", addr)
	if err != nil {
		return nil, err
	}
	s := &server{ln: ln, srv: &http.Server{Handler: http.HandlerFunc(echoPath), ReadHeaderTimeout: 10 * time.Second}, served: make(chan error, 1)}
	go func() { s.served <- s.srv.Serve(ln) }()
	return s, nil
}

// shutdown closes the listener and each connection once its request is
// answered.
func (s *server) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return err
	}
	if err := <-s.served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// echoPath answers with the request's path, which the client checks.
func echoPath(w http.ResponseWriter, r *http.Request) {
	fmt.Fprint(w, r.URL.Path)
}
