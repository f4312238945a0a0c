package rdma

import (
	"errors"
	"io"
	"net"
)

// The zero-copy paths io.Copy takes: ReadFrom reads from a Reader straight
// into the registered send ring, WriteTo hands received messages to a
// Writer straight from the registered receive ring. Both go through the
// same credits, rings, deadlines and errors as Write and Read.

var (
	_ io.ReaderFrom = (*Conn)(nil)
	_ io.WriterTo   = (*Conn)(nil)
)

// errInvalidWrite is WriteTo's error for a Writer that reports an
// impossible count, as io.Copy's.
var errInvalidWrite = errors.New("invalid write result")

// ReadFrom implements io.ReaderFrom: it reads from r until io.EOF or an
// error, straight into the connection's registered send ring (one Read of
// r fills at most one message), and sends each Read's bytes as a message
// as soon as the peer has a receive free: io.Copy(conn, r) then copies each
// byte once. Unlike small Writes, Reads of r never gather: r.Read may
// block (a socket waiting for the next request) and what it returned must
// not wait behind it. To a message-oriented peer each Read of r is one
// message. While r.Read runs, a
// Close of the connection waits for it to return (the ring it fills is
// registered memory that Close releases). The error of r, if any, is
// returned wrapped like the connection's own.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if !c.ok() {
		return 0, errInvalid("readfrom")
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	n, err := c.readFrom(r)
	return n, c.opErr("readfrom", err)
}

func (c *Conn) readFrom(r io.Reader) (int64, error) {
	var total int64
	waited := false
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if err := c.life.writeEnded(); err != nil {
			return total, err
		}
		if c.wdl.expired() {
			return total, errTimeout
		}
		// r.Read may block for as long as its source likes (a socket
		// waiting for the next request), and while it fills the ring's
		// tail nothing else may send from there. So pending bytes go
		// first, whatever hold would say, and without a credit for them
		// the loop waits for one rather than block in r.Read on top of
		// them.
		if c.tx.pendLen > 0 && c.cr.credits > 0 && c.tx.free() > 0 {
			c.queuePending()
			c.flushDroppingLock()
			continue
		}
		// Each Read of r may fill a whole message: the ring has room for
		// one whenever the peer has consumed everything, so waiting for
		// that room never waits for nothing.
		noRoom := c.tx.ring.room() < c.maxMsg
		if c.tx.free() == 0 || c.tx.pendLen > 0 || noRoom {
			c.waitSendRoomDroppingLock(noRoom || (c.tx.pendLen > 0 && c.cr.credits == 0), &waited)
			continue
		}
		start := c.tx.pendOff()
		c.tx.filling = true
		c.mu.Unlock()
		n, rerr := r.Read(c.mem[start : start+c.maxMsg])
		c.mu.Lock()
		c.tx.filling = false
		if err := c.life.writeEnded(); err != nil {
			return total, err
		}
		if n > 0 {
			total += int64(n)
			c.st.BytesWritten += uint64(n)
			c.tx.pendLen, c.tx.pendMore = n, false
			if c.cr.credits > 0 && c.tx.free() > 0 {
				c.queuePending()
			}
		}
		c.flushDroppingLock()
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// WriteTo implements io.WriterTo: it writes what arrives to w until the
// peer closes (then it returns a nil error, as io.Copy expects) or an error,
// calling w.Write with each message straight from the registered receive
// ring it arrived in, and giving its ring bytes back to the peer once
// w.Write returns: io.Copy(w, conn) then copies each byte once. w must not keep
// the slice. While w.Write runs, a Close of the connection waits for it
// to return. An error of w is returned wrapped like the connection's own.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	if !c.ok() {
		return 0, errInvalid("writeto")
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	n, err := c.writeTo(w)
	return n, c.opErr("writeto", err)
}

func (c *Conn) writeTo(w io.Writer) (int64, error) {
	var total int64
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.life.has(shutClosed) {
			return total, net.ErrClosed
		}
		if c.readDeadlinePassedDroppingLock() {
			return total, errTimeout
		}
		if c.life.has(shutRead) {
			return total, nil
		}
		if c.rx.n > 0 {
			if c.rx.finAtHead() {
				return total, nil
			}
			// The head message is the reader's while readMu is held (see
			// Read): hand it to w without the lock.
			b := c.rx.payload(c.mem, c.rx.q[c.rx.head], c.rx.off)
			c.mu.Unlock()
			n, werr := w.Write(b)
			c.mu.Lock()
			if n < 0 || n > len(b) {
				n = 0
				if werr == nil {
					werr = errInvalidWrite
				}
			}
			total += int64(n)
			c.st.BytesRead += uint64(n)
			if n == len(b) {
				c.rx.consume(1, 0)
				c.returnCredits(c.rx.halfUnreported())
				c.flushDroppingLock()
			} else {
				c.rx.off += n
				if werr == nil {
					werr = io.ErrShortWrite
				}
			}
			if werr != nil {
				return total, werr
			}
			continue
		}
		if err := c.waitDataDroppingLock(); err != nil {
			return total, err
		}
	}
}
