// Command grpc runs gRPC's health service over RDMA: a grpc.Server
// serving on an rdma.Listener, and a client whose grpc.WithContextDialer
// is an rdma.Dialer. The health service (google.golang.org/grpc/health)
// comes with its generated code, and has a unary method (Check) and a
// server stream (Watch). The client's calls, many at once, share one
// connection, as HTTP/2 streams.
//
//	go run . -addr 10.0.0.1:0
//
// The address must belong to an interface with an RDMA device. -server
// only serves (until interrupted); -client only runs the client against
// the server at -addr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/goverbs/rdma"
)

// service is the name the server reports the health of.
const service = "example.Store"

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR")+":0", "the server's address: an RDMA interface's IP and a port (0 picks one)")
	serverOnly := flag.Bool("server", false, "only serve, until interrupted")
	clientOnly := flag.Bool("client", false, "only run the client, against the server at -addr")
	calls := flag.Int("calls", 100, "Check calls the client makes at once")
	flag.Parse()
	if err := run(*addr, *serverOnly, *clientOnly, *calls); err != nil {
		log.Fatal(err)
	}
}

func run(addr string, serverOnly, clientOnly bool, calls int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if clientOnly {
		res, err := runClient(ctx, addr, calls, nil)
		fmt.Println(res)
		return err
	}
	s, err := startServer(addr)
	if err != nil {
		return err
	}
	if serverOnly {
		fmt.Println("serving on", s.ln.Addr())
		<-ctx.Done()
		s.health.Shutdown() // watchers learn of it before the server goes
		return s.stop()
	}
	// While the client watches, the server's status changes.
	res, err := runClient(ctx, s.ln.Addr().String(), calls, s.health.Shutdown)
	fmt.Println(res)
	fmt.Printf("the server accepted %d connection(s)\n", s.ln.Stats().Accepted)
	return errors.Join(err, s.stop())
}

// result is what the client saw.
type result struct {
	Checks  int                                          // concurrent Checks answered SERVING
	Watched []healthpb.HealthCheckResponse_ServingStatus // the statuses Watch sent
}

func (r result) String() string {
	return fmt.Sprintf("%d Checks answered SERVING; Watch sent %v", r.Checks, r.Watched)
}

// runClient makes calls Checks of service at once, checks that an unknown
// service is NotFound, and watches service: its status, and, if change
// is not nil, its status after calling change.
func runClient(ctx context.Context, addr string, calls int, change func()) (result, error) {
	d := rdma.Dialer{Timeout: 10 * time.Second}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "rdma", addr)
		}))
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	var res result
	var serving atomic.Int64
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
			if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				serving.Add(1)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	res.Checks = int(serving.Load())
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.Such"}); status.Code(err) != codes.NotFound {
		return res, fmt.Errorf("an unknown service's Check: %v, not NotFound", err)
	}

	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return res, err
	}
	for {
		r, err := watch.Recv()
		if err != nil {
			return res, err
		}
		res.Watched = append(res.Watched, r.GetStatus())
		if change == nil || len(res.Watched) == 2 {
			return res, nil // cancel ends the stream
		}
		change()
	}
}
