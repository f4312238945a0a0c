package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"time"

	"github.com/goverbs/rdma"
)

// A tiny remote block store: the server exposes a region of blocks, and
// its clients read and write blocks with RDMA READ and WRITE, without the
// server's CPU. The server sends each client the region's key over the
// connection; the connection stays open as long as the client uses the
// region (closing it revokes the region).

// blockSize is the store's block; the region holds blockCount of them.
const (
	blockSize  = 4096
	blockCount = 256
)

// serveBlocks gives every client of ln a store of its own, until ln is
// closed.
func serveBlocks(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			if err := serveClient(c.(*rdma.Conn)); err != nil {
				log.Print(err)
			}
		}()
	}
}

func serveClient(c *rdma.Conn) error {
	defer c.Close()
	store, err := c.RegisterRegion(blockSize*blockCount, rdma.RemoteRead|rdma.RemoteWrite)
	if err != nil {
		return err
	}
	defer store.Close()
	key, err := store.Key().MarshalBinary()
	if err != nil {
		return err
	}
	if _, err := c.Write(key); err != nil {
		return err
	}
	// The client reads and writes the blocks by itself; it hangs up when
	// it is done.
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// blockClient reads and writes a server's blocks.
type blockClient struct {
	c      *rdma.Conn
	blocks *rdma.RemoteRegion
}

func dialBlocks(addr string) (*blockClient, error) {
	c, blocks, err := dialRegion(addr)
	if err != nil {
		return nil, err
	}
	return &blockClient{c: c, blocks: blocks}, nil
}

// dialRegion dials a server that sends a region's key first, and returns
// the connection and the server's region.
func dialRegion(addr string) (*rdma.Conn, *rdma.RemoteRegion, error) {
	c, err := rdma.Dial("rdma", addr)
	if err != nil {
		return nil, nil, err
	}
	b := make([]byte, rdma.RemoteKeyLen)
	var key rdma.RemoteKey
	if _, err = io.ReadFull(c, b); err == nil {
		err = key.UnmarshalBinary(b)
	}
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, c.Remote(key), nil
}

func (bc *blockClient) readBlock(i int, p []byte) error {
	_, err := bc.blocks.ReadAt(p[:blockSize], int64(i)*blockSize)
	return err
}

func (bc *blockClient) writeBlock(i int, p []byte) error {
	_, err := bc.blocks.WriteAt(p[:blockSize], int64(i)*blockSize)
	return err
}

func (bc *blockClient) Close() error { return bc.c.Close() }

// The client writes a block and reads it back. (Like the other examples
// it needs an RDMA device at 10.0.0.1; the device tests run the same
// server and client: TestRegionBlockStore.)
func Example_blockStore() {
	ln, err := rdma.Listen("rdma", "10.0.0.1:7472")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go serveBlocks(ln)

	bc, err := dialBlocks(ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer bc.Close()
	block := make([]byte, blockSize)
	copy(block, "hello, block 7")
	if err := bc.writeBlock(7, block); err != nil {
		log.Fatal(err)
	}
	got := make([]byte, blockSize)
	if err := bc.readBlock(7, got); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(got[:14]))
}

// The owner's side of one-sided RDMA: a region the peer may read and
// write, its key sent over the connection, and the region closed once the
// peer says it is done. (Needs an RDMA device at 10.0.0.1, as the
// examples before it.)
func ExampleConn_RegisterRegion() {
	ln, err := rdma.Listen("rdma", "10.0.0.1:7473")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	nc, err := ln.Accept()
	if err != nil {
		log.Fatal(err)
	}
	c := nc.(*rdma.Conn)
	defer c.Close()

	r, err := c.RegisterRegion(1<<20, rdma.RemoteRead|rdma.RemoteWrite)
	if err != nil {
		log.Fatal(err)
	}
	// Close revokes the peer's access and unmaps the memory: the slice
	// Bytes returned must not be used after it.
	defer r.Close()
	copy(r.Bytes(), "the owner's data")
	key, err := r.Key().MarshalBinary()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Write(key); err != nil {
		log.Fatal(err)
	}
	// The peer's RDMA READs and WRITEs involve no code here: it sends a
	// byte when it is done, and only then are its writes worth reading.
	done := make([]byte, 1)
	if _, err := io.ReadFull(c, done); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", r.Bytes()[:16])
}

// The peer's side: the key read off the connection, checked, and used to
// read and write the owner's region as an io.ReaderAt and io.WriterAt.
func ExampleRemoteRegion_ReadAt() {
	c, err := rdma.Dial("rdma", "10.0.0.1:7473")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	b := make([]byte, rdma.RemoteKeyLen)
	if _, err := io.ReadFull(c, b); err != nil {
		log.Fatal(err)
	}
	var key rdma.RemoteKey
	if err := key.UnmarshalBinary(b); err != nil {
		log.Fatal(err) // not a key, or not one this package made
	}
	remote := c.Remote(key)

	got := make([]byte, 16)
	if _, err := remote.ReadAt(got, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("read %q of %d bytes\n", got, remote.Size())
	if _, err := remote.WriteAt([]byte("the peer's data!"), 0); err != nil {
		log.Fatal(err)
	}
	// WriteAt returned once the owner's NIC had the bytes; tell the owner.
	if _, err := c.Write([]byte{1}); err != nil {
		log.Fatal(err)
	}
}

// Large transfers without a copy: ReadAtContext reads the peer's region
// straight into a region of this side's, registered with no remote access
// (the peer cannot touch it), under a deadline.
func ExampleRemoteRegion_ReadAtContext() {
	c, err := rdma.Dial("rdma", "10.0.0.1:7473")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, rdma.RemoteKeyLen)
	var key rdma.RemoteKey
	if _, err := io.ReadFull(c, b); err != nil {
		log.Fatal(err)
	}
	if err := key.UnmarshalBinary(b); err != nil {
		log.Fatal(err)
	}

	local, err := c.RegisterRegion(int(key.Size), 0)
	if err != nil {
		log.Fatal(err)
	}
	defer local.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Remote(key).ReadAtContext(ctx, local, 0, local.Len(), 0); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", local.Bytes()[:16])
}
