// Command blockstore is a block store its clients read and write by
// one-sided RDMA: the server registers a region for each client and sends
// its key over the connection, and the client's reads and writes of blocks
// are RDMA READs and WRITEs into the server's memory, which run no code of
// the server's. When the client is done it half-closes the connection and
// the server answers with a hash of its region, which the client checks
// against what it wrote.
//
//	go run ./examples/blockstore -addr 10.0.0.1:0
//
// The address must belong to an interface with an RDMA device. -server
// only serves (until interrupted); -client only runs a client against the
// server at -addr.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/goverbs/rdma"
)

const blockSize = 4096

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR")+":0", "the server's address: an RDMA interface's IP and a port (0 picks one)")
	serverOnly := flag.Bool("server", false, "only serve, until interrupted")
	clientOnly := flag.Bool("client", false, "only run a client, against the server at -addr")
	blocks := flag.Int("blocks", 256, "the blocks of each client's store")
	flag.Parse()
	if err := run(*addr, *serverOnly, *clientOnly, *blocks); err != nil {
		log.Fatal(err)
	}
}

func run(addr string, serverOnly, clientOnly bool, blocks int) error {
	if clientOnly {
		return runClient(addr)
	}
	ln, err := rdma.Listen("rdma", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	go serve(ln, blocks)
	if serverOnly {
		fmt.Println("serving on", ln.Addr())
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		<-ctx.Done()
		return nil
	}
	return runClient(ln.Addr().String())
}

// blockClient reads and writes the blocks of a server's store.
type blockClient struct {
	c     *rdma.Conn
	store *rdma.RemoteRegion
}

// dialStore dials the server and reads the key of its store.
func dialStore(addr string) (*blockClient, error) {
	d := rdma.Dialer{Timeout: 10 * time.Second}
	nc, err := d.Dial("rdma", addr)
	if err != nil {
		return nil, err
	}
	c := nc.(*rdma.Conn)
	b := make([]byte, rdma.RemoteKeyLen)
	var key rdma.RemoteKey
	if _, err = io.ReadFull(c, b); err == nil {
		err = key.UnmarshalBinary(b) // checks it is a key, not what it grants
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return &blockClient{c: c, store: c.Remote(key)}, nil
}

func (bc *blockClient) blocks() int { return int(bc.store.Size() / blockSize) }

func (bc *blockClient) writeBlock(i int, p []byte) error {
	_, err := bc.store.WriteAt(p[:blockSize], int64(i)*blockSize)
	return err
}

func (bc *blockClient) readBlock(i int, p []byte) error {
	_, err := bc.store.ReadAt(p[:blockSize], int64(i)*blockSize)
	return err
}

// serverSum tells the server the client is done and returns the hash of
// the store the server computed from its own memory.
func (bc *blockClient) serverSum() ([]byte, error) {
	if err := bc.c.CloseWrite(); err != nil {
		return nil, err
	}
	sum := make([]byte, sha256.Size)
	_, err := io.ReadFull(bc.c, sum)
	return sum, err
}

func (bc *blockClient) Close() error { return bc.c.Close() }

// runClient fills the store with random blocks, reads them back in the
// other order, and checks the server's hash of its memory.
func runClient(addr string) error {
	bc, err := dialStore(addr)
	if err != nil {
		return err
	}
	defer bc.Close()
	n := bc.blocks()
	want := make([]byte, n*blockSize)
	rand.Read(want)
	start := time.Now()
	for i := range n {
		if err := bc.writeBlock(i, want[i*blockSize:]); err != nil {
			return fmt.Errorf("write block %d: %w", i, err)
		}
	}
	wrote := time.Since(start)
	got := make([]byte, blockSize)
	for i := n - 1; i >= 0; i-- {
		if err := bc.readBlock(i, got); err != nil {
			return fmt.Errorf("read block %d: %w", i, err)
		}
		if !bytes.Equal(got, want[i*blockSize:(i+1)*blockSize]) {
			return fmt.Errorf("block %d: read other bytes than written", i)
		}
	}
	read := time.Since(start) - wrote
	fmt.Printf("the store's key: %d bytes, for %d blocks of %d bytes\n", rdma.RemoteKeyLen, n, blockSize)
	fmt.Printf("wrote %d blocks in %v, read them back in %v\n", n, wrote.Round(time.Microsecond), read.Round(time.Microsecond))
	sum, err := bc.serverSum()
	if err != nil {
		return err
	}
	if mine := sha256.Sum256(want); !bytes.Equal(sum, mine[:]) {
		return errors.New("the server's memory holds other bytes than written")
	}
	fmt.Println("the server's hash of its memory matches the blocks written")
	return nil
}
