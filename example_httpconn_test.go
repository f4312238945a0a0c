package rdma_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/goverbs/rdma"
)

// The token pattern: a request names the client's region in a header, and
// the handler RDMA-READs the upload from it on the request's own
// connection (the only one the key is good on); the response only says how
// it went. (Needs an RDMA device at 10.0.0.1, as the examples before it;
// examples/objectstore is a whole store built this way, client included.)
func ExampleContextWithConn() {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := rdma.ConnFromContext(r.Context())
		if !ok {
			http.Error(w, "a token needs an RDMA connection", http.StatusBadRequest)
			return
		}
		var key rdma.RemoteKey
		if err := key.UnmarshalText([]byte(r.Header.Get("Rdma-Token"))); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if key.Size > 64<<20 {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
			return
		}
		buf, err := c.RegisterRegion(int(key.Size), 0) // local only
		if err != nil {
			http.Error(w, err.Error(), http.StatusInsufficientStorage)
			return
		}
		defer buf.Close()
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if err := c.Remote(key).ReadAtContext(ctx, buf, 0, buf.Len(), 0); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		fmt.Printf("uploaded %d bytes: %q...\n", buf.Len(), buf.Bytes()[:5])
		w.WriteHeader(http.StatusNoContent)
	})

	ln, err := rdma.Listen("rdma", "10.0.0.1:8080")
	if err != nil {
		log.Fatal(err)
	}
	// Every request's context carries the connection it came on.
	srv := &http.Server{Handler: h, ConnContext: rdma.ContextWithConn}
	log.Fatal(srv.Serve(ln))
}
